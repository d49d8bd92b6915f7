"""Exp_Forecast: the train / vali / test loop for direct (TSLib) and token (OpenLTM) forecasters.

Distributed semantics, all owned here and in utils.distributed and utils.ddp:
- training steps go through the DDP wrapper (gradient all-reduce); step k takes the k-th global
  batch of the epoch's one order, whatever the world size (data_provider.global_batches), each
  rank's losses weighted so that DDP's average is that global batch's mean;
- evaluation runs the unwrapped model on each rank's unpadded share of the windows, with no collective
  inside the loop (but FSDP2's gathers, paired: Exp_Basic.paired); one all_reduce of error sums
  then gives the exact global metrics, identical on every rank and equal to a single-process run;
- early stopping follows that global loss, agreed by a collective; rank 0 saves the
  best weights atomically, everyone waits at a barrier, then loads them;
- the run's state is one utils.checkpoint.TrainingState, saved whole to last.pth (a collective,
  rank 0 writing) and loaded back whole on resume; exp.steps.TrainingRun holds what steps consult.
"""
import contextlib
import logging
import math
import os
import time

import torch

from data_provider.data_factory import data_provider, prepared_data
from exp.adaptation import load_pretrained
from exp.exp_basic import Exp_Basic
from exp.forward import forward, training_loss, window_draws
from exp.scoring import ProbabilisticScoring
from exp.outputs import (draw_forecasts, draw_training, original_scale_sums, output_path, prepare_training_outputs,
                         require_outputs_writable, result_line, tensorboard_dir, test_metrics)
from exp.steps import (RunningLoss, StepLog, StepPlan, TrainingRun, evaluation_line, log_optimizer_state_bytes,
                       training_summary, with_last)
from layers.dropout import mask_key, masks_follow_samples
from models.foundation.release import open_release
from utils import ddp, distributed
from utils.checkpoint import TrainingState, checkpoint_path, load_weights, resume, save_best, save_training_state
from utils.errors import require
from utils.metrics import ErrorSums
from utils.probabilistic import ObjectiveSums
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
        prepare_training_outputs(args, setting)
        if args.adaptation and not args.lora_rank:  # pre-trained weights (LoRA's: Exp_Basic); a resume overrides
            load_pretrained(self.raw_model, args.pretrain_model_path, self.device)
        train_loader, *eval_loaders = (data_provider(args, flag, self.device)[1] for flag in ("train", "val", "test"))
        self.allow_unused_parameters(train_loader.dataset)  # before the optimizer takes the DDP module's parameters
        state = TrainingState(self.raw_model, self.make_optimizer(), EarlyStopping(args.patience), self.grad_scaler,
                              running={"since_eval": RunningLoss(self.device), "since_log": RunningLoss(self.device)})
        resume(args, setting, state, prepared_data(args).content_hash())  # the hash: part of the run's identity
        plan = StepPlan(args, steps_per_epoch=train_loader.steps_per_epoch)
        step_log = StepLog(args, output_path(args, setting, "steps.csv"), tensorboard_dir(args, setting), state.step)
        run = TrainingRun(plan, LearningRateSchedule(args, plan.steps_per_epoch), step_log, tuple(eval_loaders),
                          checkpoint_path(args, setting), checkpoint_path(args, setting, "last.pth"))
        logger.info(training_summary(args, setting, len(train_loader.dataset), plan))
        while not state.stopper.stopped and not plan.finished(state.step) and state.epoch <= plan.last_epoch:
            train_loader.set_epoch(state.epoch)
            self.train_epoch(train_loader, state, run)
            state.next_epoch()
        run.step_log.close()
        if state.stopper.stopped:  # state.epoch is past the last one trained
            where = f"step {state.step}" if plan.step_based else f"epoch {state.epoch - 1}"
            logger.info(f"early stopping after {where}")
        if run.state_bytes is None:  # resumed after the last step: the loaded state
            run.state_bytes = log_optimizer_state_bytes(state.optimizer, self.args.zero)
        # rank 0 reads, everyone gets its weights: other nodes need not see its disk
        ddp.load_on_main(self.raw_model, load_weights, run.best_path, map_location=self.device)
        draw_training(args, setting, state.history)
        return {"history": state.history, "stopped_epoch": state.history[-1]["epoch"] if state.history else 0,
                "stopped_step": state.step, "best_vali_loss": state.stopper.best_loss,
                "checkpoint": run.best_path, "train_windows": len(train_loader.dataset),
                "optimizer_state_bytes": run.state_bytes, "dropout_keyed": self.dropout_keyed}

    def train_epoch(self, loader, state, run=None):
        """Train through this epoch's global batches (a TrainLoader's steps) from position state.windows of
        the epoch's order on (the windows every rank together took before a resume), adding to `state`
        (a TrainingState) each step. With a TrainingRun, each step takes the schedule's rate and is
        followed by what the plan says is due (_after_step), which may end the epoch early; without one,
        the optimizer's own rate and nothing else."""
        progress = EpochProgress(state.epoch, loader.steps_per_epoch, progress_mode(self.args.quiet),
                                 done=-(-state.windows // loader.sampler.global_batch))
        self.model.train()
        for micro_batches, end_of_epoch in with_last(loader.steps(state.windows)):  # the last may be short
            if run is not None:
                run.schedule.apply(state.optimizer, state.epoch, state.step)
            loss_sum, n_scored = self.train_step(micro_batches, state.optimizer)
            samples = sum(batch[0].shape[0] for batch in micro_batches)  # this rank's
            state.step, state.windows = state.step + 1, state.windows + micro_batches.windows
            state.end_of_epoch = end_of_epoch
            progress.update(loss_sum, n_scored, samples)
            for running in state.running.values():
                running.add(loss_sum, n_scored, samples, self.last_grad_norm)
            if run is not None and self._after_step(state, run):
                break
        progress.close()

    def _after_step(self, state, run):
        """Logging, evaluation and saving due after the step just taken; True ends training."""
        if run.state_bytes is None:
            run.state_bytes = log_optimizer_state_bytes(state.optimizer, self.args.zero)
        if run.plan.logs(state.step):
            self._log_step(state, run.step_log)
        evaluates = run.plan.evaluates(state.step, state.end_of_epoch)
        if evaluates:
            self._evaluate(state, run)
        if evaluates or run.plan.saves(state.step):
            save_training_state(run.last_path, state, self.args, prepared_data(self.args).content_hash())
        return state.stopper.stopped or run.plan.finished(state.step)

    def _evaluate(self, state, run):
        """Validate the current weights, keep them if best, append the history record and log it;
        state.stopper.stopped says whether training ends (decided on every rank together)."""
        since_eval = state.running["since_eval"]
        train_loss, grad_norm, samples_per_s = since_eval.global_record()
        seconds = time.perf_counter() - since_eval.started
        since_eval.reset()
        when = f"step {state.step}" if run.plan.step_based else f"epoch {state.epoch}"
        vali_loss, test_loss = self._epoch_losses(when, *run.eval_loaders)
        improved, state.stopper.stopped = self._early_stopping(state.stopper, vali_loss, run.best_path)
        self.model.train()
        record = {"epoch": state.epoch, "step": state.step, "train_loss": train_loss, "vali_loss": vali_loss,
                  "test_loss": test_loss, "lr": state.optimizer.param_groups[0]["lr"], "seconds": seconds}
        if not state.end_of_epoch:
            record["partial_epoch"] = True
        if grad_norm is not None:
            record["grad_norm"] = grad_norm  # the mean norm before clipping
        peak = distributed.peak_gpu_mib(self.device)
        if peak is not None:
            record["peak_gpu_mib"] = peak  # per rank, so far
        state.history.append(record)
        run.step_log.scalars(state.step, {"val/loss": vali_loss} if test_loss is None else
                             {"val/loss": vali_loss, "test/loss": test_loss})
        logger.info(evaluation_line(self.args, record, samples_per_s, state.stopper, improved, run.plan))

    def _log_step(self, state, step_log):
        """The global train loss since the last record: a log line, a steps.csv row, TensorBoard (rank 0)."""
        since_log = state.running["since_log"]
        loss, grad_norm, samples_per_s = since_log.global_record()
        since_log.reset()
        lr = state.optimizer.param_groups[0]["lr"]
        step_log.record(state.step, state.epoch, loss, lr, grad_norm, samples_per_s)
        logger.info(f"step {state.step} (epoch {state.epoch}): train {loss:.6f} lr {lr:.3g} {samples_per_s:.0f} "
                    "samples/s" + (f" grad norm {grad_norm:.4g}" if grad_norm is not None else ""))

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
        # ranks running different numbers of forwards cannot pair SyncBatchNorm's gathers; a rank without windows can
        with ddp.batch_norm_for_step(self.model, getattr(micro_batches, "uneven", False), windows < world):
            for i, batch in enumerate(micro_batches):
                with ddp.no_sync(self.model, skip=i < last):
                    with self.autocast(), self.sample_masks(micro_batches, i, batch[0].shape[0]):
                        # the mean over the scored elements (or windows, for a model's own objective)
                        loss, scored, batch_windows = training_loss(self.model, batch, self.args, self.device, self.loss)
                    weight = world * batch_windows / windows  # this batch's windows x W / the global batch's
                    self.backward(loss if weight == 1 else loss * weight)
                loss_sum.add_(loss.detach(), alpha=scored)
                n_scored += scored
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
        with eval_mode(self.model), ddp.stand_in_batch_norm(self.model), self.autocast():
            loss = training_loss(self.model, batch, self.args, self.device, self.loss)[0]
        self.backward(loss * 0.0)

    # ------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, loader, stage, original=None, keep_windows=False, scoring=None):
        """Global ErrorSums over every window of the loader's split, on every rank; `original` (an ErrorSums with
        an OriginalScale transform) also sums the errors on the original scale, against the data file's own float64
        values; `keep_windows` keeps each window's errors. A probabilistic run scores its median, sets the sums'
        `objective_loss` (the global mean of its training objective), and `scoring` (exp.scoring) its quantiles."""
        model = self.raw_model  # no DDP wrapper
        sums = ErrorSums(keep_windows)
        losses = ObjectiveSums(self.objective) if self.objective is not None else None
        progress = EvaluationProgress(stage, len(loader), progress_mode(self.args.quiet))
        truths = loader.original_targets() if original is not None else None  # batch by batch, as the loader's
        draws = window_draws(self.args.seed, stage, loader.dataset)  # a model's own random draws follow the window
        with eval_mode(model):
            batches = zip(loader, loader.batch_indices(), loader.batch_positions())
            for batch, indices, positions in self.paired(loader, batches, stage, draws):  # --fsdp: forwards gather
                with self.autocast(), draws(positions):
                    pred, true = forward(model, batch, self.args, stage, self.device)
                # the scored part of the file's own values: the horizon's last steps, the last channels
                truth = None if original is None else next(truths)[:, -true.shape[1]:, -true.shape[-1]:].to(true.device)
                if losses is not None:  # a probabilistic forecast: its loss, quantiles and median
                    losses.update(pred, true)
                    pred = (scoring.update(pred, true, indices, truth, positions) if scoring is not None
                            else self.objective.point(pred))
                sums.update(pred, true)
                if original is not None:
                    original.update(pred, truth)
                progress.update()
        progress.close()
        for reduced in (r for r in (original, scoring) if r is not None):
            reduced.all_reduce()
        sums.objective_loss = None if losses is None else losses.all_reduce().loss()
        return sums.all_reduce()

    def _loss_of(self, sums):
        """The validation loss early stopping follows: the training objective's."""
        return sums.objective_loss if sums.objective_loss is not None else sums.metrics()[self.args.loss.lower()]

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
            ddp.load_on_main(self.raw_model, _load_evaluated, checkpoint, pretrained, self.device)
        vali_loader, test_loader = (data_provider(args, flag, self.device)[1] for flag in ("val", "test"))
        vali_loss = self.vali(vali_loader, "val")
        original = original_scale_sums(args, self.device)  # --inverse on data of no one scale: refused on every rank
        scoring = (ProbabilisticScoring(args, test_loader.dataset, self.device, original and original.transform)
                   if self.objective is not None else None)
        sums = self.evaluate(test_loader, "test", original, keep_windows=True, scoring=scoring)
        metrics = test_metrics(args, setting, sums, original, vali_loss, test_loader.dataset, scoring)
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
    load_weights(model, path, map_location=device, opener=open_release)  # a release folder: opened there
