"""The model's side of data parallelism: the DDP wrapper and its gradient accumulation, BatchNorm over
the global batch (SyncBatchNorm on GPUs, GlobalBatchNorm on the CPU), ZeRO's sharded optimizer, and
FSDP2's sharding of the model (--fsdp).

Without a process group every helper leaves the model and optimizer as they are.
"""
import contextlib
import functools
import inspect
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from utils import distributed
from utils.distributed import is_dist, is_main, world_size


def convert_sync_batchnorm(module, device=None):
    """`module` with its BatchNorm layers normalising with the global batch's statistics when distributed
    over several processes: torch.nn.SyncBatchNorm on GPUs, GlobalBatchNorm on the CPU (where PyTorch has
    none); unchanged otherwise. Parameter and buffer names stay the same."""
    if world_size() == 1:
        return module
    if device is not None and torch.device(device).type == "cpu":
        return GlobalBatchNorm.convert(module)
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)


class _SummedOverRanks(torch.autograd.Function):
    """The sum of a tensor over every rank, differentiable: the gradient is summed over the ranks too."""

    @staticmethod
    def forward(ctx, tensor):
        total = tensor.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        dist.all_reduce(total)
        return total


class GlobalBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are those of every rank's batch together, for the CPU (gloo),
    where torch.nn.SyncBatchNorm does not run: the per-channel sums, then the centred squares, are
    all-reduced, differentiably (_SummedOverRanks), so backward sums each rank's share
    of the statistics' gradient as SyncBatchNorm's does. Evaluation, one process, and `local` (set by
    local_batch_norm) are plain BatchNorm. The same parameters, buffers and state_dict keys."""

    local = False
    contributes = True

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input (batch, channels, ...), got {input.dim()}-D")

    @classmethod
    def convert(cls, module):
        """`module` with every plain BatchNorm layer replaced by a GlobalBatchNorm holding its tensors."""
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats)
            converted.load_state_dict(module.state_dict())
            converted.train(module.training)
            return converted
        for name, child in module.named_children():
            module.add_module(name, cls.convert(child))
        return module

    def forward(self, x):
        if not self.training or self.local or not is_dist() or world_size() == 1:
            return super().forward(x)
        return _global_batch_norm(self, x, self.contributes)


def _global_batch_norm(layer, x, contributes=True):
    """BatchNorm `layer` in training on the statistics of every rank's `x` together (each channel's sums, then
    its centred squares, all-reduced differentiably); a rank that `contributes` nothing (its stand-in pass) adds
    zeros, joins the collectives and updates its running statistics as every other rank does. Under autocast
    the statistics and the normalisation are float32, as SyncBatchNorm's kernels keep them (a bfloat16 mean
    would lose precision, and the float32 running statistics take no other dtype); the output has the input's dtype."""
    all_reduce = _SummedOverRanks.apply
    weight = 1.0 if contributes else 0.0
    dims = [d for d in range(x.dim()) if d != 1]
    shape = [1, -1] + [1] * (x.dim() - 2)
    dtype, x = x.dtype, x.float()  # a float32 input stays the very tensor
    # the count filled on the device (a tensor from Python data would be a blocking host-to-device copy)
    sums = all_reduce(torch.cat([x.sum(dims), x.new_full((1,), x.numel() / x.shape[1])]) * weight)
    count = sums[-1]
    mean = sums[:-1] / count
    centred = x - mean.view(shape)
    var = all_reduce(centred.square().sum(dims) * weight) / count  # biased, as BatchNorm normalises with
    out = centred * torch.rsqrt(var + layer.eps).view(shape)
    if layer.affine:
        out = out * layer.weight.view(shape) + layer.bias.view(shape)
    if layer.track_running_stats:
        with torch.no_grad():
            layer.num_batches_tracked.add_(1)
            momentum = 1.0 / float(layer.num_batches_tracked) if layer.momentum is None else layer.momentum
            layer.running_mean.lerp_(mean.detach(), momentum)
            layer.running_var.lerp_(var.detach() * (count / (count - 1)).clamp_min(0), momentum)
    return out.to(dtype)


# PyTorch 2.13 renamed broadcast_buffers (deprecated, and False also skipped the sync at construction)
# to forward_sync_buffers, which always syncs at construction; older versions know only the first.
_SYNC_BUFFERS = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                 else "broadcast_buffers")


def has_running_statistics(module):
    """Whether training changes some buffer of `module`: BatchNorm's (and SyncBatchNorm's) running
    statistics. Other buffers (positional tables, masks) are fixed functions of the configuration."""
    return any(getattr(m, "track_running_stats", False) and getattr(m, "running_mean", None) is not None
               for m in module.modules())


def wrap_ddp(module, device, sync_bn=False, find_unused=False):
    """(module to evaluate and save, module to train): `module` itself twice without a
    process group; else the (SyncBatchNorm-converted) module and its DDP wrapper (with `find_unused`:
    DDP's find_unused_parameters, for a model some of whose parameters take no part in training).

    DDP broadcasts rank 0's parameters and buffers at construction, so every rank starts equal;
    before every forward it broadcasts the buffers again only where training changes them (a
    Transformer's positional tables would cost ~10 MiB a step for nothing).
    """
    if not is_dist():
        return module, module
    if sync_bn:
        module = convert_sync_batchnorm(module, device)
    device_ids = [device.index] if device.type == "cuda" else None
    return module, DistributedDataParallel(module, device_ids=device_ids, find_unused_parameters=find_unused,
                                           **{_SYNC_BUFFERS: has_running_statistics(module)})



def repeated_blocks(module):
    """The blocks FSDP2 shards one by one: every child of an nn.ModuleList (a model's repeated layers), the
    outermost lists only, those holding parameters."""
    if isinstance(module, torch.nn.ModuleList):
        return [child for child in module if any(True for _ in child.parameters())]
    return [block for child in module.children() for block in repeated_blocks(child)]


def wrap_fsdp(module, accumulates=False, param_dtype=None):
    """`module` with its parameters, gradients and Adam state sharded between the ranks by FSDP2, in place
    (fully_shard on each repeated block, then on the whole); without a process group, `module` as it is.
    Parameter and buffer names stay the plain module's. Every forward then gathers each block's weights from
    all ranks (a collective): evaluation runs the same number of forwards on every rank (Exp_Basic.paired); best
    weights go through full_state_dict, loads through load_on_main, training states through save_shards. When a
    step `accumulates` micro-batches, the gathered weights stay for the whole step (no_sync): ranks of a short last
    step may run different numbers of forward passes, which must not each gather. With `param_dtype`
    (bfloat16) the gathered weights and the computation take it, the shards (the master weights), Adam and the
    reduction stay float32."""
    if not is_dist():
        return module
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # only when asked for

    # a forecast sliced from the model's output is a view; the loss reads it out of place (the hook FSDP2 warns
    # could be lost stays: tests/test_fsdp.py's weights would differ), so the warning on every step is noise
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    options = {"reshard_after_forward": not accumulates}
    if param_dtype is not None:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in repeated_blocks(module):
        fully_shard(block, **options)
    fully_shard(module, **options)
    return module


def _is_dtensor(tensor):
    return type(tensor).__name__ == "DTensor" or hasattr(tensor, "device_mesh")


def is_sharded(module):
    """Whether `module` is sharded by FSDP2 (wrap_fsdp): its forward is then a collective."""
    return type(module).__module__.startswith("torch.distributed.fsdp")


def plain_class(module):
    """The class `module` was built as: FSDP2 gives a sharded module a class of its own deriving from it."""
    cls = type(module)
    while cls.__module__.startswith("torch.distributed.fsdp"):
        cls = cls.__bases__[-1]
    return cls


def _reshard(module):
    """Every FSDP2 block of `module` back to its shards (FSDP2 keeps the root's weights gathered after a forward
    without backward): a local operation, so that state dicts hold the shards."""
    for block in module.modules():
        if is_sharded(block):
            block.reshard()


def full_state_dict(module):
    """`module`'s state dict, whole, on rank 0 (on the CPU when `module` is sharded, gathered one tensor at a time;
    on every rank otherwise). A collective for a sharded module: call it on every rank; others get {}."""
    if not is_sharded(module):
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    _reshard(module)
    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class LoadTarget:
    """What a load function (utils.checkpoint.load_weights and the loads above it) sees of a sharded module on
    rank 0: its names, global shapes and dtypes (on the meta device) and its attributes; load_state_dict keeps
    the state for load_sharded to scatter, unloaded. A plain module needs none: it is loaded in place."""

    def __init__(self, module):
        _reshard(module)
        self.module, self.loaded = module, None
        self.plain_class = plain_class(module)
        self._expected = {name: torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
                          for name, tensor in module.state_dict().items()}

    def __getattr__(self, name):  # checkpoint_adapters, series_as_given, ... : the module's
        return getattr(self.module, name)

    def state_dict(self):
        return dict(self._expected)

    def load_state_dict(self, state, strict=True):
        if strict and set(state) != set(self._expected):
            raise RuntimeError(f"state dict keys differ from {self.plain_class.__name__}'s")
        self.loaded = state


def save_shards(model, optimizer, folder):
    """The sharded `model`'s weights and its optimizer's state into `folder` through torch.distributed.checkpoint,
    each rank writing its own shards (nothing gathered; names as the plain module's, the optimizer's state keyed
    by them). A collective."""
    from torch.distributed.checkpoint import save
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _reshard(model)
    weights, state = get_state_dict(model, optimizer)
    save({"model": weights, "optimizer": state}, checkpoint_id=folder)


def load_shards(model, optimizer, folder):
    """save_shards' `folder` into the sharded `model` and its optimizer, on any number of processes: each rank
    reads the parts of the saved shards its own shards hold. A collective."""
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    _reshard(model)
    weights, state = get_state_dict(model, optimizer)  # the layout to fill (Adam's state made, at step 0)
    saved = {"model": weights, "optimizer": state}
    load(saved, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=saved["model"], optim_state_dict=saved["optimizer"])


def read_shards(folder):
    """save_shards' `folder` whole, in this process alone: {"model": state dict, "optimizer": the state in a plain
    optimizer's format (parameters numbered in the order they were saved)}."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    saved = {}  # the planner fills it with every saved tensor, whole: torch's own dcp_to_torch_save reads so
    _load_state_dict(saved, storage_reader=FileSystemReader(folder), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    names = [name for group in saved["optimizer"]["param_groups"] for name in group["params"]]
    number = {name: i for i, name in enumerate(names)}
    groups = [{**group, "params": [number[name] for name in group["params"]]}
              for group in saved["optimizer"]["param_groups"]]
    state = {number[name]: value for name, value in saved["optimizer"]["state"].items()}
    return {"model": saved["model"], "optimizer": {"state": state, "param_groups": groups}}


def load_on_main(module, load, *args, **kwargs):
    """utils.distributed.load_on_main (load(module, ...) on rank 0, its weights on every rank), for a module FSDP2
    shards too: rank 0 reads the file whole into a LoadTarget, and every rank keeps its shard (load_sharded)."""
    if not is_sharded(module):
        return distributed.load_on_main(module, load, *args, **kwargs)
    target = LoadTarget(module) if is_main() else None

    def load_on_this_rank():
        load(target, *args, **kwargs)  # returns None: raise_on_every_rank's "no problem"

    distributed.raise_on_every_rank(load_on_this_rank, on="main")
    load_sharded(module, target.loaded if target is not None else None)
    return module


def load_sharded(module, state):
    """`state` (a full state dict on rank 0, ignored elsewhere) into the sharded `module`: rank 0 broadcasts
    each tensor and every rank keeps its shard. A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    _reshard(module)
    with torch.no_grad():
        set_model_state_dict(module, state if is_main() else {},
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True))


def ddp_module(model):
    """The DistributedDataParallel in `model` (itself, or under torch.compile), or None."""
    while model is not None and not isinstance(model, DistributedDataParallel):
        model = getattr(model, "_orig_mod", None)
    return model


def no_sync(model, skip=True):
    """With `skip`, DDP's no_sync(): forward + backward only accumulate local gradients and
    the all-reduce waits for a backward outside it; under FSDP2 the same with the reduce-scatter, the
    weights staying gathered. A no-op without DDP or FSDP2, or with skip=False."""
    ddp = ddp_module(model) if skip else None
    if ddp is not None:
        return ddp.no_sync()
    if skip and hasattr(model, "set_requires_gradient_sync"):  # an FSDPModule
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    model.set_reshard_after_backward(False)
    try:
        yield model
    finally:
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)


@contextlib.contextmanager
def local_batch_norm(model, local=True):
    """With `local`, `model`'s SyncBatchNorm layers normalise with this rank's own batch statistics inside
    the block (plain BatchNorm's forward): no all_gather in forward. For a training step in which ranks
    run different numbers of forward passes (the short last global batch of an epoch), where
    SyncBatchNorm's gathers would not pair up across ranks. A no-op without SyncBatchNorm."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.SyncBatchNorm)] if local else []
    global_layers = [m for m in model.modules() if isinstance(m, GlobalBatchNorm)] if local else []
    for layer in layers:
        layer.forward = torch.nn.modules.batchnorm._BatchNorm.forward.__get__(layer)
    for layer in global_layers:
        layer.local = True
    try:
        yield model
    finally:
        for layer in layers:
            del layer.forward
        for layer in global_layers:
            del layer.local


def batch_norm_for_step(model, uneven, stand_in_somewhere):
    """How a training step's global BatchNorm layers normalise: each rank on its own batch when ranks run
    different numbers of forward passes (local_batch_norm); all-reduced, a stand-in rank adding nothing, when
    some rank has no window (batch_norm_beside_stand_in); else as they are."""
    if uneven:
        return local_batch_norm(model)
    return batch_norm_beside_stand_in(model, stand_in_somewhere)


@contextlib.contextmanager
def batch_norm_beside_stand_in(model, stand_in_somewhere=True):
    """Inside the block, `model`'s SyncBatchNorm layers normalise as GlobalBatchNorm does (all-reduced sums) on
    every rank, for a step in which some rank has no window and runs a stand-in pass (stand_in_batch_norm): its
    collectives then pair with theirs. A no-op without SyncBatchNorm or without a stand-in."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.SyncBatchNorm)] if stand_in_somewhere else []
    for layer in layers:
        layer.forward = functools.partial(_global_batch_norm, layer)
    try:
        yield model
    finally:
        for layer in layers:
            del layer.forward


@contextlib.contextmanager
def stand_in_batch_norm(model):
    """For a stand-in pass (a rank without a window in a short last step, its model in eval mode): its global
    BatchNorm layers train as the other ranks' do, joining their collectives but adding nothing, so every rank
    ends the step with the running statistics of exactly the step's windows, as one process has."""
    # not in a step whose layers normalise locally (local_batch_norm): there a stand-in must not train them
    layers = [m for m in model.modules() if (isinstance(m, GlobalBatchNorm) and not m.local) or (
        isinstance(m, torch.nn.SyncBatchNorm) and getattr(m.__dict__.get("forward"), "func", None) is _global_batch_norm)]
    for layer in layers:
        layer.train(True)
        if isinstance(layer, GlobalBatchNorm):
            layer.contributes = False
        else:
            layer.forward = functools.partial(_global_batch_norm, layer, contributes=False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.train(False)
            if isinstance(layer, GlobalBatchNorm):
                del layer.contributes
            else:
                layer.forward = functools.partial(_global_batch_norm, layer)


def make_optimizer(params, optimizer_class, shard=False, **options):
    """optimizer_class(params, **options); with `shard` and a process group, wrapped in
    ZeroRedundancyOptimizer: each rank keeps the state of its share of the parameters only."""
    if shard and is_dist():
        from torch.distributed.optim import ZeroRedundancyOptimizer  # a 1 s import: only when asked for

        zero = _scaled_zero(ZeroRedundancyOptimizer)(params, optimizer_class=optimizer_class, **options)
        # the local optimizer's fused kernel takes the GradScaler's scale and found_inf as device tensors
        zero._step_supports_amp_scaling = getattr(zero.optim, "_step_supports_amp_scaling", False)
        return zero
    return optimizer_class(params, **options)


def _scaled_zero(zero_class):
    """ZeroRedundancyOptimizer handing a GradScaler's on-device scale and found_inf to its local (fused)
    optimizer, as a fused Adam takes them (GradScaler.step sets them on the optimizer it is given, the
    wrapper): an overflowing step is then skipped inside the kernel, where a plain ZeRO made the scaler read
    found_inf back to the host every step (GradScaler._maybe_opt_step's .item())."""

    class ZeroRedundancyOptimizer(zero_class):  # torch's, named as torch's (what logs and tests see)
        def step(self, closure=None, **kwargs):
            given = [name for name in ("grad_scale", "found_inf") if hasattr(self, name)]
            for name in given:
                setattr(self.optim, name, getattr(self, name))
            try:
                return super().step(closure, **kwargs)
            finally:
                for name in given:
                    delattr(self.optim, name)

        def load_state_dict(self, state_dict):
            super().load_state_dict(state_dict)
            if self.optim.defaults.get("fused"):  # ZeRO's load puts 0-dim state (Adam's step) on the CPU; the
                # fused kernel takes it beside its parameter, where a fused Adam's own load keeps it
                for param, state in self.optim.state.items():
                    for name, value in state.items():
                        if torch.is_tensor(value) and value.dim() == 0 and value.device != param.device:
                            state[name] = value.to(param.device)

    return ZeroRedundancyOptimizer


def _is_sharded(optimizer):
    return hasattr(optimizer, "consolidate_state_dict")  # ZeroRedundancyOptimizer, not imported eagerly


def _fsdp_sharded(optimizer):
    """Whether `optimizer` steps FSDP2's sharded parameters (Exp_Basic.make_optimizer under --fsdp)."""
    return any(_is_dtensor(p) for group in optimizer.param_groups for p in group["params"])


def optimizer_state_dict(optimizer):
    """The full optimizer state on rank 0 (None elsewhere), in a plain optimizer's format, --zero's shards
    gathered first (a collective: call it on every rank)."""
    if _is_sharded(optimizer):
        optimizer.consolidate_state_dict(to=0)
    return optimizer.state_dict() if is_main() else None  # FSDP2's is saved in shards (save_shards)


def load_optimizer_state(optimizer, state):
    """Load a full optimizer state into a plain or a sharded optimizer, whichever saved it.

    The saved kernel choice (fused / foreach) is replaced by this optimizer's own, so a
    state written with --zero loads without it and vice versa.
    """
    for saved, current in zip(state["param_groups"], optimizer.param_groups):
        for key in ("fused", "foreach"):
            if key in current:
                saved[key] = current[key]
    if _fsdp_sharded(optimizer):
        # each full state tensor to this rank's shard of it, placed as its parameter is (the module's weights
        # were loaded just before: checkpoint.load_training_state)
        from torch.distributed.tensor import distribute_tensor

        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = {**state, "state": {index: {
            name: distribute_tensor(value.to(params[index].device), params[index].device_mesh, params[index].placements)
            if torch.is_tensor(value) and _is_dtensor(params[index]) and value.shape == params[index].shape
            else value for name, value in per_param.items()} for index, per_param in state["state"].items()}}
    optimizer.load_state_dict(state)
    if _is_sharded(optimizer):
        # Its load also copies this rank's shard into the wrapper's own `state`, which
        # nothing reads (the local optimizer holds the live copy): drop the duplicate.
        optimizer.state.clear()


def optimizer_state_bytes(optimizer):
    """Bytes of optimizer state tensors held by this rank (only its shard when sharded)."""
    states = [optimizer.state] + ([optimizer.optim.state] if _is_sharded(optimizer) else [])
    return sum(_local(value).numel() * value.element_size() for state in states for per_param in state.values()
               if per_param for value in per_param.values() if torch.is_tensor(value))


def _local(tensor):
    """This rank's part of a tensor: a DTensor's shard, else the tensor."""
    return tensor.to_local() if _is_dtensor(tensor) else tensor
