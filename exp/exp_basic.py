"""Exp_Basic: the model on its device (plain, and DDP-wrapped or FSDP2-sharded), mixed precision, the optimizer."""
import contextlib
import logging

import numpy as np
import torch

from exp.adaptation import forecast_series_as_given, load_pretrained
from exp.forward import forward, training_loss
from exp.lora import apply_lora
from exp.settings import build_model
from layers.checkpointing import checkpoint_blocks
from layers.dropout import DropoutReport, KeyedDropout
from utils import ddp, distributed
from utils.metrics import batch_loss
from utils.tools import seed_everything, set_precision

logger = logging.getLogger("tsl")

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def unshare_gradients(model):
    """Give every parameter a .grad of its own.

    torch.compile's backward can hand two parameters one gradient tensor (DLinear's two biases, whose
    sum is all the forward uses), and autograd stores it as both .grad; the next micro-batch's in-place
    accumulation then adds its gradient twice to that one tensor (seen on torch 2.11 CUDA and 2.13 CPU).
    """
    seen = set()
    for parameter in model.parameters():
        grad = parameter.grad
        if grad is None:
            continue
        if grad.data_ptr() in seen:
            parameter.grad = grad.clone()
        else:
            seen.add(grad.data_ptr())


def probe_training_step(model, loss_of, device):
    """One backward of loss_of(model), undone: (names of `model`'s trainable parameters it leaves without a
    gradient, names of the buffers its forward changed). The model is as it was afterwards: its buffers
    (BatchNorm's statistics), gradients and random streams."""
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        loss_of(model).backward()
    missing = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    changed = [name for name, b in model.named_buffers() if not torch.equal(b, buffers[name])]
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    return missing, changed


def parameters_without_gradient(model, loss_of, device):
    """Names of `model`'s trainable parameters that one backward of loss_of(model) leaves without a gradient
    (probe_training_step's first half)."""
    return probe_training_step(model, loss_of, device)[0]


def unsynchronised_buffers(model, changed, accumulation_steps):
    """The names in `changed` (buffers a training forward updates) that a step does not compute from its whole
    global batch: all of them but the running statistics of BatchNorm layers that normalise with the global
    batch (--sync_bn's SyncBatchNorm / GlobalBatchNorm), and those too when a rank accumulates micro-batches."""
    synchronised = set()
    if accumulation_steps == 1:
        for prefix, module in model.named_modules():
            if isinstance(module, (torch.nn.SyncBatchNorm, ddp.GlobalBatchNorm)):
                synchronised.update(f"{prefix}.{name}" if prefix else name for name, _ in module.named_buffers())
    return [name for name in changed if name not in synchronised]


def _shown(names):
    """The first four names, and how many more."""
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


class Exp_Basic:
    def __init__(self, args, device):
        """`args` from exp.settings.resolve_args, `device` from utils.distributed.setup."""
        self.args, self.device = args, device
        set_precision(args.tf32, args.deterministic)
        seed_everything(args.seed)
        # raw_model: the plain module that is evaluated, saved and loaded; never a DDP or
        # torch.compile wrapper, so checkpoints carry no `module.` / `_orig_mod.` prefixes.
        built = []  # a model that cannot be built stops every rank together, rank 0 saying why
        distributed.raise_on_every_rank(lambda: built.append(build_model(args)), on="all")
        if args.lora_rank:  # adapters on the pre-trained weights (which they rename), before dropout is keyed
            if args.adaptation:
                load_pretrained(built[0], args.pretrain_model_path, torch.device("cpu"))
            distributed.raise_on_every_rank(lambda: built.append(apply_lora(built.pop(), args)), on="all")
        # every nn.Dropout keyed by the sample (layers.dropout); metrics.json records which were exact
        self.dropout_keyed = {}
        report = DropoutReport(self.dropout_keyed, warn=lambda line: distributed.is_main() and logger.warning(line))
        keyed = KeyedDropout.convert(built[0], report)
        if args.activation_checkpointing:  # before any wrapper, as FSDP2 expects (layers.checkpointing)
            distributed.raise_on_every_rank(lambda: checkpoint_blocks(keyed, args.model), on="all")
        if args.fsdp:  # FSDP2 shards the finished module in place: it is trained, evaluated and saved as it is
            self.raw_model = ddp.convert_sync_batchnorm(keyed.to(device), device) if args.sync_bn else keyed.to(device)
            forecast_series_as_given(self.raw_model, args, device)
            model = ddp.wrap_fsdp(self.raw_model, args.accumulation_steps > 1, AMP_DTYPES.get(args.fsdp_mixed_precision))
        else:
            self.raw_model, model = ddp.wrap_ddp(keyed.to(device), device, args.sync_bn)
            forecast_series_as_given(self.raw_model, args, device)  # a release sees the series as the file holds it
        self.model = torch.compile(model) if args.compile else model  # what training steps run
        # masks keyed by the sample inside training steps, unless the model says they cannot be
        self.masks_follow_samples = getattr(self.raw_model, "randomness_follows_sample", True) and not args.compile
        self._amp_dtype = AMP_DTYPES[args.amp_dtype] if args.use_amp else None
        # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
        self.grad_scaler = torch.amp.GradScaler(device.type, enabled=self._amp_dtype == torch.float16)
        self.last_grad_norm = None  # of the last optimizer step, with --clip_grad
        self.objective = args.objective  # a probabilistic --loss (utils.probabilistic), or None

    def allow_unused_parameters(self, dataset):
        """Under DDP or --accumulation_steps: one training
        forward of the first windows of `dataset`, undone, finds
        - parameters left without a gradient (TSLib's files often build layers a configuration never reads:
          FEDformer's attention projections, MSGNet's predict_linear): under DDP the model is wrapped again with
          find_unused_parameters, which then searches the graph every step (plain DDP would stop at the
          second step), and rank 0 says so once;
        - buffers the forward updates that are not computed from the whole global batch (BatchNorm without
          --sync_bn, a model's own running mean): each micro-batch updates them alone, so training depends on
          the number of processes and micro-batches; rank 0 says so once.
        Returns the unused parameters' names."""
        if not (distributed.is_dist() or self.args.accumulation_steps > 1) or len(dataset) == 0:
            return []
        first = torch.arange(min(2, len(dataset)), device=getattr(dataset, "device", None))  # BatchNorm needs 2
        batch = dataset.__getitems__(first)

        def loss_of(model):
            with ddp.local_batch_norm(model), self.autocast():  # no collective inside the probe
                return training_loss(model, batch, self.args, self.device, self.loss)[0]
        was_training = self.raw_model.training
        self.raw_model.train()
        unused, changed = self._probe(loss_of)
        self.raw_model.train(was_training)
        if distributed.world_size() > 1 or self.args.accumulation_steps > 1:
            self._warn_unsynchronised(unsynchronised_buffers(self.raw_model, changed, self.args.accumulation_steps))
        if not distributed.is_dist() or not distributed.any_rank(bool(unused)) or self.args.fsdp:
            return []  # FSDP2 reduces the gradients a step has, with no search for the others
        if distributed.is_main():
            logger.warning(f"model {self.args.model}: {len(unused)} parameters get no gradient in training "
                           f"({_shown(unused)}); DDP searches for unused parameters every step "
                           "(find_unused_parameters), which costs time: build only the layers this configuration uses")
        self.model = None  # the old wrapper's gradient hooks go with it
        self.model = ddp.wrap_ddp(self.raw_model, self.device, find_unused=True)[1]
        if self.args.compile:
            self.model = torch.compile(self.model)
        return unused

    def _probe(self, loss_of):
        """probe_training_step of the raw model; under --fsdp, one line on every rank for a model that runs its
        repeated blocks through their parts instead of calling them (FSDP2 gathers a block's weights as it is
        called: its parts would meet shards)."""
        if not self.args.fsdp:
            return probe_training_step(self.raw_model, loss_of, self.device)
        found = []

        def probe():
            try:
                found.append(probe_training_step(self.raw_model, loss_of, self.device))
            except RuntimeError as exc:
                if "DTensor" not in str(exc):
                    raise
                return (f"--fsdp: model {self.args.model} runs its repeated blocks through their parts instead of "
                        "calling them, so FSDP2 cannot gather their weights first; fine-tune it without --fsdp "
                        "(DDP, --zero or --lora_rank)")
        distributed.raise_on_every_rank(probe, on="all")
        return found[0]

    def _warn_unsynchronised(self, names):
        """Rank 0's one line on buffers that training updates from each micro-batch alone (see
        allow_unused_parameters): what it costs and the way out."""
        if not names or not distributed.is_main():
            return
        args = self.args
        parts = [f"{distributed.world_size()} processes"] if distributed.world_size() > 1 else []
        if args.accumulation_steps > 1:
            parts.append(f"{args.accumulation_steps} accumulation steps")
        split = " x ".join(parts)
        batch_norm = any(name.endswith(("running_mean", "running_var", "num_batches_tracked")) for name in names)
        remedy = ("BatchNorm: add --sync_bn" + (" and drop --accumulation_steps" if args.accumulation_steps > 1 else "")
                  + "; other buffers: " if batch_norm else "")
        logger.warning(f"model {args.model}: training updates {len(names)} buffers from each micro-batch alone "
                       f"({_shown(names)}), not from the whole global batch, so with {split} the model trains "
                       f"differently than on one process without accumulation; {remedy}compute them from "
                       "parameters or keep them fixed for results that do not depend on the world size")

    def paired(self, loader, batches, stage, draws=None):
        """`batches` (the loader's, as the caller zips them) as they come. Under --fsdp every forward gathers each
        block's weights from all ranks (a collective): a rank with fewer batches than the rank with the most runs
        as many more forwards (the split's first window, unscored) once its own are done, so that no rank waits
        alone. The count is agreed before the first forward."""
        if not ddp.is_sharded(self.raw_model):
            yield from batches
            return
        extra = max(distributed.gather_objects(len(loader))) - len(loader)
        yield from batches
        dataset = loader.dataset
        first = dataset.__getitems__(torch.arange(1, device=getattr(dataset, "device", None))) if extra else None
        for _ in range(extra):
            with self.autocast(), draws(np.zeros(1, dtype=np.int64)) if draws else contextlib.nullcontext():
                forward(self.raw_model, first, self.args, stage, self.device)

    def loss(self, pred, true):
        """Mean training loss of a batch: --loss MSE / MAE, or the probabilistic objective's."""
        if self.objective is None:
            return batch_loss(pred.float(), true, self.args.loss)
        return self.objective.loss(pred.float(), true)

    def autocast(self):
        """Mixed-precision context for forward passes (a no-op without --use_amp)."""
        if self._amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._amp_dtype)

    def make_optimizer(self):
        """Adam with PyTorch's fused kernel (one kernel for all parameters, CPU and GPU; it takes fp16's
        loss-scale checks on the device, so the GradScaler never reads a value back); with --zero under DDP
        each rank keeps the state of its share of the parameters only (utils.ddp.make_optimizer)."""
        args = self.args
        sharded = args.zero and distributed.is_dist()
        return ddp.make_optimizer(self.model.parameters(), torch.optim.Adam, shard=sharded,
                                  lr=args.scaled_learning_rate, weight_decay=args.weight_decay, fused=True)

    def backward(self, loss):
        """Backward of a (possibly fp16-scaled) loss; gradients add up until optimizer_step."""
        self.grad_scaler.scale(loss).backward()
        if self.args.compile:
            unshare_gradients(self.raw_model)

    def optimizer_step(self, optimizer):
        """One step of the added-up gradients; returns their global norm (a tensor: no host sync),
        clipped to --clip_grad first when it is set (after fp16's unscaling), else None."""
        norm = None
        if self.args.clip_grad:
            # DDP's all-reduce (and ZeRO, which shards only the optimizer state) leaves every rank the
            # same full gradients, so every rank computes the same norm and clips alike; under --fsdp the
            # norm of the sharded gradients is all-reduced (a replicated DTensor: its local value)
            self.grad_scaler.unscale_(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.args.clip_grad)
            norm = norm.to_local() if hasattr(norm, "to_local") else norm
        self.grad_scaler.step(optimizer)
        self.grad_scaler.update()
        return norm
