"""Step-level bookkeeping of a training run: when to evaluate, save and log, the running sums
that a mid-epoch save must carry for the resumed run to end bit for bit where an uninterrupted one does,
the per-step records (steps.csv, TensorBoard) and log lines, and TrainingRun, what every step consults.

An epoch-based run (no --train_steps / --eval_steps) evaluates and saves at each epoch's end, as it
always has; a step-based one counts optimizer steps over the whole run:

    --train_steps N   stop after N optimizer steps (epochs go on as needed; --train_epochs is ignored)
    --eval_steps K    validate (early stopping, best checkpoint, a history record) every K steps and
                      after the last one, instead of at epoch ends
    --save_steps K    also write last.pth every K steps, mid-epoch included
    --log_steps K     a global train-loss record every K steps: a log line, steps.csv, TensorBoard
"""
import csv
import logging
import math
import os
import time
from dataclasses import dataclass

import torch

from utils import ddp, distributed
from utils.errors import require
from utils.files import atomic_write

logger = logging.getLogger("tsl")

STEP_FIELDS = ("step", "epoch", "train_loss", "lr", "grad_norm", "samples_per_s")


class StepPlan:
    """The run's length in optimizer steps and which steps evaluate, save and log."""

    def __init__(self, args, steps_per_epoch):
        require(steps_per_epoch > 0, "no training step per epoch: every process needs at least one training batch")
        self.args, self.steps_per_epoch = args, steps_per_epoch
        self.step_based = bool(args.train_steps or args.eval_steps)
        self.total_steps = args.train_steps or steps_per_epoch * args.train_epochs
        self.last_epoch = math.ceil(self.total_steps / steps_per_epoch)

    @staticmethod
    def _every(k, step):
        return bool(k) and step % k == 0

    def evaluates(self, step, end_of_epoch):
        """Validate after this step: at each epoch's end (every --eval_steps with it), and after the last step."""
        due = self._every(self.args.eval_steps, step) if self.args.eval_steps else end_of_epoch
        return due or step == self.total_steps

    def saves(self, step):
        return self._every(self.args.save_steps, step)

    def logs(self, step):
        return self._every(self.args.log_steps, step)

    def finished(self, step):
        return step >= self.total_steps


def with_last(items):
    """(item, is_last) for each item: the last step of an epoch is known when it is taken."""
    items = iter(items)
    current = next(items, _NOTHING)
    while current is not _NOTHING:
        following = next(items, _NOTHING)
        yield current, following is _NOTHING
        current = following


_NOTHING = object()


class RunningLoss:
    """This rank's training sums since a mark (the last evaluation, or the last log record): the
    element-weighted loss, the pre-clipping gradient norms, steps and samples. Tensors on the device,
    read only when a record is made, so ordinary steps add no host sync."""

    def __init__(self, device):
        self.device = device
        self.reset()

    def reset(self):
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.norm_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.n_scored = self.steps = self.samples = self.norm_steps = 0
        self.started = time.perf_counter()

    def add(self, loss_sum, n_scored, samples, grad_norm=None):
        self.loss_sum += loss_sum
        if grad_norm is not None:
            self.norm_sum += grad_norm
            self.norm_steps += 1
        self.n_scored += n_scored
        self.samples += samples
        self.steps += 1

    def global_record(self):
        """(mean train loss over every rank, mean gradient norm or None, global samples/s). A collective."""
        loss_sum, norm_sum = self._read()
        total, count, samples = distributed.all_reduce_sum([loss_sum, self.n_scored, self.samples])
        elapsed = time.perf_counter() - self.started
        # every rank clipped the same all-reduced gradients: its own mean norm is the global one
        norm = norm_sum / self.norm_steps if self.norm_steps else None
        return (total / count if count else math.nan), norm, (samples / elapsed if elapsed else 0.0)

    def state_dict(self):
        """Exact values (Python floats hold float64) for last.pth."""
        loss_sum, norm_sum = self._read()
        return {"loss_sum": loss_sum, "norm_sum": norm_sum, "n_scored": self.n_scored,
                "steps": self.steps, "samples": self.samples, "norm_steps": self.norm_steps}

    def _read(self):
        """(loss_sum, norm_sum) as Python floats: one read of the device for both."""
        return tuple(torch.stack([self.loss_sum, self.norm_sum]).tolist())

    def load_state_dict(self, state):
        self.reset()
        self.loss_sum.fill_(state["loss_sum"])
        self.norm_sum.fill_(state["norm_sum"])
        self.n_scored, self.steps, self.samples = state["n_scored"], state["steps"], state["samples"]
        self.norm_steps = state["norm_steps"]


class StepLog:
    """Rank 0's per-step records: steps.csv beside metrics.json (rewritten whole, atomically, so a
    killed run never leaves half a row) and, with --tensorboard, TensorBoard scalars. A resumed run
    keeps the records up to its saved step and writes the rest again."""

    def __init__(self, args, csv_path, tensorboard_dir=None, resumed_step=0):
        self.args, self.csv_path = args, csv_path
        self.rows = []
        self.writer = None
        if not distributed.is_main():
            return
        if resumed_step and os.path.isfile(csv_path):
            with open(csv_path, newline="") as f:
                self.rows = [row for row in csv.DictReader(f) if int(row["step"]) <= resumed_step]
        if tensorboard_dir:  # rank 0 only; train() has checked on every rank that TensorBoard imports
            self.writer = tensorboard_writer(tensorboard_dir, purge_step=resumed_step + 1 if resumed_step else None)

    def record(self, step, epoch, loss, lr, grad_norm, samples_per_s):
        if not distributed.is_main():
            return
        row = {"step": step, "epoch": epoch, "train_loss": loss, "lr": lr,
               "grad_norm": "" if grad_norm is None else grad_norm, "samples_per_s": samples_per_s}
        self.rows.append(row)
        self._write_csv()
        self.scalars(step, {"train/loss": loss, "train/lr": lr, "train/samples_per_s": samples_per_s,
                            **({"train/grad_norm": grad_norm} if grad_norm is not None else {})})

    def scalars(self, step, values):
        if self.writer is not None:
            for tag, value in values.items():
                if value is not None and math.isfinite(value):
                    self.writer.add_scalar(tag, value, step)
            self.writer.flush()

    def _write_csv(self):
        def write(f):
            out = csv.DictWriter(f, fieldnames=STEP_FIELDS)
            out.writeheader()
            out.writerows(self.rows)
        atomic_write(self.csv_path, write, binary=False)

    def close(self):
        if self.writer is not None:
            self.writer.close()


@dataclass
class TrainingRun:
    """What each step of a training run consults and last.pth does not hold: when to log, evaluate and
    save (plan), the learning-rate schedule, the step records, the evaluation loaders and the two files."""
    plan: StepPlan
    schedule: object  # utils.tools.LearningRateSchedule
    step_log: StepLog
    eval_loaders: tuple  # validation, test
    best_path: str
    last_path: str
    state_bytes: list = None  # optimizer state per rank, measured once it exists (after the first step)


def training_summary(args, setting, train_windows, plan=None):
    """The line that opens training: windows, global batch, learning rate and the run's length."""
    few_shot = f" (--subset_rand_ratio {args.subset_rand_ratio})" if args.subset_rand_ratio < 1 else ""
    accumulation = f" x {args.accumulation_steps} accumulation steps" if args.accumulation_steps > 1 else ""
    scaling = (f" (--lr_scaling {args.lr_scaling}: {args.learning_rate:g} at batch {args.base_batch_size})"
               if args.lr_scaling != "none" else "")
    length = (f", {plan.total_steps} steps ({plan.steps_per_epoch} per epoch)" if plan and plan.step_based else "")
    return (f"training {setting}: {train_windows} train windows{few_shot}, global batch {args.global_batch_size} "
            f"({'up to ' if getattr(args, 'global_batch', None) else ''}{args.batch_size} x {distributed.world_size()} "
            f"processes{accumulation}), "
            f"learning rate {args.scaled_learning_rate:g}{scaling}{length}")


def evaluation_line(args, record, samples_per_s, stopper, improved, plan):
    """The line of an evaluation (an epoch's end, or every --eval_steps): losses, rate, time, patience."""
    where = (f"step {record['step']}/{plan.total_steps} (epoch {record['epoch']})" if plan.step_based
             else f"epoch {record['epoch']}/{args.train_epochs}")
    return (f"{where}: train {record['train_loss']:.6f} "
            f"vali {record['vali_loss']:.6f} "
            + ("" if record["test_loss"] is None else f"test {record['test_loss']:.6f} ")
            + f"lr {record['lr']:.3g} "
            f"{record['seconds']:.2f}s {samples_per_s:.0f} samples/s, best vali {stopper.best_loss:.6f}"
            + (" *best*" if improved else f" (no improvement {stopper.counter}/{args.patience})")
            + (f", grad norm {record['grad_norm']:.4g}" if "grad_norm" in record else "")
            + (f", peak GPU memory {max(record['peak_gpu_mib']):.0f} MiB" if "peak_gpu_mib" in record else ""))


def log_optimizer_state_bytes(optimizer, zero):
    """Every rank's optimizer-state bytes (halved per rank by --zero on 2 ranks), logged. A collective."""
    per_rank = distributed.gather_objects(ddp.optimizer_state_bytes(optimizer))
    logger.info("optimizer state per rank: " + ", ".join(f"{b / 2**20:.2f} MiB" for b in per_rank)
                + (" (sharded, --zero)" if zero and len(per_rank) > 1 else ""))
    return per_rank


def tensorboard_problem():
    """None if torch.utils.tensorboard imports, else the line that says how to get it."""
    try:
        import torch.utils.tensorboard  # noqa: F401  (needs the tensorboard package)
    except ImportError:
        return ("--tensorboard needs the tensorboard package: pip install tensorboard (or pip install -e "
                "'.[tensorboard]'); without it, steps.csv beside metrics.json holds the same per-step records")
    return None


def tensorboard_writer(log_dir, purge_step=None):
    """torch.utils.tensorboard's SummaryWriter; `purge_step` drops the events a resumed run writes again."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=log_dir, purge_step=purge_step)
