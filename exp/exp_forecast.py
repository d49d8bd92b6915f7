"""Exp_Forecast: train / vali / test for direct (TSLib) and token (OpenLTM) forecasters.

Distributed semantics, all owned here and in utils.distributed:
- training steps go through the DDP wrapper (gradient all-reduce);
- evaluation runs the unwrapped model on each rank's unpadded share of the windows,
  with no collective inside the loop; one all_reduce of error sums then gives the
  exact global metrics, identical on every rank and equal to a single-process run;
- early stopping follows that global loss, agreed by a collective; rank 0 saves the
  best weights atomically, everyone waits at a barrier, then loads them.
"""
import json
import logging
import math
import os
import time

import numpy as np
import pandas as pd
import torch

from data_provider.data_factory import data_provider, prepared_data, window_for
from data_provider.timefeatures import freq_offset, future_dates, time_features
from exp.adaptation import load_pretrained
from exp.exp_basic import Exp_Basic
from utils import distributed, plots
from utils.arguments import MODEL_SHAPING_ARGS
from utils.checkpoint import load_weights, read_training_state, save_atomic, writable_dir_problem
from utils.errors import require
from utils.metrics import ErrorSums, batch_loss
from utils.progress import RESULT, EpochProgress, progress_mode
from utils.tools import (PER_STEP_SCHEDULES, EarlyStopping, learning_rate_for_epoch, one_cycle_learning_rate,
                         rng_state, seed_everything, set_learning_rate, set_rng_state)

logger = logging.getLogger("tsl")



class Exp_Forecast(Exp_Basic):
    # ------------------------------------------------------------ forward + slicing
    def _target_channels(self, tensor):
        """MS and --covariate score only the target, which the data puts last."""
        if self.args.features == "MS" or self.args.covariate:
            return tensor[..., -1:]
        return tensor

    def _on_device(self, batch):
        if batch[0].device == self.device:  # splits kept on the GPU, or CPU training
            return batch
        return tuple(None if t is None else t.to(self.device, non_blocking=True) for t in batch)

    def _used(self, name, tensor):
        """`tensor` if the model reads forward argument `name`, else None (see models.inputs_used)."""
        return tensor if name in self.args.model_inputs else None

    def _direct_forward(self, model, batch):
        x, y, x_mark, y_mark = self._on_device(batch)
        pred_len, label_len = self.args.pred_len, self.args.label_len
        dec_inp = None
        if "x_dec" in self.args.model_inputs:  # TSLib decoder input: the last label_len known steps, then zeros
            dec_inp = torch.cat([y[:, :label_len], torch.zeros_like(y[:, -pred_len:])], dim=1)
        out = model(x, self._used("x_mark_enc", x_mark), dec_inp, self._used("x_mark_dec", y_mark))
        if out.shape[1] != pred_len:  # even a no-op slice costs a zero-fill and copy in backward
            out = out[:, -pred_len:]
        return self._target_channels(out), self._target_channels(y[:, -pred_len:])

    def _token_forward(self, model, batch, stage):
        """Every input token predicts the next output_token_len steps; score them all,
        or only the last token with --last_token (always) / --valid_last (validation)."""
        x, y, x_mark, _ = self._on_device(batch)
        token, out_len = self.args.input_token_len, self.args.output_token_len
        out = model(x, self._used("x_mark_enc", x_mark), None, None)
        batch_size, n_tokens = x.shape[0], x.shape[1] // token
        pred = out.reshape(batch_size, n_tokens, out_len, -1)
        true = y.unfold(1, out_len, token).permute(0, 1, 3, 2)  # [B, N, out_len, C]
        if self.args.last_token or (stage == "val" and self.args.valid_last):
            pred, true = pred[:, -1:], true[:, -1:]
        return self._target_channels(pred), self._target_channels(true)

    def _rollout(self, model, batch):
        """Autoregressive test: feed predictions back until test_pred_len steps exist."""
        x, y, x_mark, y_mark = self._on_device(batch)
        out_len, horizon, history = self.args.output_token_len, self.args.test_pred_len, x.shape[1]
        steps = math.ceil(horizon / out_len)
        marks = None
        if "x_mark_enc" in self.args.model_inputs:
            marks = torch.cat([x_mark, y_mark], dim=1)
            missing = history + steps * out_len - marks.shape[1]
            if missing > 0:  # the last partial step reads calendar features past the target
                marks = torch.cat([marks, marks[:, -1:].expand(-1, missing, -1)], dim=1)
        preds = []
        for step in range(steps):
            window_marks = None if marks is None else marks[:, step * out_len: step * out_len + history]
            nxt = model(x, window_marks, None, None)[:, -out_len:]
            preds.append(nxt)
            x = torch.cat([x[:, out_len:], nxt], dim=1)
        pred = torch.cat(preds, dim=1)[:, :horizon]
        return self._target_channels(pred), self._target_channels(y)

    def _forward(self, model, batch, stage):
        """(prediction, truth) for the elements that are scored at `stage`."""
        if not self.args.autoregressive:
            return self._direct_forward(model, batch)
        if stage == "test":
            return self._rollout(model, batch)
        return self._token_forward(model, batch, stage)

    # ------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, loader, stage, original=None, keep_windows=False):
        """Global ErrorSums over every window of the loader's split, on every rank; `original`
        (an ErrorSums), if given, also sums the errors on the data's original scale;
        `keep_windows` keeps each window's errors too (ErrorSums.window_errors)."""
        model = self.raw_model  # no DDP wrapper: no collective can run inside this loop
        was_training = model.training
        model.eval()
        sums = ErrorSums(keep_windows)
        for batch in loader:
            with self.autocast():
                pred, true = self._forward(model, batch, stage)
            sums.update(pred, true)
            if original is not None:
                original.update(self._to_original(pred), self._to_original(true))
        model.train(was_training)
        if original is not None:
            original.all_reduce()
        return sums.all_reduce()

    def _loss_of(self, sums):
        return sums.metrics()["mse" if self.args.loss == "MSE" else "mae"]

    def vali(self, vali_loader, stage="val"):
        """Exact global validation loss (same value on every rank, for any world size)."""
        return self._loss_of(self.evaluate(vali_loader, stage))

    # ------------------------------------------------------------ training
    def _checkpoint_path(self, setting, name="checkpoint.pth"):
        return os.path.join(self.args.checkpoints, setting, name)

    def _require_writable(self, *options):
        """Fail before any work if rank 0 cannot write where it will have to."""
        problems = [writable_dir_problem(getattr(self.args, o), f"--{o}") for o in options] if distributed.is_main() else []
        problem = distributed.broadcast_object(next((p for p in problems if p), None))
        require(problem is None, problem)

    def _save_best(self, path):
        if distributed.is_main():
            save_atomic(self.raw_model.state_dict(), path)
        distributed.barrier()  # nobody reads the file before it is complete

    def _save_training_state(self, path, optimizer, stopper, epoch, step, history, stopped):
        """last.pth: everything needed to continue exactly where this epoch ended."""
        rng = distributed.gather_objects(rng_state())  # collective: every rank's generators
        optimizer_state = distributed.optimizer_state_dict(optimizer)  # consolidated under --zero (a collective)
        if distributed.is_main():
            save_atomic({
                "model": self.raw_model.state_dict(),
                "optimizer": optimizer_state,
                "lr_schedule": {"lradj": self.args.lradj, "epoch": epoch},  # lr is a function of the epoch
                "early_stopping": stopper.state_dict(),
                "epoch": epoch,  # also the sampler epoch: set_epoch(epoch) reproduces the order
                "global_step": step,
                "stopped": stopped,
                "rng": rng,
                "model_args": {k: getattr(self.args, k) for k in MODEL_SHAPING_ARGS},
                "history": history,
            }, path)

    def _resume_path(self, setting):
        """last.pth to continue from, or None: --resume [PATH], or any torchrun restart."""
        resume = self.args.resume
        if resume is None and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0:
            resume = "auto"  # an elastic restart always continues the interrupted run
        if resume is None:
            return None
        if resume != "auto":
            return resume
        path = self._checkpoint_path(setting, "last.pth")
        if os.path.isfile(path):
            return path
        logger.info(f"--resume: no {path} yet, starting from epoch 1")
        return None

    def _load_training_state(self, path, optimizer, stopper):
        state = read_training_state(path, map_location=self.device)
        differing = [f"{k} (saved {state['model_args'].get(k)!r}, now {getattr(self.args, k)!r})"
                     for k in MODEL_SHAPING_ARGS if state["model_args"].get(k) != getattr(self.args, k)]
        require(not differing, f"cannot resume from {path}: it was trained with other model arguments: "
                + "; ".join(differing) + ". Use the same arguments, or another --checkpoints folder")
        self.raw_model.load_state_dict(state["model"], strict=True)
        distributed.load_optimizer_state(optimizer, state["optimizer"])  # full state: with or without --zero
        stopper.load_state_dict(state["early_stopping"])
        if len(state["rng"]) == distributed.world_size():
            set_rng_state(state["rng"][distributed.rank()])
        else:
            logger.warning(f"resuming on {distributed.world_size()} processes from a run on {len(state['rng'])}: "
                           "random streams are re-seeded, so results will differ from an uninterrupted run")
            seed_everything(self.args.seed + state["epoch"])
        logger.info(f"resumed from {path} after epoch {state['epoch']} (best vali {stopper.best_loss:.6f})")
        return state

    def train_step(self, micro_batches, optimizer):
        """One optimizer step over a group of micro-batches, equal to one step over all of them.

        Gradients add up over the group: each loss is divided by the group's size, and only
        the last backward all-reduces (DDP no_sync before it). Returns the group's
        element-weighted loss sum (a tensor: no host sync) and its number of scored elements.
        """
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        n_scored, last = 0, len(micro_batches) - 1
        for i, batch in enumerate(micro_batches):
            with distributed.no_sync(self.model, skip=i < last):
                with self.autocast():
                    pred, true = self._forward(self.model, batch, "train")
                    loss = batch_loss(pred.float(), true, self.args.loss)
                self.backward(loss / len(micro_batches) if len(micro_batches) > 1 else loss)
            loss_sum.add_(loss.detach(), alpha=pred.numel())
            n_scored += pred.numel()
        self.optimizer_step(optimizer)
        return loss_sum, n_scored

    def _train_epoch(self, loader, optimizer, epoch=0, first_step=0):
        """One pass over this rank's shard; returns (global mean train loss, optimizer steps, samples/s)."""
        self.model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        n_scored = steps = 0
        accumulation = self.args.accumulation_steps
        steps_per_epoch = -(-len(loader) // accumulation)
        progress = EpochProgress(epoch, steps_per_epoch, progress_mode(self.args.quiet))
        per_step_lr = self.args.lradj in PER_STEP_SCHEDULES
        for group in _groups(loader, accumulation):  # the last group may be short
            if per_step_lr:
                set_learning_rate(optimizer, one_cycle_learning_rate(
                    self.args.scaled_learning_rate, first_step + steps, steps_per_epoch * self.args.train_epochs))
            group_loss, group_scored = self.train_step(group, optimizer)
            loss_sum += group_loss
            n_scored += group_scored
            steps += 1
            progress.update(group_loss, group_scored, sum(batch[0].shape[0] for batch in group))
        progress.close()
        total, count = distributed.all_reduce_sum([loss_sum.item(), n_scored])
        return total / count, steps, progress.samples_per_second * distributed.world_size()

    def _log_optimizer_state_bytes(self, optimizer):
        """Every rank's optimizer-state bytes (halved per rank by --zero on 2 ranks), logged."""
        per_rank = distributed.gather_objects(distributed.optimizer_state_bytes(optimizer))
        logger.info("optimizer state per rank: " + ", ".join(f"{b / 2**20:.2f} MiB" for b in per_rank)
                    + (" (sharded, --zero)" if self.args.zero and len(per_rank) > 1 else ""))
        return per_rank

    def train(self, setting):
        args = self.args
        self._require_writable("checkpoints", "results_dir")
        if args.adaptation:  # start from pre-trained weights; a resumed state below still overrides them
            load_pretrained(self.raw_model, args.pretrain_model_path, self.device)
        _, train_loader = data_provider(args, "train", self.device)
        _, vali_loader = data_provider(args, "val", self.device)
        _, test_loader = data_provider(args, "test", self.device)
        best_path, last_path = self._checkpoint_path(setting), self._checkpoint_path(setting, "last.pth")
        optimizer = self.make_optimizer()
        stopper = EarlyStopping(args.patience)
        history, step, stopped, first_epoch = [], 0, False, 1
        resume_path = self._resume_path(setting)
        distributed.require_same(bool(resume_path) and os.path.isfile(resume_path),
                                 f"the nodes disagree on the training state to resume (rank 0: {resume_path}): a "
                                 "multi-node run resumes and restarts from --checkpoints, so put it on storage every "
                                 "node shares, or copy last.pth to every node")
        if resume_path:
            state = self._load_training_state(resume_path, optimizer, stopper)
            history, step, stopped, first_epoch = state["history"], state["global_step"], state["stopped"], state["epoch"] + 1
        world = distributed.world_size()
        few_shot = f" (--subset_rand_ratio {args.subset_rand_ratio})" if args.subset_rand_ratio < 1 else ""
        accumulation = f" x {args.accumulation_steps} accumulation steps" if args.accumulation_steps > 1 else ""
        scaling = (f" (--lr_scaling {args.lr_scaling}: {args.learning_rate:g} at batch {args.base_batch_size})"
                   if args.lr_scaling != "none" else "")
        logger.info(f"training {setting}: {len(train_loader.dataset)} train windows{few_shot}, global batch "
                    f"{args.global_batch_size} ({args.batch_size} x {world} processes{accumulation}), "
                    f"learning rate {args.scaled_learning_rate:g}{scaling}")
        state_bytes = None  # optimizer state per rank, measured once it exists (after the first epoch)
        for epoch in range(first_epoch, args.train_epochs + 1):
            if stopped:
                break
            started = time.time()
            lr = learning_rate_for_epoch(args, epoch)
            set_learning_rate(optimizer, lr)
            train_loader.set_epoch(epoch)
            train_loss, steps, samples_per_s = self._train_epoch(train_loader, optimizer, epoch, step)
            if args.lradj in PER_STEP_SCHEDULES:
                lr = optimizer.param_groups[0]["lr"]  # where the per-step schedule ended the epoch
            step += steps
            if state_bytes is None:
                state_bytes = self._log_optimizer_state_bytes(optimizer)
            vali_loss = self.vali(vali_loader, "val")
            test_loss = self._loss_of(self.evaluate(test_loader, "test"))
            require(math.isfinite(vali_loss), f"validation loss is {vali_loss} after epoch {epoch}: training diverged; "
                    "lower --learning_rate or check the data for extreme values")
            improved = stopper.step(vali_loss)
            if improved:
                self._save_best(best_path)
            # Every rank holds the same global vali_loss; the collective makes the
            # decision shared by construction, so no rank can leave the loop alone.
            stopped = distributed.any_rank(stopper.should_stop)
            history.append({"epoch": epoch, "train_loss": train_loss, "vali_loss": vali_loss, "test_loss": test_loss,
                            "lr": lr, "seconds": time.time() - started})
            self._save_training_state(last_path, optimizer, stopper, epoch, step, history, stopped)
            logger.info(f"epoch {epoch}/{args.train_epochs}: train {train_loss:.6f} vali {vali_loss:.6f} "
                        f"test {test_loss:.6f} lr {lr:.3g} {history[-1]['seconds']:.2f}s "
                        f"{samples_per_s:.0f} samples/s, best vali {stopper.best_loss:.6f}"
                        + (" *best*" if improved else f" (no improvement {stopper.counter}/{args.patience})"))
            if stopped:
                logger.info(f"early stopping after epoch {epoch}")
        if state_bytes is None:  # resumed after the last epoch: the loaded state
            state_bytes = self._log_optimizer_state_bytes(optimizer)
        # rank 0 reads, everyone gets its weights: other nodes need not see its disk
        distributed.load_on_main(self.raw_model, load_weights, best_path, map_location=self.device)
        self._draw_training(setting, history)
        return {"history": history, "stopped_epoch": history[-1]["epoch"], "best_vali_loss": stopper.best_loss,
                "checkpoint": best_path, "train_windows": len(train_loader.dataset),
                "optimizer_state_bytes": state_bytes}

    # ------------------------------------------------------------ testing
    def test(self, setting, checkpoint=None):
        """Test metrics of the current weights, or of `checkpoint` if given; runs under DDP too."""
        if checkpoint:
            self._require_writable("results_dir")
            distributed.load_on_main(self.raw_model, load_weights, checkpoint, map_location=self.device)
        _, vali_loader = data_provider(self.args, "val", self.device)
        _, test_loader = data_provider(self.args, "test", self.device)
        vali_loss = self.vali(vali_loader, "val")
        # --inverse on data without one scaler fails here, on every rank alike (before any collective)
        original = ErrorSums() if self.args.inverse and self._require_one_scaler() else None
        sums = self.evaluate(test_loader, "test", original, keep_windows=True)
        self._save_window_errors(setting, sums.window_errors())
        metrics = sums.metrics()
        orig_line = ""
        if original is not None:
            metrics.update({f"{k}_orig": v for k, v in original.metrics().items()})
            orig_line = f"; original scale: mse {metrics['mse_orig']:.6g} mae {metrics['mae_orig']:.6g}"
        metrics["vali_loss"] = vali_loss
        metrics["test_windows"] = len(test_loader.dataset)
        logger.log(RESULT, f"test {setting}: mse {metrics['mse']:.6f} mae {metrics['mae']:.6f} rmse {metrics['rmse']:.6f} "
                    f"mape {metrics['mape']:.6f} mspe {metrics['mspe']:.6f}{orig_line} (vali {vali_loss:.6f}, "
                    f"{metrics['test_windows']} windows, {distributed.world_size()} processes)")
        self._draw_forecasts(setting)
        return metrics

    # ------------------------------------------------------------ results
    def save_results(self, setting, metrics, training=None):
        """Rank 0 writes <results_dir>/<setting>/metrics.json and appends to results.jsonl."""
        if not distributed.is_main():
            return None
        record = {"setting": setting, "model": self.args.model, "data": self.args.data,
                  "pred_len": self.args.pred_len, "seed": self.args.seed,
                  "world_size": distributed.world_size(), **{k: metrics[k] for k in metrics}}
        if training:
            record.update(stopped_epoch=training["stopped_epoch"], history=training["history"],
                          train_windows=training["train_windows"],  # after --subset_rand_ratio
                          optimizer_state_bytes=training["optimizer_state_bytes"])  # per rank
        record["args"] = {k: v for k, v in vars(self.args).items() if _jsonable(v)}
        folder = os.path.join(self.args.results_dir, setting)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, ".metrics.json.tmp")
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
        os.replace(tmp, os.path.join(folder, "metrics.json"))
        with open(os.path.join(self.args.results_dir, "results.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        return record

    def _save_window_errors(self, setting, errors):
        """<results_dir>/<setting>/window_errors.csv (rank 0): each test window's MSE and MAE, in
        test order, so metrics over any subset of windows (e.g. what a loader with drop_last=True
        would have scored: benchmarks/drop_last_effect.py) need no second evaluation."""
        if not distributed.is_main():
            return
        path = self._output_path(setting, "window_errors.csv")
        rows = np.column_stack([np.arange(len(errors)), errors.numpy()])
        np.savetxt(path + ".tmp", rows, fmt=["%d", "%.9g", "%.9g"], delimiter=",", header="window,mse,mae", comments="")
        os.replace(path + ".tmp", path)

    # ------------------------------------------------------------ original scale, pictures, real forecasts
    def _require_one_scaler(self):
        """True, or a UserError when the data has no single scaler to undo (raised alike on every rank)."""
        require(not prepared_data(self.args).per_series_scaling,
                f"--inverse and --do_predict need one scaled data set; --data {self.args.data} scales every "
                "series on its own, so its forecasts have no single original scale")
        return True

    def _to_original(self, tensor):
        """The scored channels (the data's last tensor.shape[-1]: all for M, the target for
        S / MS / --covariate) on the data's original scale, in float32."""
        if getattr(self, "_original_stats", None) is None:
            self._original_stats = {}
        if tensor.device not in self._original_stats:  # built once per device: no copy per batch
            scaler = prepared_data(self.args).scaler
            self._original_stats[tensor.device] = tuple(
                torch.as_tensor(v, dtype=torch.float32, device=tensor.device)
                for v in (scaler.mean_, scaler.scale_)) if self.args.scale else None
        stats, tensor = self._original_stats[tensor.device], tensor.float()
        if stats is None:  # --scale false: the data was never scaled
            return tensor
        k = tensor.shape[-1]
        return tensor * stats[1][-k:] + stats[0][-k:]

    def _output_path(self, setting, name):
        folder = os.path.join(self.args.results_dir, setting)
        os.makedirs(folder, exist_ok=True)
        return os.path.join(folder, name)

    def _data_label(self):
        return os.path.basename(self.args.data_path) if self.args.data == "custom" else self.args.data

    def _draw_training(self, setting, history):
        """training_curves.png: losses per epoch and the learning rate (rank 0)."""
        if self.args.no_plots or not distributed.is_main() or not history:
            return
        path = plots.plot_training(self._output_path(setting, "training_curves.png"), history,
                                   f"{self.args.model} on {self._data_label()}\n{setting}")
        logger.info(f"training curves: {path}")

    @torch.no_grad()
    def _draw_forecasts(self, setting, n_windows=4):
        """forecast.png: evenly spaced test windows of the target (last) channel. Rank 0 runs
        the raw model on them alone: no collective, and the metrics are already computed."""
        if self.args.no_plots or not distributed.is_main():
            return
        data = prepared_data(self.args)
        dataset, _ = data_provider(self.args, "test")
        picks = sorted({round(i * (len(dataset) - 1) / max(n_windows - 1, 1)) for i in range(n_windows)})
        batch = dataset.__getitems__(picks)
        was_training = self.raw_model.training
        self.raw_model.eval()
        with self.autocast():
            pred, true = self._forward(self.raw_model, batch, "test")
        self.raw_model.train(was_training)
        original = not data.per_series_scaling  # one scaler to undo (not --data univariate)
        convert = self._to_original if original else (lambda t: t.float())
        history, true, pred = (convert(t[..., -1:])[..., 0].cpu().tolist()
                               for t in (batch[0], true, pred))
        x_len = batch[0].shape[1]
        first = data.split_rows("test", x_len)[0] if hasattr(data, "split_rows") else None
        windows = []
        for i, pick in enumerate(picks):
            label = f"test window {pick + 1} of {len(dataset)}"
            if first is not None and getattr(data, "dates", None) is not None:
                label += f", forecast from {data.dates.iloc[first + pick + x_len]:%Y-%m-%d %H:%M}"
            windows.append({"history": history[i], "truth": true[i], "forecast": pred[i], "label": label})
        target = data.columns[-1]
        path = plots.plot_forecasts(
            self._output_path(setting, "forecast.png"), windows,
            f"{self.args.model} on {self._data_label()}: target {target}, input {x_len}, horizon {len(true[0])}",
            f"{target} ({'original scale' if original else 'scaled'})")
        logger.info(f"forecast picture: {path}")

    @torch.no_grad()
    def predict(self, setting):
        """forecast.csv: the horizon after the data file's last row, forecast from its last input
        rows (token models roll out), on the original scale; dated data continues its dates
        at --freq, undated data counts steps 1..horizon. Rank 0 writes it."""
        args = self.args
        self._require_one_scaler()
        if not distributed.is_main():
            return None
        data = prepared_data(args)
        window = window_for(args, "test")
        horizon = window.y_offset + window.y_len - window.x_len  # rows past the end: pred_len / test_pred_len
        require(len(data.values) >= window.x_len,
                f"--do_predict needs the last {window.x_len} rows as input; the data has {len(data.values)}")
        if data.dates is not None:
            last = data.dates.iloc[-1]
            index = future_dates(last, args.freq, horizon)
            if len(data.dates) > 1 and data.dates.iloc[-2] != last - freq_offset(args.freq):
                logger.warning(f"warning: the data's last two dates are {data.dates.iloc[-2]} and {last}, which is not "
                               f"one --freq {args.freq} step; forecast.csv continues at --freq {args.freq} anyway")
            future_marks = time_features(index, args.freq, args.embed)
        else:
            last, index = None, pd.RangeIndex(1, horizon + 1, name="step")
            future_marks = np.zeros((horizon, data.marks.shape[1]), dtype=np.float32)
        # The last input rows, then the future (values unknown: zeros, as TSLib's decoder input).
        values = np.concatenate([data.values[-window.x_len:], np.zeros((horizon, data.values.shape[1]), np.float32)])
        marks = np.concatenate([data.marks[-window.x_len:], future_marks.astype(np.float32)])

        def rows(array, start, length):
            return torch.from_numpy(np.ascontiguousarray(array[start:start + length]))[None]

        batch = (rows(values, 0, window.x_len), rows(values, window.y_offset, window.y_len),
                 rows(marks, 0, window.x_len), rows(marks, window.y_offset, window.y_len))
        was_training = self.raw_model.training
        self.raw_model.eval()
        with self.autocast():
            pred, _ = self._forward(self.raw_model, batch, "test")
        self.raw_model.train(was_training)
        forecast = self._to_original(pred)[0, -horizon:].cpu().double().numpy()
        frame = pd.DataFrame(forecast, columns=data.columns[-forecast.shape[1]:])
        frame.insert(0, "date" if last is not None else "step", index)
        path = self._output_path(setting, "forecast.csv")
        tmp = path + ".tmp"
        frame.to_csv(tmp, index=False, float_format="%.8g")
        os.replace(tmp, path)
        after = f"{last}" if last is not None else f"row {len(data.values)}"
        logger.info(f"forecast of the {horizon} steps after {after} ({', '.join(frame.columns[1:])}, original scale): {path}")
        return frame


def _groups(batches, size):
    """Consecutive lists of `size` batches; the last list may be shorter."""
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def _jsonable(value):
    return isinstance(value, (str, int, float, bool, type(None), list, tuple))
