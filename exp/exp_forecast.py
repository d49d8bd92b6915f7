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

import torch

from data_provider.data_factory import data_provider
from exp.exp_basic import Exp_Basic
from utils import distributed
from utils.checkpoint import load_weights, read_training_state, save_atomic, writable_dir_problem
from utils.errors import require
from utils.metrics import ErrorSums, batch_loss
from utils.tools import (EarlyStopping, learning_rate_for_epoch, rng_state, seed_everything, set_learning_rate,
                         set_rng_state)

logger = logging.getLogger("tsl")

# Arguments that decide the model's shape and meaning: a resumed run must match them.
MODEL_SHAPING_ARGS = ("model", "features", "seq_len", "label_len", "pred_len", "enc_in", "dec_in", "c_out",
                      "d_model", "n_heads", "e_layers", "d_layers", "d_ff", "moving_avg", "activation", "use_norm",
                      "individual", "input_token_len", "output_token_len", "covariate", "mark_dim", "factor",
                      "patch_len", "stride", "top_k", "num_kernels", "channel_independence", "decomp_method",
                      "down_sampling_layers", "down_sampling_window", "down_sampling_method")


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
        return tuple(t.to(self.device, non_blocking=True) for t in batch)

    def _direct_forward(self, model, batch):
        x, y, x_mark, y_mark = self._on_device(batch)
        pred_len, label_len = self.args.pred_len, self.args.label_len
        # TSLib decoder input: the last label_len known steps, then zeros for the horizon.
        dec_inp = torch.cat([y[:, :label_len], torch.zeros_like(y[:, -pred_len:])], dim=1)
        out = model(x, x_mark, dec_inp, y_mark)
        if out.shape[1] != pred_len:  # even a no-op slice costs a zero-fill and copy in backward
            out = out[:, -pred_len:]
        return self._target_channels(out), self._target_channels(y[:, -pred_len:])

    def _token_forward(self, model, batch, stage):
        """Every input token predicts the next output_token_len steps; score them all,
        or only the last token with --last_token (always) / --valid_last (validation)."""
        x, y, x_mark, _ = self._on_device(batch)
        token, out_len = self.args.input_token_len, self.args.output_token_len
        out = model(x, x_mark, None, None)
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
        marks = torch.cat([x_mark, y_mark], dim=1)
        missing = history + steps * out_len - marks.shape[1]
        if missing > 0:  # the last partial step reads calendar features past the target
            marks = torch.cat([marks, marks[:, -1:].expand(-1, missing, -1)], dim=1)
        preds = []
        for step in range(steps):
            window_marks = marks[:, step * out_len: step * out_len + history]
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
    def evaluate(self, loader, stage):
        """Global ErrorSums over every window of the loader's split, on every rank."""
        model = self.raw_model  # no DDP wrapper: no collective can run inside this loop
        was_training = model.training
        model.eval()
        sums = ErrorSums()
        for batch in loader:
            with self.autocast():
                pred, true = self._forward(model, batch, stage)
            sums.update(pred, true)
        model.train(was_training)
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
        if distributed.is_main():
            save_atomic({
                "model": self.raw_model.state_dict(),
                "optimizer": optimizer.state_dict(),
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
        optimizer.load_state_dict(state["optimizer"])
        stopper.load_state_dict(state["early_stopping"])
        if len(state["rng"]) == distributed.world_size():
            set_rng_state(state["rng"][distributed.rank()])
        else:
            logger.warning(f"resuming on {distributed.world_size()} processes from a run on {len(state['rng'])}: "
                           "random streams are re-seeded, so results will differ from an uninterrupted run")
            seed_everything(self.args.seed + state["epoch"])
        logger.info(f"resumed from {path} after epoch {state['epoch']} (best vali {stopper.best_loss:.6f})")
        return state

    def _train_epoch(self, loader, optimizer):
        """One pass over this rank's shard; returns (global mean train loss, steps)."""
        self.model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        n_scored = steps = 0
        for batch in loader:
            optimizer.zero_grad(set_to_none=True)
            with self.autocast():
                pred, true = self._forward(self.model, batch, "train")
                loss = batch_loss(pred.float(), true, self.args.loss)
            self.backward_and_step(loss, optimizer)
            loss_sum.add_(loss.detach(), alpha=pred.numel())  # no host sync per step
            n_scored += pred.numel()
            steps += 1
        total, count = distributed.all_reduce_sum([loss_sum.item(), n_scored])
        return total / count, steps

    def train(self, setting):
        args = self.args
        self._require_writable("checkpoints", "results_dir")
        _, train_loader = data_provider(args, "train", self.device)
        _, vali_loader = data_provider(args, "val", self.device)
        _, test_loader = data_provider(args, "test", self.device)
        best_path, last_path = self._checkpoint_path(setting), self._checkpoint_path(setting, "last.pth")
        optimizer = self.make_optimizer()
        stopper = EarlyStopping(args.patience)
        history, step, stopped, first_epoch = [], 0, False, 1
        resume_path = self._resume_path(setting)
        if resume_path:
            state = self._load_training_state(resume_path, optimizer, stopper)
            history, step, stopped, first_epoch = state["history"], state["global_step"], state["stopped"], state["epoch"] + 1
        world = distributed.world_size()
        logger.info(f"training {setting}: {len(train_loader.dataset)} train windows, global batch "
                    f"{args.batch_size * world} ({args.batch_size} x {world} processes)")
        for epoch in range(first_epoch, args.train_epochs + 1):
            if stopped:
                break
            started = time.time()
            lr = learning_rate_for_epoch(args, epoch)
            set_learning_rate(optimizer, lr)
            train_loader.set_epoch(epoch)
            train_loss, steps = self._train_epoch(train_loader, optimizer)
            step += steps
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
            logger.info(f"epoch {epoch}: train {train_loss:.6f} vali {vali_loss:.6f} test {test_loss:.6f} "
                        f"lr {lr:.3g} {history[-1]['seconds']:.2f}s" + (" *best*" if improved else
                        f" (no improvement {stopper.counter}/{args.patience})"))
            if stopped:
                logger.info(f"early stopping after epoch {epoch}")
        load_weights(self.raw_model, best_path, map_location=self.device)
        return {"history": history, "stopped_epoch": history[-1]["epoch"], "best_vali_loss": stopper.best_loss,
                "checkpoint": best_path}

    # ------------------------------------------------------------ testing
    def test(self, setting, checkpoint=None):
        """Test metrics of the current weights, or of `checkpoint` if given; runs under DDP too."""
        if checkpoint:
            self._require_writable("results_dir")
            load_weights(self.raw_model, checkpoint, map_location=self.device)
        _, vali_loader = data_provider(self.args, "val", self.device)
        _, test_loader = data_provider(self.args, "test", self.device)
        vali_loss = self.vali(vali_loader, "val")
        sums = self.evaluate(test_loader, "test")
        metrics = sums.metrics()
        metrics["vali_loss"] = vali_loss
        metrics["test_windows"] = len(test_loader.dataset)
        logger.info(f"test {setting}: mse {metrics['mse']:.6f} mae {metrics['mae']:.6f} rmse {metrics['rmse']:.6f} "
                    f"mape {metrics['mape']:.6f} mspe {metrics['mspe']:.6f} (vali {vali_loss:.6f}, "
                    f"{metrics['test_windows']} windows, {distributed.world_size()} processes)")
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
            record.update(stopped_epoch=training["stopped_epoch"], history=training["history"])
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


def _jsonable(value):
    return isinstance(value, (str, int, float, bool, type(None), list, tuple))
