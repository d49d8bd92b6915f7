"""Exp_Forecast: the train / vali / test loop for direct (TSLib) and token (OpenLTM) forecasters.

Distributed semantics, all owned here and in utils.distributed:
- training steps go through the DDP wrapper (gradient all-reduce); step k takes the k-th global
  batch of the epoch's one order, whatever the world size (data_provider.global_batches), each
  rank's losses weighted so that DDP's average is that global batch's mean;
- evaluation runs the unwrapped model on each rank's unpadded share of the windows,
  with no collective inside the loop; one all_reduce of error sums then gives the
  exact global metrics, identical on every rank and equal to a single-process run;
- early stopping follows that global loss, agreed by a collective; rank 0 saves the
  best weights atomically, everyone waits at a barrier, then loads them.
"""
import contextlib
import logging
import math
import os
import time

import torch

from data_provider.data_factory import data_provider, prepared_data, split_numbering
from exp.adaptation import load_pretrained
from exp.exp_basic import Exp_Basic
from exp.forward import forward
from exp.steps import RunningLoss, StepLog, StepPlan, tensorboard_problem
from exp.outputs import (OriginalScale, draw_forecasts, draw_training, output_path, require_one_scale,
                         require_outputs_writable, save_window_errors, tensorboard_dir)
from layers.dropout import mask_key, masks_follow_samples
from utils import distributed
from utils.checkpoint import (checkpoint_path, load_weights, require_writable, resume, save_best,
                              save_training_state)
from utils.errors import require
from utils.files import remove_stale_temporaries
from utils.metrics import ErrorSums, batch_loss
from utils.progress import RESULT, EpochProgress, EvaluationProgress, progress_mode
from utils.tools import EarlyStopping, LearningRateSchedule, eval_mode

logger = logging.getLogger("tsl")


class Exp_Forecast(Exp_Basic):
    # ------------------------------------------------------------ training
    def train(self, setting):
        """Train until --train_epochs (or --train_steps) or early stopping, continuing last.pth with
        --resume (mid-epoch included), keep the best validation weights in checkpoint.pth and end with
        them loaded."""
        args = self.args
        require_writable(args, "checkpoints", "results_dir")
        self._remove_stale_temporaries(setting)
        require_outputs_writable(args, setting)  # results.jsonl and the setting's files, before training
        if args.tensorboard:
            distributed.raise_on_every_rank(tensorboard_problem, on="main")
        if args.adaptation:  # start from pre-trained weights; a resumed state below still overrides them
            load_pretrained(self.raw_model, args.pretrain_model_path, self.device)
        train_loader, vali_loader, test_loader = (data_provider(args, flag, self.device)[1]
                                                  for flag in ("train", "val", "test"))
        best_path, last_path = checkpoint_path(args, setting), checkpoint_path(args, setting, "last.pth")
        optimizer = self.make_optimizer()
        stopper = EarlyStopping(args.patience)
        since_eval, since_log = RunningLoss(self.device), RunningLoss(self.device)
        self.running = (since_eval, since_log)  # train_epoch adds every step to both
        run = resume(args, setting, self.raw_model, optimizer, stopper, self.grad_scaler,
                     running={"since_eval": since_eval, "since_log": since_log})
        plan = StepPlan(args, steps_per_epoch=train_loader.steps_per_epoch)
        schedule = LearningRateSchedule(args, plan.steps_per_epoch)
        step_log = StepLog(args, output_path(args, setting, "steps.csv"), tensorboard_dir(args, setting), run.step)
        logger.info(training_summary(args, setting, len(train_loader.dataset), plan))
        history, stopper.stopped = run.history, run.stopped
        state_bytes = None  # optimizer state per rank, measured once it exists (after the first step)
        eval_loaders = (vali_loader, test_loader)

        def after_step(step, epoch, windows, end_of_epoch):
            """Logging, evaluation and saving due after optimizer step `step`; True ends training."""
            nonlocal state_bytes
            if state_bytes is None:
                state_bytes = self._log_optimizer_state_bytes(optimizer)
            if plan.logs(step):
                self._log_step(step_log, since_log, step, epoch, optimizer)
            evaluates = plan.evaluates(step, end_of_epoch)
            if evaluates:
                self._evaluate(eval_loaders, history, stopper, since_eval, step_log, best_path, optimizer, plan,
                               epoch, step, end_of_epoch)
            if evaluates or plan.saves(step):
                save_training_state(last_path, self.raw_model, optimizer, stopper, args, epoch, step, history,
                                    stopper.stopped, self.grad_scaler, windows=windows, end_of_epoch=end_of_epoch,
                                    running={"since_eval": since_eval, "since_log": since_log})
            return stopper.stopped or plan.finished(step)

        step, epoch = run.step, run.epoch
        while not stopper.stopped and not plan.finished(step) and epoch <= plan.last_epoch:
            train_loader.set_epoch(epoch)
            start = run.windows if epoch == run.epoch else 0  # the epoch's windows done before a resume
            step = self.train_epoch(train_loader, optimizer, schedule, epoch, step, start, after_step)
            epoch += 1
        step_log.close()
        if stopper.stopped:
            logger.info(f"early stopping after {'step ' + str(step) if plan.step_based else 'epoch ' + str(epoch - 1)}")
        if state_bytes is None:  # resumed after the last step: the loaded state
            state_bytes = self._log_optimizer_state_bytes(optimizer)
        # rank 0 reads, everyone gets its weights: other nodes need not see its disk
        distributed.load_on_main(self.raw_model, load_weights, best_path, map_location=self.device)
        draw_training(args, setting, history)
        return {"history": history, "stopped_epoch": history[-1]["epoch"] if history else 0,
                "stopped_step": step, "best_vali_loss": stopper.best_loss,
                "checkpoint": best_path, "train_windows": len(train_loader.dataset),
                "optimizer_state_bytes": state_bytes}

    def _evaluate(self, loaders, history, stopper, since_eval, step_log, best_path, optimizer, plan, epoch, step,
                  end_of_epoch):
        """Validate the current weights, keep them if best, append the history record and log it;
        stopper.stopped says whether training ends (decided on every rank together)."""
        train_loss, grad_norm, samples_per_s = since_eval.global_record()
        seconds = time.perf_counter() - since_eval.started
        since_eval.reset()
        vali_loss, test_loss = self._epoch_losses(f"step {step}" if plan.step_based else f"epoch {epoch}", *loaders)
        improved, stopper.stopped = self._early_stopping(stopper, vali_loss, best_path)
        self.model.train()
        record = {"epoch": epoch, "step": step, "train_loss": train_loss, "vali_loss": vali_loss,
                  "test_loss": test_loss, "lr": optimizer.param_groups[0]["lr"], "seconds": seconds}
        if not end_of_epoch:
            record["partial_epoch"] = True
        if grad_norm is not None:
            record["grad_norm"] = grad_norm  # the mean norm before clipping
        peak = distributed.peak_gpu_mib(self.device)
        if peak is not None:
            record["peak_gpu_mib"] = peak  # per rank, so far
        history.append(record)
        step_log.scalars(step, {"val/loss": vali_loss} if test_loss is None else
                         {"val/loss": vali_loss, "test/loss": test_loss})
        logger.info(evaluation_line(self.args, record, samples_per_s, stopper, improved, plan))

    def _log_step(self, step_log, since_log, step, epoch, optimizer):
        """The global train loss since the last record: a log line, a steps.csv row, TensorBoard (rank 0)."""
        loss, grad_norm, samples_per_s = since_log.global_record()
        since_log.reset()
        lr = optimizer.param_groups[0]["lr"]
        step_log.record(step, epoch, loss, lr, grad_norm, samples_per_s)
        logger.info(f"step {step} (epoch {epoch}): train {loss:.6f} lr {lr:.3g} {samples_per_s:.0f} samples/s"
                    + (f" grad norm {grad_norm:.4g}" if grad_norm is not None else ""))

    def _remove_stale_temporaries(self, setting):
        """Rank 0 removes the temp files a run killed mid-save left in this setting's folders (this
        run holds the setting's lock, so they are nobody's live writes)."""
        if distributed.is_main():
            started = time.time()
            for folder in (os.path.dirname(checkpoint_path(self.args, setting)), output_path(self.args, setting, "")):
                removed = remove_stale_temporaries(folder, started)
                if removed:
                    logger.info(f"removed {len(removed)} unfinished temp file(s) a killed run left in {folder}: "
                                + ", ".join(sorted(removed)))

    def _epoch_losses(self, when, vali_loader, test_loader):
        # evaluate (and save) one model: rank 0's running statistics on every rank
        distributed.broadcast_buffers(self.raw_model)
        vali_loss = self.vali(vali_loader, "val")
        test_loss = self._loss_of(self.evaluate(test_loader, "test")) if self.args.test_every_epoch else None
        fp16 = self.args.use_amp and self.args.amp_dtype == "fp16"
        require(math.isfinite(vali_loss), f"validation loss is {vali_loss} after {when}: "
                + ("the fp16 forward overflowed (fp16 ends at 65504) or training diverged; use --amp_dtype bf16 "
                   "or drop --use_amp, or lower --learning_rate" if fp16 else
                   "training diverged; lower --learning_rate or check the data for extreme values"))
        return vali_loss, test_loss

    def _early_stopping(self, stopper, vali_loss, best_path):
        """(improved, stop): a new best is saved to best_path. Every rank holds the same global
        vali_loss; the collective makes the decision shared by construction, so no rank can
        leave the loop alone."""
        improved = stopper.step(vali_loss)
        if improved:
            save_best(self.raw_model, best_path)
        return improved, distributed.any_rank(stopper.should_stop)

    def train_epoch(self, loader, optimizer, schedule=None, epoch=0, step=0, start=0, after_step=None):
        """Train through this epoch's global batches (a TrainLoader's steps) from position `start` of
        the epoch's order on (the windows every rank together took before a resume), each optimizer
        step at `schedule`'s rate (None: the optimizer's own); `step` counts the run's steps before.
        after_step(step, epoch, windows done, end_of_epoch) runs after each step; True from it ends
        the epoch early. Returns the run's step count after the epoch."""
        global_batch = loader.sampler.global_batch
        progress = EpochProgress(epoch, loader.steps_per_epoch, progress_mode(self.args.quiet),
                                 done=-(-start // global_batch))
        self.model.train()
        for micro_batches, end_of_epoch in _ending(loader.steps(start)):  # the last may be short
            if schedule is not None:
                schedule.apply(optimizer, epoch, step)
            loss_sum, n_scored = self.train_step(micro_batches, optimizer)
            samples = sum(batch[0].shape[0] for batch in micro_batches)  # this rank's
            step, start = step + 1, start + micro_batches.windows
            progress.update(loss_sum, n_scored, samples)
            for running in self.running:
                running.add(loss_sum, n_scored, samples, self.last_grad_norm)
            if after_step is not None and after_step(step, epoch, start, end_of_epoch):
                break
        progress.close()
        return step

    def train_step(self, micro_batches, optimizer):
        """One optimizer step over this rank's micro-batches of a global batch, equal to one
        single-process step over the whole global batch.

        `micro_batches`: a GlobalStep (data_provider.global_batches), which also says how many windows
        the global batch holds over every rank, or a plain list (every rank then holds as many windows
        as this one). Each micro-batch's backward loss is its elementwise loss sum x world size / the
        global batch's scored elements, so gradients add up over the micro-batches (only the last
        backward all-reduces, DDP no_sync before it) and DDP's average over ranks is the gradient of
        the global batch's mean loss, however the windows are spread. A rank with no window in the
        step still joins the all-reduce (_stand_in_pass). Returns this rank's element-weighted loss
        sum (a tensor: no host sync) and its number of scored elements.
        """
        optimizer.zero_grad(set_to_none=True)
        world = distributed.world_size()
        windows = getattr(micro_batches, "windows", None) or world * sum(batch[0].shape[0] for batch in micro_batches)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        n_scored, last = 0, len(micro_batches) - 1
        # ranks that run different numbers of forwards (a short last batch) cannot pair SyncBatchNorm's gathers
        with distributed.local_batch_norm(self.model, getattr(micro_batches, "uneven", False)):
            for i, batch in enumerate(micro_batches):
                with distributed.no_sync(self.model, skip=i < last):
                    with self.autocast(), self.sample_masks(micro_batches, i, batch[0].shape[0]):
                        pred, true = forward(self.model, batch, self.args, "train", self.device)
                        loss = batch_loss(pred.float(), true, self.args.loss)  # the mean over pred's elements
                    weight = world * pred.shape[0] / windows  # pred's windows x W / the global batch's
                    self.backward(loss if weight == 1 else loss * weight)
                loss_sum.add_(loss.detach(), alpha=pred.numel())
                n_scored += pred.numel()
            if not micro_batches:
                self._stand_in_pass(micro_batches.stand_in)
        self.last_grad_norm = self.optimizer_step(optimizer)
        return loss_sum, n_scored

    def sample_masks(self, micro_batches, i, samples):
        """Dropout masks that follow the samples of micro-batch i (layers.dropout), the same whichever rank
        trains them; not for a model that says its randomness cannot (`randomness_follows_sample`), nor
        under --compile (a keyed mask would break the compiled graph at every dropout), nor for steps
        that do not say where their windows sit in the epoch's order."""
        firsts = getattr(micro_batches, "firsts", None)
        if not self.masks_follow_samples or firsts is None:
            return contextlib.nullcontext()
        return masks_follow_samples(mask_key(self.args.seed, micro_batches.epoch), firsts[i], samples)

    def _stand_in_pass(self, batch):
        """A forward and backward that contributes nothing, for a rank whose part of a short last global
        batch is empty: DDP all-reduces in backward, so every rank must run one. Zero-weighted, on one
        real window, in eval mode so that BatchNorm's running statistics and dropout's random stream
        stay as they were."""
        with eval_mode(self.model), self.autocast():
            pred, true = forward(self.model, batch, self.args, "train", self.device)
            loss = batch_loss(pred.float(), true, self.args.loss)
        self.backward(loss * 0.0)

    def _log_optimizer_state_bytes(self, optimizer):
        """Every rank's optimizer-state bytes (halved per rank by --zero on 2 ranks), logged."""
        per_rank = distributed.gather_objects(distributed.optimizer_state_bytes(optimizer))
        logger.info("optimizer state per rank: " + ", ".join(f"{b / 2**20:.2f} MiB" for b in per_rank)
                    + (" (sharded, --zero)" if self.args.zero and len(per_rank) > 1 else ""))
        return per_rank

    # ------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, loader, stage, original=None, keep_windows=False):
        """Global ErrorSums over every window of the loader's split, on every rank; `original`
        (an ErrorSums with an OriginalScale transform), if given, also sums the errors on the
        data's original scale, against the data file's own float64 values; `keep_windows` keeps each
        window's errors too. A long evaluation shows its progress on rank 0 (utils.progress.EvaluationProgress)."""
        model = self.raw_model  # no DDP wrapper: no collective can run inside this loop
        sums = ErrorSums(keep_windows)
        progress = EvaluationProgress(stage, len(loader), progress_mode(self.args.quiet))
        truths = loader.original_targets() if original is not None else None  # batch by batch, as the loader's
        with eval_mode(model):
            for batch in loader:
                with self.autocast():
                    pred, true = forward(model, batch, self.args, stage, self.device)
                sums.update(pred, true)
                if original is not None:  # the scored part: the horizon's last steps, the last channels
                    original.update(pred, next(truths)[:, -pred.shape[1]:, -pred.shape[-1]:].to(pred.device))
                progress.update()
        progress.close()
        if original is not None:
            original.all_reduce()
        return sums.all_reduce()

    def _loss_of(self, sums):
        return sums.metrics()["mse" if self.args.loss == "MSE" else "mae"]

    def vali(self, vali_loader, stage="val"):
        """Exact global validation loss (same value on every rank, for any world size)."""
        return self._loss_of(self.evaluate(vali_loader, stage))

    def test(self, setting, checkpoint=None, pretrained=False):
        """Test metrics of the current weights, or of `checkpoint` if given (`pretrained`: zero-shot, the
        weights of a pre-training run on another data set); runs under DDP too, rank 0 reading the file."""
        args = self.args
        if checkpoint:
            require_outputs_writable(args, setting)
            if pretrained:
                logger.info(f"zero-shot: evaluating pre-trained weights {checkpoint} on --data {args.data}, untrained")
            distributed.load_on_main(self.raw_model, _load_evaluated, checkpoint, pretrained, self.device)
        _, vali_loader = data_provider(args, "val", self.device)
        _, test_loader = data_provider(args, "test", self.device)
        vali_loss = self.vali(vali_loader, "val")
        original = None
        if args.inverse:  # data without one scaler fails here, on every rank alike (before any collective)
            data = prepared_data(args)
            require_one_scale(data, args)
            original = ErrorSums(transform=OriginalScale(data.scaler, self.device))
        sums = self.evaluate(test_loader, "test", original, keep_windows=True)
        numbers, split_windows = split_numbering(test_loader.dataset)
        save_window_errors(args, setting, sums.window_errors(), numbers)
        metrics = sums.metrics()
        if original is not None:
            metrics.update({f"{k}_orig": v for k, v in original.metrics().items()})
        metrics["vali_loss"] = vali_loss
        metrics["test_windows"] = len(test_loader.dataset)  # scored: all of the split's, or --test_windows of them
        metrics["test_split_windows"] = split_windows
        if args.test_windows and args.test_windows >= split_windows:
            logger.info(f"--test_windows {args.test_windows}: the test split holds {split_windows} windows, all scored")
        peak = distributed.peak_gpu_mib(self.device)
        if peak is not None:
            metrics["peak_gpu_mib"] = peak  # per rank, over the whole run
        logger.log(RESULT, result_line(setting, metrics))
        draw_forecasts(self, setting)
        return metrics


def _load_evaluated(model, path, pretrained, device):
    """Strictly load the weights --is_training 0 evaluates (utils.checkpoint reads ours and OpenLTM's files)."""
    require(not pretrained or os.path.exists(path),
            f"--pretrain_model_path {path} not found; pass the checkpoint of a pre-training run (its "
            "<checkpoints>/<setting>/checkpoint.pth, or OpenLTM's)")
    load_weights(model, path, map_location=device)


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


def result_line(setting, metrics):
    """The result line of a test: every metric, on the original scale too with --inverse."""
    orig = ""
    if "mse_orig" in metrics:
        orig = f"; original scale: mse {metrics['mse_orig']:.6g} mae {metrics['mae_orig']:.6g}"
    scored = metrics["test_windows"]
    if scored < metrics["test_split_windows"]:
        scored = f"{scored} of the split's {metrics['test_split_windows']}"  # a --test_windows subset
    return (f"test {setting}: mse {metrics['mse']:.6f} mae {metrics['mae']:.6f} rmse {metrics['rmse']:.6f} "
            f"mape {metrics['mape']:.6f} mspe {metrics['mspe']:.6f}{orig} (vali {metrics['vali_loss']:.6f}, "
            f"{scored} windows, {distributed.world_size()} processes)")


def _ending(items):
    """(item, is_last) for each item: the last step of an epoch is known when it is taken."""
    items = iter(items)
    current = next(items, _NOTHING)
    while current is not _NOTHING:
        following = next(items, _NOTHING)
        yield current, following is _NOTHING
        current = following


_NOTHING = object()

