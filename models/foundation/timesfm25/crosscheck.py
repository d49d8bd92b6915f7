"""TimesFM 2.5 (TimesFM25.py) against the timesfm package, at the released size (231M parameters, random
weights in the released layout written by the package's save_pretrained):

- crosscheck(): our quantile forecasts against the package's TimesFM_2p5_200M_torch.from_pretrained(folder),
  compile(ForecastConfig(max_context=seq_len, max_horizon=pred_len, the flags of TimesFM25.FORECAST_FLAGS)) and
  forecast(horizon, series), on the same windows, at three context / horizon pairs (one padded to a multiple of
  32, two rolled out past 128 steps); then our weights exported (python -m exp.export export --to timesfm)
  and read back by the package, which must forecast the same;
- speed(): zero-shot forecasts of the same 64 windows (one channel, context 512, horizon 96) on one CPU process,
  batch 64: ours (one forward, torch.inference_mode) against the package's forecast (per_core_batch_size 64,
  torch_compile=False: eager, as ours), interleaved rounds, medians.

    python benchmarks/foundation_crosscheck.py --models TimesFM25
"""
import os
import statistics
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[3]  # models/foundation/<release>/crosscheck.py
sys.path.insert(0, str(REPO))

TOLERANCE = 1e-5
SHAPES = ((512, 96), (500, 336), (1024, 720))  # (seq_len, pred_len)
WINDOWS, CHANNELS = 4, 2
SPEED_WINDOWS, SPEED_CONTEXT, SPEED_HORIZON, ROUNDS = 64, 512, 96, 3


def _package():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # from_pretrained of a local folder: nothing to fetch
    import timesfm
    from timesfm.timesfm_2p5 import timesfm_2p5_torch

    return timesfm, timesfm_2p5_torch.TimesFM_2p5_200M_torch


def released_folder(folder, seed=0):
    """The package's model at the released size, random weights (its norm scales start at zero, which would
    silence every layer: they are drawn too), saved by the package as google/timesfm-2.5-200m-pytorch is."""
    _, package_class = _package()
    model = package_class(torch_compile=False)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.model.named_parameters():
            if value.dim() == 1:
                value.copy_(torch.randn(value.shape, generator=generator) * 0.5 + (0 if "bias" in name else 1))
    model.save_pretrained(folder)
    return folder


def ours(folder, seq_len, pred_len):
    from models.foundation.timesfm25 import TimesFM25
    from exp.export import load_weights

    configs = Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=str(folder))
    return load_weights(TimesFM25.Model(configs), str(folder)).eval()


def package_model(folder, seq_len, pred_len, series_count):
    from models.foundation.timesfm25 import TimesFM25

    timesfm, package_class = _package()
    model = package_class.from_pretrained(str(folder), torch_compile=False)
    model.compile(timesfm.ForecastConfig(max_context=seq_len, max_horizon=pred_len, per_core_batch_size=series_count,
                                         **TimesFM25.FORECAST_FLAGS))
    return model


def package_forecast(model, windows, pred_len):
    """[B, L, C] windows -> the package's quantiles 0.1..0.9, [B, pred_len, C, 9]."""
    batch, _, channels = windows.shape
    series = [windows[b, :, c].numpy() for b in range(batch) for c in range(channels)]
    _, quantiles = model.forecast(horizon=pred_len, inputs=series)
    return torch.from_numpy(quantiles[..., 1:]).float().reshape(batch, channels, pred_len, -1).transpose(1, 2)


def windows_of(count, length, channels, seed=1):
    """Windows of ETTh1 where the file is here (tests/helpers.ETTH1), else random walks."""
    generator = np.random.default_rng(seed)
    path = REPO.parent / "shared" / "datasets" / "ETT-small" / "ETTh1.csv"
    if path.exists():
        import pandas as pd

        values = pd.read_csv(path).iloc[:, 1:].to_numpy(np.float32)
        starts = generator.integers(0, len(values) - length, count)
        columns = generator.choice(values.shape[1], channels, replace=False)
        return torch.from_numpy(np.stack([values[s:s + length][:, columns] for s in starts]))
    return torch.from_numpy(generator.standard_normal((count, length, channels)).cumsum(1).astype(np.float32))


def relative(got, want):
    return float((got - want).abs().max() / want.abs().max())


def crosscheck():
    from exp.export import export

    lines = ["Random weights at the released size (231,289,280 parameters), saved by the package's save_pretrained; "
             f"{WINDOWS} windows x {CHANNELS} channels of ETTh1 each. Ours: models/foundation/timesfm25/TimesFM25.py loaded through its "
             "adapter; the package: TimesFM_2p5_200M_torch.from_pretrained(folder), compile(ForecastConfig(max_context="
             "seq_len, max_horizon=pred_len, normalize_inputs=True, use_continuous_quantile_head=True, "
             "force_flip_invariance=True, infer_is_positive=True, fix_quantile_crossing=True)), forecast. "
             "Max |difference| over the quantiles 0.1..0.9, relative to the largest |forecast|.", "",
             "| seq_len | pred_len | what | max rel. difference | within 1e-5 |", "|---|---|---|---|---|"]
    worst = 0.0
    with tempfile.TemporaryDirectory() as work:
        folder = released_folder(Path(work) / "release")
        for seq_len, pred_len in SHAPES:
            windows = windows_of(WINDOWS, seq_len, CHANNELS)
            model = ours(folder, seq_len, pred_len)
            with torch.inference_mode():
                got = model(windows)
            want = package_forecast(package_model(folder, seq_len, pred_len, WINDOWS * CHANNELS), windows, pred_len)
            rolled = f", {-(-pred_len // 128) - 1} roll-out step(s)" if pred_len > 128 else ""
            padded = f", padded to {-(-seq_len // 32) * 32}" if seq_len % 32 else ""
            difference = relative(got, want)
            worst = max(worst, difference)
            lines.append(f"| {seq_len} | {pred_len} | forecast{padded}{rolled} | {difference:.2e} | "
                         f"{'yes' if difference <= TOLERANCE else 'NO'} |")
        # our weights exported to the released layout, read back by the package
        seq_len, pred_len = SHAPES[0]
        torch.save(model.state_dict(), Path(work) / "ours.pth")
        export(str(Path(work) / "ours.pth"), str(Path(work) / "exported"), "timesfm")
        model = ours(folder, seq_len, pred_len)
        windows = windows_of(WINDOWS, seq_len, CHANNELS)
        with torch.inference_mode():
            got = model(windows)
        want = package_forecast(package_model(Path(work) / "exported", seq_len, pred_len, WINDOWS * CHANNELS),
                                windows, pred_len)
        difference = relative(got, want)
        worst = max(worst, difference)
        lines.append(f"| {seq_len} | {pred_len} | our checkpoint exported (--to timesfm), read by the package | "
                     f"{difference:.2e} | {'yes' if difference <= TOLERANCE else 'NO'} |")
    lines += ["", f"Largest relative difference: {worst:.2e} (tolerance {TOLERANCE:g})."]
    return lines


def speed():
    windows = windows_of(SPEED_WINDOWS, SPEED_CONTEXT, 1, seed=2)
    times = {"ours": [], "package": []}
    with tempfile.TemporaryDirectory() as work:
        folder = released_folder(Path(work) / "release")
        model = ours(folder, SPEED_CONTEXT, SPEED_HORIZON)
        reference = package_model(folder, SPEED_CONTEXT, SPEED_HORIZON, SPEED_WINDOWS)

        def run_ours():
            with torch.inference_mode():
                return model(windows)

        runs = {"ours": run_ours, "package": lambda: package_forecast(reference, windows, SPEED_HORIZON)}
        for name, run in runs.items():  # a warm-up each
            run()
        for _ in range(ROUNDS):
            for name, run in runs.items():
                started = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - started)
    median = {name: statistics.median(values) for name, values in times.items()}
    rate = {name: SPEED_WINDOWS / seconds for name, seconds in median.items()}
    return [f"{SPEED_WINDOWS} windows of one ETTh1 channel, context {SPEED_CONTEXT}, horizon "
            f"{SPEED_HORIZON}, one batch of 64, released size, {torch.get_num_threads()} threads; median of {ROUNDS} "
            "interleaved rounds after a warm-up. The package: forecast() with per_core_batch_size 64, "
            "torch_compile=False (eager, as ours).", "",
            "| path | seconds per batch of 64 | windows/s |", "|---|---|---|",
            f"| ours (models/foundation/timesfm25/TimesFM25.py) | {median['ours']:.2f} | {rate['ours']:.2f} |",
            f"| timesfm package forecast | {median['package']:.2f} | {rate['package']:.2f} |", "",
            f"Ours / package: {rate['ours'] / rate['package']:.2f}x the windows per second "
            f"(rounds: ours {', '.join(f'{t:.2f}' for t in times['ours'])} s; package "
            f"{', '.join(f'{t:.2f}' for t in times['package'])} s)."]


if __name__ == "__main__":
    print("\n".join(crosscheck()))
    print("\n".join(speed()))
