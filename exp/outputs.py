"""What a run leaves under <results_dir>/<setting>/, written by rank 0 through utils.files.atomic_write:
metrics.json (and its line in <results_dir>/results.jsonl), window_errors.csv, training_curves.png,
forecast.png and, with --do_predict, forecast.csv."""
import json
import logging
import math
import os
import time

import numpy as np
import pandas as pd
import torch

from data_provider.data_factory import data_provider, prepared_data, split_numbering, window_for
from data_provider.m4 import M4
from exp.forward import forward, on_device
from exp.scoring import some, zero_scales
from exp.settings import Run
from exp.steps import tensorboard_problem
from utils import ddp, distributed, m4, plots
from utils.checkpoint import checkpoint_path, loaded_weights, require_writable, writable_dir_problem
from utils.errors import require
from utils.files import append_line, atomic_write, remove_stale_temporaries
from utils.metrics import COVERAGE_INTERVALS, ErrorSums, seasonality
from utils.probabilistic import window_keys
from utils.tools import eval_mode

logger = logging.getLogger("tsl")


class OriginalScale:
    """Scaled tensors back on the data's original scale, in float64: the scored channels are
    the data's last tensor.shape[-1] (all for M, the target for S / MS / --covariate).

    float64 because float32 has 24 bits: at an offset of 1e8 it keeps steps of 8, and the
    errors of a series whose std is 6 vanish in the rounding."""

    def __init__(self, scaler, device):
        # None: the data was never scaled (--scale false), or scaled per series (its tensors stay as they are)
        self.stats = None if scaler is None else tuple(
            torch.as_tensor(v, dtype=torch.float64, device=device) for v in (scaler.mean_, scaler.scale_))

    def __call__(self, tensor):
        tensor = tensor.double()
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


# every file a run writes under <results_dir>/<setting>/
OUTPUT_FILES = ("metrics.json", "window_errors.csv", "training_curves.png", "forecast.png", "forecast.csv", "steps.csv")


def output_path(args, setting, name):
    return os.path.join(args.results_dir, setting, name)


def tensorboard_dir(args, setting):
    """Where --tensorboard writes (None without it): the folder given, or tensorboard/ in the setting's results."""
    if not args.tensorboard:
        return None
    return output_path(args, setting, "tensorboard") if args.tensorboard == "auto" else os.path.join(args.tensorboard, setting)


def results_file(args):
    return os.path.join(args.results_dir, "results.jsonl")


def outputs_problem(args, setting):
    """None, or the one line saying why rank 0 could not write this run's results."""
    problem = writable_dir_problem(args.results_dir, "--results_dir")
    if problem:
        return problem
    jsonl = results_file(args)
    if os.path.lexists(jsonl) and not os.path.isfile(jsonl):
        return (f"{jsonl} is not a file (a folder?); every run appends its record to it: move it away or "
                "choose another --results_dir")
    if os.path.isfile(jsonl) and not os.access(jsonl, os.W_OK):
        return f"{jsonl} is not writable; fix its permissions or choose another --results_dir"
    folder = os.path.join(args.results_dir, setting)
    if os.path.lexists(folder) and not os.path.isdir(folder):
        return f"{folder} is not a folder; this run writes its outputs there: move it away or choose another --results_dir"
    if os.path.isdir(folder):  # a folder that does not exist yet is made in --results_dir, checked above
        problem = writable_dir_problem(folder, "the setting's results folder")
        if problem:
            return problem
    for name in OUTPUT_FILES:
        path = output_path(args, setting, name)
        if os.path.isdir(path):
            return f"{path} is a folder where this run writes its {name}: move it away or choose another --results_dir"
    return None


def require_outputs_writable(args, setting):
    """Before any training, on every rank: rank 0 must be able to write results.jsonl and every file
    of <results_dir>/<setting>/ (a results.jsonl that is a folder would otherwise fail after training)."""
    distributed.raise_on_every_rank(lambda: outputs_problem(args, setting), on="main")


def prepare_training_outputs(args, setting):
    """Before training, on every rank: the folders must be writable, a killed save's temp files go, and
    --tensorboard must import (exp.steps.tensorboard_problem)."""
    require_writable(args, "checkpoints", "results_dir")
    if distributed.is_main():  # this run holds the setting's lock: they are nobody's live writes
        started = time.time()
        for folder in (os.path.dirname(checkpoint_path(args, setting)), output_path(args, setting, "")):
            removed = remove_stale_temporaries(folder, started)
            if removed:
                logger.info(f"removed {len(removed)} unfinished temp file(s) a killed run left in {folder}: "
                            + ", ".join(sorted(removed)))
    require_outputs_writable(args, setting)  # results.jsonl and the setting's files, before training
    if args.tensorboard:
        distributed.raise_on_every_rank(tensorboard_problem, on="main")


def save_results(args, setting, metrics, training=None):
    """After the test's result line: rank 0 writes window_errors.csv (test_metrics kept its rows), metrics.json
    and appends the record to results.jsonl (whole or not at all), and returns the record. A collective: a write
    that fails (a full disk, a folder made read-only) stops every rank with one line, nothing half-written."""
    saved = {}

    def write_all():
        record = _record(args, setting, metrics, training)
        window_errors = output_path(args, setting, "window_errors.csv")
        metrics_json = output_path(args, setting, "metrics.json")
        writes = [(window_errors, _unwritten_window_errors.pop(window_errors, lambda: None)),
                  (metrics_json, lambda: atomic_write(metrics_json, lambda f: json.dump(
                      record, f, indent=2, allow_nan=False), binary=False)),
                  (results_file(args), lambda: append_line(results_file(args), json.dumps(record, allow_nan=False)))]
        for path, write in writes:
            try:
                write()
            except OSError as exc:
                return cannot_write(path, exc, "the result line above holds this test's metrics, and results.jsonl "
                                    "no part of its record", "score the weights again with --is_training 0")
        saved["record"] = record
        return None

    distributed.raise_on_every_rank(write_all, on="main")
    return saved.get("record")


def cannot_write(path, exc, kept, again):
    """The line of a results file rank 0 cannot write (`exc`: the OSError): what is `kept`, how to get it `again`."""
    return (f"cannot write {path} ({exc.strerror or exc}); {kept}. Free space under --results_dir (or fix its "
            f"permissions), then {again}")


def _picture(path, draw):
    """draw() a picture to `path` (rank 0), or say in one warning line that it cannot be written: a picture holds
    no result, and the test's metrics still have to be printed and saved. The path drawn, or None."""
    try:
        return draw()
    except OSError as exc:
        logger.warning(f"cannot write {path} ({exc.strerror or exc}); the run goes on without it")
        return None


def _record(args, setting, metrics, training):
    """The test's record, as metrics.json and results.jsonl hold it."""
    record = {"setting": setting, "model": args.model, "data": args.data, "pred_len": args.pred_len,
              "seed": args.seed, "world_size": distributed.world_size(), **finite_metrics(metrics, args)}
    if training:
        record.update(stopped_epoch=training["stopped_epoch"], stopped_step=training["stopped_step"],
                      history=training["history"],
                      train_windows=training["train_windows"],  # after --subset_rand_ratio
                      optimizer_state_bytes=training["optimizer_state_bytes"])  # per rank
        record["dropout_keyed"] = training.get("dropout_keyed", {})  # each nn.Dropout: masks keyed by the sample?
    # the weights tested: their file's sha256 and, where known, the epoch and step that saved them
    record["weights"] = loaded_weights()
    record["args"] = {k: v for k, v in vars(args).items() if _jsonable(v) and k not in Run.RUN_FIELDS}
    return _nulls_for_non_finite(record)  # e.g. a diverged epoch's NaN loss in the history


def finite_metrics(metrics, args=None):
    """`metrics` with NaN / inf as None (null: JSON has neither) and one warning line saying which and why (with
    the run's `args`: whether its data was scaled, and which series a zero MASE scale is of)."""
    bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        by_reason = {}
        for name in bad:
            by_reason.setdefault(_why_not_finite(name, metrics, args), []).append(f"{name} {metrics[name]}")
        logger.warning("; ".join(f"{', '.join(names)}: {why}" for why, names in by_reason.items())
                       + " (written as null in metrics.json and results.jsonl)")
    return {k: None if k in bad else v for k, v in metrics.items()}


def _why_not_finite(name, metrics, args=None):
    base, orig = (name[:-5], True) if name.endswith("_orig") else (name, False)
    scale = "on the original scale" if orig else f"on the {'scaled' if data_scaled(args) else 'unscaled'} data"
    # the same scale's errors (M4's records have no mae: its sMAPE), finite when forecasts and truths are
    mae = metrics.get("mae_orig" if orig else "mae", metrics.get("smape"))
    if base in ("mape", "mspe") and _finite(mae):
        # finite errors over a finite truth give a non-finite ratio only where the truth is 0
        return f"the true values hold a 0 {scale}, and percentage errors divide by it"
    if base in ("mase", "msis", "sql", "rmsse", "owa") and _finite(mae):
        return _zero_mase_scale(args)
    if base == "wql" and _finite(mae):
        return f"every true value is 0 {scale}, and WQL divides by the sum of their absolute values"
    if orig and _finite(metrics.get(base)):
        # the same errors are finite on the scaled data, so forecasts and truths are: float64 ran out of range
        return ("float64 overflow on the original scale (values, errors or their squares past 1.8e308); the data "
                f"and forecasts are finite, as the same metrics on the {'' if data_scaled(args) else 'un'}scaled data show")
    return f"the forecasts or the true values are not finite {scale}"


def _finite(value):
    return isinstance(value, float) and math.isfinite(value)


def data_scaled(args):
    """Whether the run's models saw scaled data: --scale (z-scores of the training rows, or per series), never M4's
    series (TSLib's short-term task reads them as they are). Without `args` (a caller that does not say): scaled."""
    return args is None or bool(args.scale) and args.data != M4


def _zero_mase_scale(args):
    """Why MASE (MSIS, M4's OWA) is not finite when the errors are: its scale, the seasonal naive error of a
    series' history, is 0 (a history that repeats itself at the season, e.g. a constant one), naming the series."""
    generic = "MASE's scale, a series' seasonal naive error, is 0 (a constant history), so MASE is undefined"
    if args is None:
        return generic
    if args.data == M4:  # M4's scoring: a series' MASE divides by its scale, so one zero makes the figure undefined
        data = prepared_data(args)
        zero = [data.ids[i] for i in m4.zero_scale_series(data.series, data.frequency)]
        if not zero:  # the scales are not 0: OWA's denominators are
            return ("OWA divides by Naive2's MASE and sMAPE, and one of them is 0 (Naive2 forecast every test value "
                    "exactly)")
        return (f"MASE's scale, the in-sample seasonal naive error at lag {data.frequency}, is 0 for series "
                f"{some(zero)} ({len(zero)} of {len(data.ids)} {args.seasonal_patterns}: a history that repeats "
                f"itself at that lag), so their MASE divides by 0 and {args.seasonal_patterns}'s MASE and OWA are "
                "undefined, as in M4's own scoring")
    zero, _ = zero_scales(args)
    if not zero:
        return generic
    return (f"MASE's scale, the seasonal error at season {seasonality(args.freq)}, is 0 for every scored series "
            f"({some(zero)}: a history that repeats itself at the season, e.g. a constant one), so MASE and MSIS "
            "are undefined: gluonts and GIFT-Eval leave such series out, and none is left")


def _nulls_for_non_finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _nulls_for_non_finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nulls_for_non_finite(v) for v in value]
    return value


def save_window_errors(args, setting, errors, numbers, scoring=None):
    """window_errors.csv (rank 0; save_results writes it): each test window's MSE and MAE, in test order, so metrics over
    any subset of windows (e.g. what a loader with drop_last=True would have scored:
    lab/drop_last_effect.py) need no second evaluation. `numbers`: each window's number in
    the test split (0, 1, 2, ... unless --test_windows scored a subset). A probabilistic run's `scoring`
    adds each window's sums of its metrics (ProbabilisticSums' window_sums; exp.scoring.subset_metrics reads them back),
    written to every digit."""
    if not distributed.is_main():
        return
    rows, names, fmt = np.column_stack([numbers, errors.numpy()]), ["window", "mse", "mae"], ["%d", "%.9g", "%.9g"]
    if scoring is not None:
        columns, values = scoring.window_columns()
        rows, names, fmt = np.column_stack([rows, values]), names + columns, fmt + ["%.17g"] * len(columns)
    path = output_path(args, setting, "window_errors.csv")
    # written by save_results, after the result line: a full disk must not take the test's metrics with it
    _unwritten_window_errors[path] = lambda: atomic_write(path, lambda f: np.savetxt(
        f, rows, fmt=fmt, delimiter=",", header=",".join(names), comments=""), binary=False)


# window_errors.csv files a test computed and save_results has not written yet: path -> its write
_unwritten_window_errors = {}


def original_scale_sums(args, device):
    """With --inverse, ErrorSums on the data's original scale (data without one scaler is refused here, on
    every rank alike, before any collective); else None."""
    if not args.inverse:
        return None
    data = prepared_data(args)
    require_one_scale(data, args)
    return ErrorSums(transform=OriginalScale(data.scaler, device))


def test_metrics(args, setting, sums, original, vali_loss, dataset, scoring=None):
    """The test's record from its global ErrorSums (and `original`'s, with --inverse; a probabilistic run's
    `scoring`, exp.scoring.ProbabilisticScoring): every metric, the validation loss and the windows scored;
    window_errors.csv kept for save_results to write beside it."""
    numbers, split_windows = split_numbering(dataset)
    save_window_errors(args, setting, sums.window_errors(), numbers, scoring)
    metrics = sums.metrics()
    if original is not None:
        metrics.update({f"{k}_orig": v for k, v in original.metrics().items()})
    if scoring is not None:  # the median's MSE and MAE above; WQL, MASE, sMAPE, MSIS, coverage here
        metrics.update(scoring.metrics())
        metrics["test_objective_loss"] = sums.objective_loss  # the training objective's mean on the test
    metrics["vali_loss"] = vali_loss
    metrics["test_windows"] = len(dataset)  # scored: all of the split's, or --test_windows of them
    metrics["test_split_windows"] = split_windows
    if args.test_windows and args.test_windows >= split_windows:
        logger.info(f"--test_windows {args.test_windows}: the test split holds {split_windows} windows, all scored")
    return metrics


def result_line(setting, metrics):
    """The result line of a test: every metric, on the original scale too with --inverse; a probabilistic
    run's wql, mase (where scored) and coverage_80 (where its levels hold 0.1 and 0.9) after mspe."""
    orig = ""
    if "mse_orig" in metrics:
        orig = f"; original scale: mse {metrics['mse_orig']:.6g} mae {metrics['mae_orig']:.6g}"
    probabilistic = "".join(f" {k} {metrics[k]:.6f}" for k in ("wql", "mase", "coverage_80")
                            if isinstance(metrics.get(k), float))
    scored = metrics["test_windows"]
    if scored < metrics["test_split_windows"]:
        scored = f"{scored} of the split's {metrics['test_split_windows']}"  # a --test_windows subset
    return (f"test {setting}: mse {metrics['mse']:.6f} mae {metrics['mae']:.6f} rmse {metrics['rmse']:.6f} "
            f"mape {metrics['mape']:.6f} mspe {metrics['mspe']:.6f}{probabilistic}{orig} (vali {metrics['vali_loss']:.6f}, "
            f"{scored} windows, {distributed.world_size()} processes)")


def draw_training(args, setting, history):
    """training_curves.png: losses per epoch and the learning rate (rank 0)."""
    if args.no_plots or not distributed.is_main() or not history:
        return
    path = output_path(args, setting, "training_curves.png")
    if _picture(path, lambda: plots.plot_training(path, history, f"{args.model} on {_data_label(args)}\n{setting}")):
        logger.info(f"training curves: {path}")


def draw_forecasts(exp, setting, n_windows=4):
    """forecast.png: evenly spaced test windows of the target (last) channel; a probabilistic run's median
    with its 50 / 80 / 90 % bands (those whose ends are levels), quantiles keyed as in the scoring. Rank 0
    runs the experiment's raw model on them alone (every rank, under --fsdp): the metrics are already computed."""
    args = exp.args
    sharded = ddp.is_sharded(exp.raw_model)  # --fsdp: its forward gathers weights from every rank, which all run it
    if args.no_plots or not (distributed.is_main() or sharded):
        return
    data = prepared_data(args)
    dataset, _ = data_provider(args, "test")
    numbers, split_windows = split_numbering(dataset)  # with --test_windows, the subset's windows
    picks = sorted({round(i * (len(dataset) - 1) / max(n_windows - 1, 1)) for i in range(n_windows)})
    batch = on_device(dataset.__getitems__(picks), exp.device)
    pred, true = _forecast(exp, batch)
    if not distributed.is_main():
        return
    to_original = OriginalScale(data.scaler, exp.device)
    quantiles = _quantiles(args, pred, "test", numbers[picks])
    bands = {}
    if quantiles is not None:
        levels = args.objective.levels
        target = to_original(quantiles[..., -1:, :].movedim(-1, 0))[..., 0].cpu()  # [L, windows, horizon]
        pred = quantiles[..., levels.index(0.5)]
        bands = {name[-2:]: (target[levels.index(lo)].tolist(), target[levels.index(hi)].tolist())
                 for name, (lo, hi) in COVERAGE_INTERVALS.items() if lo in levels and hi in levels}
    history, true, pred = (to_original(t[..., -1:])[..., 0].cpu().tolist() for t in (batch[0], true, pred))
    window = window_for(args, "test")
    windows = []
    for i, pick in enumerate(picks):
        label = f"test window {numbers[pick] + 1} of {split_windows}"
        date = data.forecast_date("test", window, int(numbers[pick]))
        if date is not None:
            label += f", forecast from {date:%Y-%m-%d %H:%M}"
        windows.append({"history": history[i], "truth": true[i], "forecast": pred[i], "label": label,
                        "bands": {f"{name} %": (lo[i], hi[i]) for name, (lo, hi) in bands.items()}})
    target = data.columns[-1]
    path = output_path(args, setting, "forecast.png")
    if not _picture(path, lambda: plots.plot_forecasts(
            path, windows,
            f"{args.model} on {_data_label(args)}: target {target}, input {window.x_len}, horizon {len(true[0])}",
            f"{target} ({'scaled' if data.per_series_scaling and data_scaled(args) else 'original scale'})")):
        return
    shown = f" (median, {' / '.join(bands)} % band{'s' if len(bands) > 1 else ''})" if bands else ""
    logger.info(f"forecast picture: {path}{shown}")


def predict(exp, setting):
    """forecast.csv: the horizon after the data's last row, forecast from its last input rows
    (token models roll out), on the original scale; dated data continues its dates at --freq,
    undated data counts steps 1..horizon. A probabilistic run writes its median in each forecast column
    and the quantiles beside it (<column>_q<level>, in level order, non-decreasing; sampled ones drawn
    from window_keys(seed, "future", [0])). Rank 0 writes it and returns it as a DataFrame; a collective, so
    that a file rank 0 cannot write stops every rank with one line."""
    args = exp.args
    data = prepared_data(args)
    require_one_scale(data, args)
    written = {}
    # --fsdp: the forward gathers weights from every rank, so every rank runs it; else rank 0 alone
    future = _future_forecast(exp, data) if ddp.is_sharded(exp.raw_model) else None
    distributed.raise_on_every_rank(lambda: _predict_on_main(exp, setting, data, written, future), on="main")
    return written.get("frame")


def _future_forecast(exp, data):
    """(the future's index, the data's last row, the forecast after it)."""
    dataset, index, last_row = data.future_input(window_for(exp.args, "test"), exp.args.freq, exp.args.embed)
    return index, last_row, _forecast(exp, dataset.__getitems__([0]))[0]


def _predict_on_main(exp, setting, data, written, future=None):
    """predict's forecast (`future`: _future_forecast's, if computed) and forecast.csv, on rank 0: None (the
    frame in written["frame"]), or why the file could not be written."""
    args = exp.args
    index, last_row, pred = future or _future_forecast(exp, data)
    to_original = OriginalScale(data.scaler, exp.device)
    quantiles = _quantiles(args, pred, "future", [0])
    levels = () if quantiles is None else args.objective.levels
    if quantiles is not None:
        pred = quantiles[..., levels.index(0.5)]  # the median: equal to its q0.5 column
    forecast = to_original(pred)[0].cpu().numpy()  # len(index) rows, float64
    frame = pd.DataFrame(forecast, columns=data.columns[-forecast.shape[1]:])
    if quantiles is not None:
        frame = _with_quantile_columns(frame, to_original(quantiles[0].movedim(-1, 0)).cpu().numpy(), levels)
    frame.insert(0, index.name, index)
    path = output_path(args, setting, "forecast.csv")
    try:
        atomic_write(path, lambda f: frame.to_csv(f, index=False), binary=False)  # float64 as repr: every digit kept
    except OSError as exc:
        return cannot_write(path, exc, "metrics.json and results.jsonl hold this test's record",
                            "forecast again with --is_training 0 --do_predict")
    forecast_columns = ", ".join(data.columns[-forecast.shape[1]:])
    quantile_note = f"; the median, and beside each its quantiles {_levels_text(levels)} (<column>_q<level>)" if levels else ""
    logger.info(f"forecast of the {len(index)} steps after {last_row} ({forecast_columns}, original scale"
                f"{quantile_note}): {path}")
    written["frame"] = frame
    return None


def _quantiles(args, pred, split, numbers):
    """A probabilistic run's [B, P, C, L] quantiles of its parameters `pred` (sampled ones from the windows'
    keys, window_keys(seed, split, numbers): what the scoring draws); None for a point run."""
    objective = args.objective
    if objective is None:
        return None
    keys = window_keys(args.seed, split, numbers) if objective.samples else None
    return objective.quantiles(pred, keys)


def _with_quantile_columns(frame, quantiles, levels):
    """`frame` with each column followed by its quantile columns <column>_q<level> from [L, P, C] `quantiles`."""
    parts = {}
    for c, column in enumerate(frame.columns):
        parts[column] = frame[column]
        for i, level in enumerate(levels):
            parts[f"{column}_q{level:g}"] = quantiles[i, :, c]
    return pd.DataFrame(parts)


def _levels_text(levels):
    return f"{levels[0]:g} ... {levels[-1]:g}" if len(levels) > 3 else ", ".join(f"{q:g}" for q in levels)


@torch.no_grad()
def _forecast(exp, batch):
    """(prediction, truth) of the experiment's raw model at test time, in eval mode."""
    with eval_mode(exp.raw_model), exp.autocast():
        return forward(exp.raw_model, batch, exp.args, "test", exp.device)


def _data_label(args):
    return os.path.basename(args.data_path) if args.data == "custom" else args.data


def _jsonable(value):
    return isinstance(value, (str, int, float, bool, type(None), list, tuple))
