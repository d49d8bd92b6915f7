"""Activation checkpointing (--activation_checkpointing): each repeated block of a model keeps only its input for
backward and runs its forward again there (torch.utils.checkpoint, non-reentrant), so a training step holds one
block's activations at a time rather than every block's, for about one more forward of the blocks.

The blocks are utils.ddp.repeated_blocks(model), the ones FSDP2 shards one by one: every child of the outermost
nn.ModuleLists that hold parameters (a model's layers). `checkpoint_blocks` is applied to the plain module before
any wrapper (DDP's, or FSDP2's fully_shard, whose hooks then gather a block's weights around the checkpointed
forward and again before its backward, where the recompute reads them), as torchtitan applies its checkpoint
wrapper before fully_shard. Only each block's `forward` is replaced, on the instance: the module's classes,
parameter names and state_dict stay as they were, so checkpoints read and write as without it.

It changes no number. The recompute must draw what the forward drew, and three things decide that:
- the global generators (unkeyed dropout: evaluation aside, a model that does not key its masks): checkpoint's
  preserve_rng_state restores their state at the block's entry;
- autocast: checkpoint re-enters the forward's autocast state;
- the keyed draws (layers.dropout's masks inside masks_follow_samples, layers.noise's draws, keyed attention
  dropout): they are keyed by the micro-batch's SampleKeys (or the evaluation batch's window keys) and by a
  call number that each draw advances. Backward runs outside the experiment's masks_follow_samples, so the
  recompute would draw from the global generator, or, if another micro-batch's context were open, from its keys.
  `_Draws` takes a copy of both states at the block's entry in the forward (its call count included) and
  installs a fresh copy of it around the recompute, so the recompute numbers its draws from where the forward
  did; the forward's own count goes on untouched. Keyed attention keeps what it needs for its backward itself
  (the call's key), so it needs nothing more.
"""
import contextlib
import copy
import functools

import torch
from torch.utils.checkpoint import checkpoint

from layers import dropout, noise
from utils.ddp import repeated_blocks
from utils.errors import require


def _draw_state():
    """Copies of the keyed-draw state now (dropout's SampleKeys and noise's window keys, each with its call count,
    or None): what a block's forward numbers its draws from."""
    return copy.copy(dropout._keys), copy.copy(noise._window_keys)


class _Draws:
    """One checkpointed call's keyed-draw state: taken as its forward starts, re-entered around its recompute."""

    def __init__(self):
        self.state = (None, None)

    @contextlib.contextmanager
    def forward(self):
        self.state = _draw_state()
        yield

    @contextlib.contextmanager
    def recompute(self):
        previous = dropout._keys, noise._window_keys
        # a fresh copy each time: a second recompute (retain_graph) starts from the same count again
        dropout._keys, noise._window_keys = (copy.copy(state) for state in self.state)
        try:
            yield
        finally:
            dropout._keys, noise._window_keys = previous


def _checkpointed_forward(block, *args, **kwargs):
    """The block's own forward (its class's: under FSDP2 the class fully_shard made of it), checkpointed wherever
    autograd records (training); as it is elsewhere (evaluation under no_grad)."""
    forward = functools.partial(type(block).forward, block)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    draws = _Draws()
    return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True,
                      context_fn=lambda: (draws.forward(), draws.recompute()), **kwargs)


def checkpoint_blocks(model, name):
    """Checkpoint each repeated block's forward of `model`, in place (module docstring); a model without repeated
    blocks is refused in one line naming it (`name`, its --model)."""
    blocks = repeated_blocks(model)
    require(blocks, f"--activation_checkpointing recomputes each repeated block of a model in backward (the layers an "
                    f"nn.ModuleList holds), and model {name} has none: drop --activation_checkpointing")
    for block in blocks:
        if "forward" not in vars(block):  # an instance attribute, bound to the block: a deepcopy rebinds it
            block.forward = functools.partial(_checkpointed_forward, block)


def checkpointed(block) -> bool:
    """Whether checkpoint_blocks checkpointed `block`."""
    forward = vars(block).get("forward")
    return isinstance(forward, functools.partial) and forward.func is _checkpointed_forward
