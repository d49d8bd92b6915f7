"""What a run leaves under <results_dir>/<setting>/, written by rank 0 through utils.files.atomic_write:
metrics.json (and its line in <results_dir>/results.jsonl), window_errors.csv, training_curves.png,
forecast.png and, with --do_predict, forecast.csv."""
import json
import logging
import os

import numpy as np
import pandas as pd
import torch

from data_provider.data_factory import data_provider, prepared_data, window_for
from exp.forward import forward, on_device
from utils import distributed, plots
from utils.errors import require
from utils.files import atomic_write
from utils.tools import eval_mode

logger = logging.getLogger("tsl")


class OriginalScale:
    """Scaled tensors back on the data's original scale, in float32: the scored channels are
    the data's last tensor.shape[-1] (all for M, the target for S / MS / --covariate)."""

    def __init__(self, scaler, device):
        # None: the data was never scaled (--scale false), or scaled per series (its tensors stay as they are)
        self.stats = None if scaler is None else tuple(
            torch.as_tensor(v, dtype=torch.float32, device=device) for v in (scaler.mean_, scaler.scale_))

    def __call__(self, tensor):
        tensor = tensor.float()
        if self.stats is None:
            return tensor
        mean, scale = self.stats
        k = tensor.shape[-1]
        return tensor * scale[-k:] + mean[-k:]


def require_one_scale(data, args):
    """--inverse and --do_predict: the data must have one original scale (raised alike on every rank)."""
    require(not data.per_series_scaling,
            f"--inverse and --do_predict need one scaled data set; --data {args.data} scales every "
            "series on its own, so its forecasts have no single original scale")


def output_path(args, setting, name):
    return os.path.join(args.results_dir, setting, name)


def save_results(args, setting, metrics, training=None):
    """Rank 0 writes <results_dir>/<setting>/metrics.json and appends its line to results.jsonl."""
    if not distributed.is_main():
        return None
    record = {"setting": setting, "model": args.model, "data": args.data, "pred_len": args.pred_len,
              "seed": args.seed, "world_size": distributed.world_size(), **metrics}
    if training:
        record.update(stopped_epoch=training["stopped_epoch"], history=training["history"],
                      train_windows=training["train_windows"],  # after --subset_rand_ratio
                      optimizer_state_bytes=training["optimizer_state_bytes"])  # per rank
    record["args"] = {k: v for k, v in vars(args).items() if _jsonable(v)}
    atomic_write(output_path(args, setting, "metrics.json"), lambda f: json.dump(record, f, indent=2), binary=False)
    with open(os.path.join(args.results_dir, "results.jsonl"), "a") as f:  # an append: earlier runs stay
        f.write(json.dumps(record) + "\n")
    return record


def save_window_errors(args, setting, errors):
    """window_errors.csv (rank 0): each test window's MSE and MAE, in test order, so metrics over
    any subset of windows (e.g. what a loader with drop_last=True would have scored:
    benchmarks/drop_last_effect.py) need no second evaluation."""
    if not distributed.is_main():
        return
    rows = np.column_stack([np.arange(len(errors)), errors.numpy()])
    atomic_write(output_path(args, setting, "window_errors.csv"), lambda f: np.savetxt(
        f, rows, fmt=["%d", "%.9g", "%.9g"], delimiter=",", header="window,mse,mae", comments=""), binary=False)


def draw_training(args, setting, history):
    """training_curves.png: losses per epoch and the learning rate (rank 0)."""
    if args.no_plots or not distributed.is_main() or not history:
        return
    path = plots.plot_training(output_path(args, setting, "training_curves.png"), history,
                               f"{args.model} on {_data_label(args)}\n{setting}")
    logger.info(f"training curves: {path}")


def draw_forecasts(exp, setting, n_windows=4):
    """forecast.png: evenly spaced test windows of the target (last) channel. Rank 0 runs the
    experiment's raw model on them alone: no collective, and the metrics are already computed."""
    args = exp.args
    if args.no_plots or not distributed.is_main():
        return
    data = prepared_data(args)
    dataset, _ = data_provider(args, "test")
    picks = sorted({round(i * (len(dataset) - 1) / max(n_windows - 1, 1)) for i in range(n_windows)})
    batch = on_device(dataset.__getitems__(picks), exp.device)
    pred, true = _forecast(exp, batch)
    to_original = OriginalScale(data.scaler, exp.device)
    history, true, pred = (to_original(t[..., -1:])[..., 0].cpu().tolist() for t in (batch[0], true, pred))
    window = window_for(args, "test")
    windows = []
    for i, pick in enumerate(picks):
        label = f"test window {pick + 1} of {len(dataset)}"
        date = data.forecast_date("test", window, pick)
        if date is not None:
            label += f", forecast from {date:%Y-%m-%d %H:%M}"
        windows.append({"history": history[i], "truth": true[i], "forecast": pred[i], "label": label})
    target = data.columns[-1]
    path = plots.plot_forecasts(
        output_path(args, setting, "forecast.png"), windows,
        f"{args.model} on {_data_label(args)}: target {target}, input {window.x_len}, horizon {len(true[0])}",
        f"{target} ({'scaled' if data.per_series_scaling else 'original scale'})")
    logger.info(f"forecast picture: {path}")


def predict(exp, setting):
    """forecast.csv: the horizon after the data's last row, forecast from its last input rows
    (token models roll out), on the original scale; dated data continues its dates at --freq,
    undated data counts steps 1..horizon. Rank 0 writes it and returns it as a DataFrame."""
    args = exp.args
    data = prepared_data(args)
    require_one_scale(data, args)
    if not distributed.is_main():
        return None
    dataset, index, last_row = data.future_input(window_for(args, "test"), args.freq, args.embed)
    pred, _ = _forecast(exp, dataset.__getitems__([0]))
    forecast = OriginalScale(data.scaler, exp.device)(pred)[0, -len(index):].cpu().double().numpy()
    frame = pd.DataFrame(forecast, columns=data.columns[-forecast.shape[1]:])
    frame.insert(0, index.name, index)
    path = atomic_write(output_path(args, setting, "forecast.csv"),
                        lambda f: frame.to_csv(f, index=False, float_format="%.8g"), binary=False)
    logger.info(f"forecast of the {len(index)} steps after {last_row} ({', '.join(frame.columns[1:])}, "
                f"original scale): {path}")
    return frame


@torch.no_grad()
def _forecast(exp, batch):
    """(prediction, truth) of the experiment's raw model at test time, in eval mode."""
    with eval_mode(exp.raw_model), exp.autocast():
        return forward(exp.raw_model, batch, exp.args, "test", exp.device)


def _data_label(args):
    return os.path.basename(args.data_path) if args.data == "custom" else args.data


def _jsonable(value):
    return isinstance(value, (str, int, float, bool, type(None), list, tuple))
