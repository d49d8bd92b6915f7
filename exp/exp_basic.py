"""Exp_Basic: the model on its device (plain and DDP-wrapped), mixed precision, the optimizer."""
import contextlib
import logging

import torch

from exp.forward import training_loss
from exp.settings import build_model
from layers.dropout import DropoutReport, KeyedDropout
from utils import distributed
from utils.metrics import batch_loss
from utils.probabilistic import objective_for
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


def parameters_without_gradient(model, loss_of, device):
    """Names of `model`'s trainable parameters that one backward of loss_of(model) leaves without a gradient.
    The model is as it was afterwards: its buffers (BatchNorm's statistics), gradients and random streams."""
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        loss_of(model).backward()
    missing = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    return missing


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
        # every nn.Dropout keyed by the sample (layers.dropout); metrics.json records which were exact
        args.dropout_keyed = {}
        report = DropoutReport(args.dropout_keyed, warn=lambda line: distributed.is_main() and logger.warning(line))
        keyed = KeyedDropout.convert(built[0], report)
        self.raw_model, model = distributed.wrap_ddp(keyed.to(device), device, args.sync_bn)
        self.model = torch.compile(model) if args.compile else model  # what training steps run
        # masks keyed by the sample inside training steps, unless the model says they cannot be
        self.masks_follow_samples = getattr(self.raw_model, "randomness_follows_sample", True) and not args.compile
        self._amp_dtype = AMP_DTYPES[args.amp_dtype] if args.use_amp else None
        # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
        self.grad_scaler = torch.amp.GradScaler(device.type, enabled=self._amp_dtype == torch.float16)
        self.last_grad_norm = None  # of the last optimizer step, with --clip_grad
        self.objective = objective_for(args)  # a probabilistic --loss (utils.probabilistic), or None

    def allow_unused_parameters(self, dataset):
        """Under DDP: if one training forward of the first windows of `dataset` leaves parameters without a
        gradient (TSLib's files often build layers a configuration never reads: FEDformer's attention
        projections, MSGNet's predict_linear), wrap the model again with DDP's find_unused_parameters, which
        then searches the graph every step, and say so once. Plain DDP would stop at the second step."""
        if not distributed.is_dist() or len(dataset) == 0:
            return []
        first = torch.arange(min(2, len(dataset)), device=getattr(dataset, "device", None))  # BatchNorm needs 2
        batch = dataset.__getitems__(first)

        def loss_of(model):
            with distributed.local_batch_norm(model), self.autocast():  # no collective inside the probe
                return training_loss(model, batch, self.args, self.device, self.loss)[0]
        was_training = self.raw_model.training
        self.raw_model.train()
        unused = parameters_without_gradient(self.raw_model, loss_of, self.device)
        self.raw_model.train(was_training)
        if not distributed.any_rank(bool(unused)):
            return []
        if distributed.is_main():
            shown = ", ".join(unused[:4]) + (f" and {len(unused) - 4} more" if len(unused) > 4 else "")
            logger.warning(f"model {self.args.model}: {len(unused)} parameters get no gradient in training ({shown}); "
                           "DDP searches for unused parameters every step (find_unused_parameters), which costs "
                           "time: build only the layers this configuration uses")
        self.model = None  # the old wrapper's gradient hooks go with it
        self.model = distributed.wrap_ddp(self.raw_model, self.device, find_unused=True)[1]
        if self.args.compile:
            self.model = torch.compile(self.model)
        return unused

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
        each rank keeps the state of its share of the parameters only (utils.distributed.make_optimizer)."""
        args = self.args
        sharded = args.zero and distributed.is_dist()
        return distributed.make_optimizer(self.model.parameters(), torch.optim.Adam, shard=sharded,
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
            # same full gradients, so every rank computes the same norm and clips alike
            self.grad_scaler.unscale_(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.args.clip_grad)
        self.grad_scaler.step(optimizer)
        self.grad_scaler.update()
        return norm
