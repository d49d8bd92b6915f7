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
from utils.checkpoint import load_weights, save_atomic
from utils.errors import require
from utils.metrics import ErrorSums, batch_loss
from utils.tools import EarlyStopping, learning_rate_for_epoch, set_learning_rate

logger = logging.getLogger("tsl")


class Exp_Forecast(Exp_Basic):
    # ------------------------------------------------------------ forward + slicing
    def _target_channels(self, tensor):
        """MS and --covariate score only the target, which the data puts last."""
        if self.args.features == "MS" or self.args.covariate:
            return tensor[..., -1:]
        return tensor

    def _direct_forward(self, model, batch):
        x, y, x_mark, y_mark = (t.to(self.device, non_blocking=True) for t in batch)
        pred_len, label_len = self.args.pred_len, self.args.label_len
        # TSLib decoder input: the last label_len known steps, then zeros for the horizon.
        dec_inp = torch.cat([y[:, :label_len], torch.zeros_like(y[:, -pred_len:])], dim=1)
        out = model(x, x_mark, dec_inp, y_mark)
        return self._target_channels(out[:, -pred_len:]), self._target_channels(y[:, -pred_len:])

    def _token_forward(self, model, batch, stage):
        """Every input token predicts the next output_token_len steps; score them all,
        or only the last token with --last_token (always) / --valid_last (validation)."""
        x, y, x_mark, _ = (t.to(self.device, non_blocking=True) for t in batch)
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
        x, y, x_mark, y_mark = (t.to(self.device, non_blocking=True) for t in batch)
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
    def _checkpoint_path(self, setting):
        return os.path.join(self.args.checkpoints, setting, "checkpoint.pth")

    def _save_best(self, path):
        if distributed.is_main():
            save_atomic(self.raw_model.state_dict(), path)
        distributed.barrier()  # nobody reads the file before it is complete

    def train(self, setting):
        args = self.args
        _, train_loader = data_provider(args, "train")
        _, vali_loader = data_provider(args, "val")
        _, test_loader = data_provider(args, "test")
        path = self._checkpoint_path(setting)
        optimizer = torch.optim.Adam(self.model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
        stopper = EarlyStopping(args.patience)
        history = []
        world = distributed.world_size()
        logger.info(f"training {setting}: {len(train_loader.dataset)} train windows, global batch "
                    f"{args.batch_size * world} ({args.batch_size} x {world} processes)")
        for epoch in range(1, args.train_epochs + 1):
            started = time.time()
            lr = learning_rate_for_epoch(args, epoch)
            set_learning_rate(optimizer, lr)
            train_loader.batch_sampler.sampler.set_epoch(epoch)
            self.model.train()
            loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
            n_scored = 0
            for batch in train_loader:
                optimizer.zero_grad(set_to_none=True)
                pred, true = self._forward(self.model, batch, "train")
                loss = batch_loss(pred, true, args.loss)
                loss.backward()
                optimizer.step()
                loss_sum += loss.detach().double() * pred.numel()  # no host sync per step
                n_scored += pred.numel()
            train_loss = distributed.all_reduce_sum([loss_sum.item(), n_scored])
            train_loss = train_loss[0] / train_loss[1]
            vali_loss = self.vali(vali_loader, "val")
            test_loss = self._loss_of(self.evaluate(test_loader, "test"))
            require(math.isfinite(vali_loss), f"validation loss is {vali_loss} after epoch {epoch}: training diverged; "
                    "lower --learning_rate or check the data for extreme values")
            improved = stopper.step(vali_loss)
            if improved:
                self._save_best(path)
            # Every rank holds the same global vali_loss; the collective makes the
            # decision shared by construction, so no rank can leave the loop alone.
            stop = distributed.any_rank(stopper.should_stop)
            record = {"epoch": epoch, "train_loss": train_loss, "vali_loss": vali_loss, "test_loss": test_loss,
                      "lr": lr, "seconds": time.time() - started}
            history.append(record)
            logger.info(f"epoch {epoch}: train {train_loss:.6f} vali {vali_loss:.6f} test {test_loss:.6f} "
                        f"lr {lr:.3g} {record['seconds']:.2f}s" + (" *best*" if improved else
                        f" (no improvement {stopper.counter}/{args.patience})"))
            if stop:
                logger.info(f"early stopping after epoch {epoch}")
                break
        load_weights(self.raw_model, path, map_location=self.device)
        return {"history": history, "stopped_epoch": history[-1]["epoch"], "best_vali_loss": stopper.best_loss,
                "checkpoint": path}

    # ------------------------------------------------------------ testing
    def test(self, setting, checkpoint=None):
        """Test metrics of the current weights, or of `checkpoint` if given; runs under DDP too."""
        if checkpoint:
            load_weights(self.raw_model, checkpoint, map_location=self.device)
        _, vali_loader = data_provider(self.args, "val")
        _, test_loader = data_provider(self.args, "test")
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
