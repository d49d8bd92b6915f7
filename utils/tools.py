"""Training-loop helpers: learning-rate schedules, early stopping, seeding, eval mode, precision, and the
allocator setting that keeps freed memory for reuse."""
import contextlib
import ctypes
import math
import os
import platform
import random
import sys

import numpy as np
import torch

from utils.errors import UserError, require

LR_SCHEDULES = ("type1", "type2", "cosine", "constant", "TST")
PER_STEP_SCHEDULES = ("TST",)  # a rate per optimizer step, from the global step; the others one per epoch
LR_SCALINGS = ("none", "linear", "sqrt")
COSINE_ETA_MIN = 1e-8  # OpenLTM's --cosine: exp/exp_forecast.py CosineAnnealingLR(..., eta_min=1e-8)


def global_batch_size(args, world_size):
    """Windows per optimizer step: --global_batch_size, or per-process batch x processes x accumulation steps."""
    return getattr(args, "global_batch", None) or args.batch_size * world_size * args.accumulation_steps


def scaled_learning_rate(args, global_batch):
    """--learning_rate scaled by --lr_scaling for `global_batch` against --base_batch_size."""
    ratio = global_batch / args.base_batch_size
    if args.lr_scaling == "none":
        return args.learning_rate
    if args.lr_scaling == "linear":
        return args.learning_rate * ratio
    if args.lr_scaling == "sqrt":
        return args.learning_rate * math.sqrt(ratio)
    raise UserError(f"unknown --lr_scaling '{args.lr_scaling}'; choose one of {', '.join(LR_SCALINGS)}")


def learning_rate_for_epoch(args, epoch):
    """Learning rate for 1-based `epoch` (TSLib's adjust_learning_rate semantics)."""
    # the experiment sets scaled_learning_rate from --lr_scaling; bare args start from --learning_rate
    base = getattr(args, "scaled_learning_rate", args.learning_rate)
    if getattr(args, "cosine", False):  # OpenLTM: CosineAnnealingLR(T_max=tmax, eta_min=1e-8), one step an epoch
        return COSINE_ETA_MIN + (base - COSINE_ETA_MIN) / 2 * (1 + math.cos((epoch - 1) / args.tmax * math.pi))
    if args.lradj == "type1":  # epochs 1-2 at base, then halve every epoch
        return base * 0.5 ** max(epoch - 2, 0)
    if args.lradj == "type2":  # TSLib's fixed table
        table = {2: 5e-5, 4: 1e-5, 6: 5e-6, 8: 1e-6, 10: 5e-7, 15: 1e-7, 20: 5e-8}
        lr = base
        for start, value in sorted(table.items()):
            if epoch > start:
                lr = value
        return lr
    if args.lradj == "cosine":  # cosine from base to 0 over train_epochs
        return base / 2 * (1 + math.cos((epoch - 1) / args.train_epochs * math.pi))
    if args.lradj in ("constant", "TST"):  # TST: LearningRateSchedule gives a rate per step
        return base
    raise UserError(f"unknown --lradj '{args.lradj}'; choose one of {', '.join(LR_SCHEDULES)}")


def one_cycle_learning_rate(base, step, total_steps, pct_start=0.2, div_factor=25.0, final_div_factor=1e4):
    """Rate at 0-based optimizer `step` of torch's OneCycleLR (cosine, two phases), as a pure function
    of the step so that resuming needs no scheduler state. TimeMixer/PatchTST's `--lradj TST`."""
    warm_end, last = pct_start * total_steps - 1, total_steps - 1
    start, low = base / div_factor, base / div_factor / final_div_factor
    if step <= warm_end:
        high, end, pct = start, base, step / warm_end if warm_end > 0 else 1.0
    else:
        high, end, pct = base, low, min((step - warm_end) / (last - warm_end), 1.0)
    return end + (high - end) / 2 * (math.cos(math.pi * pct) + 1)


def set_learning_rate(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr


class LearningRateSchedule:
    """--lradj as one function of (epoch, optimizer step); training sets every step's rate from it."""

    def __init__(self, args, steps_per_epoch):
        self.check(args.lradj)
        self.args = args
        self.total_steps = getattr(args, "train_steps", 0) or steps_per_epoch * args.train_epochs

    @staticmethod
    def check(lradj):
        require(lradj in LR_SCHEDULES, f"unknown --lradj '{lradj}'; choose one of {', '.join(LR_SCHEDULES)}")

    def rate(self, epoch, step):
        """The rate of 0-based optimizer `step` (counted over the whole run) in 1-based `epoch`: the
        schedule's, times a linear warm-up over the first --warmup_steps steps."""
        if self.args.lradj in PER_STEP_SCHEDULES:
            rate = one_cycle_learning_rate(self.args.scaled_learning_rate, step, self.total_steps)
        else:
            rate = learning_rate_for_epoch(self.args, epoch)
        warmup = getattr(self.args, "warmup_steps", 0)
        return rate * min(1.0, (step + 1) / warmup) if warmup else rate

    def apply(self, optimizer, epoch, step):
        set_learning_rate(optimizer, self.rate(epoch, step))


class EarlyStopping:
    """Stops after `patience` epochs without a new best validation loss.

    It is fed the *global* validation loss, identical on every rank, so each rank
    reaches the same decision; the experiment still agrees on it through a collective.
    """

    def __init__(self, patience, delta=0.0):
        self.patience = patience
        self.delta = delta
        self.best_loss = math.inf
        self.counter = 0
        self.stopped = False  # set by the experiment once every rank has agreed to stop

    def step(self, val_loss):
        """Returns True when val_loss is a new best (weights should be saved)."""
        if val_loss < self.best_loss - self.delta:
            self.best_loss = val_loss
            self.counter = 0
            return True
        self.counter += 1
        return False

    @property
    def should_stop(self):
        return self.counter >= self.patience

    def state_dict(self):
        return {"best_loss": self.best_loss, "counter": self.counter}

    def load_state_dict(self, state):
        self.best_loss = state["best_loss"]
        self.counter = state["counter"]


@contextlib.contextmanager
def eval_mode(model):
    """`model` in eval mode inside the block, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def set_precision(tf32, deterministic):
    """The float32 precision and determinism of every kernel, as --tf32 and --deterministic say.

    PyTorch's defaults differ between kernels: cuDNN convolutions use TF32 on Ampere and newer GPUs
    while matmuls do not, so TimesNet, TimeMixer and the token embeddings computed in TF32 unasked.
    Both are set explicitly here. cuBLAS reads CUBLAS_WORKSPACE_CONFIG when it starts, which
    is after this (no matmul has run on the GPU yet); a value the user set is kept.
    """
    # through the calls whose flags PyTorch and torch.compile read back (the cuDNN convolutions' and
    # RNNs' fp32_precision, cuBLAS's and oneDNN's matmul precision: each set alike)
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if deterministic or torch.are_deterministic_algorithms_enabled():
        # the call imports torch.compile's machinery (~2 s); skipped when nothing changes, so an
        # evaluation-only run (no optimizer, which imports it anyway) starts that much sooner
        torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False  # autotuning picks kernels by timing: another run, another kernel


def keep_freed_memory():
    """Let glibc's malloc serve tensors below 32 MiB from its heap, where freed memory stays for the next
    allocation, instead of mapping each one on its own and handing it back to the kernel on free.
    Returns whether the setting took (Linux with glibc only).

    glibc's threshold for such mappings starts at 128 KiB and rises only as mapped blocks are freed; a
    training step's tensors kept coming back as fresh pages, each zeroed by the kernel at its first touch
    (a page fault per 4 KiB): about 31 000 a step for TimeMixer at its ETTh1 settings, 128 MB of fresh
    memory, a few hundred with the threshold fixed at 32 MiB and the heap never trimmed (benchmarks/results/speed_notes.md).
    Resident memory settles at the training peak, as with PyTorch's GPU allocator, which caches for the
    same reason.
    """
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)  # the C library the interpreter runs on
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    # 32 MiB: the largest threshold glibc takes on 64-bit machines; -1: the heap's top is never trimmed
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, -1))


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state():
    """This process's random generators, in types that `torch.load(weights_only=True)` accepts: with
    CUDA, only this process's own device's generator (a process uses one GPU, and a restart may see
    fewer of them)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's
    return state


def set_rng_state(state):
    """Restore rng_state()'s generators, whatever device the saved tensors were loaded onto."""
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available() and torch.cuda.is_initialized():  # this process computes on CUDA
        torch.cuda.set_rng_state(state["cuda"].cpu())  # onto the current device
