"""Chronos-2 (Chronos2.py) against chronos-forecasting's Chronos2Pipeline, at the released size of
amazon/chronos-2 (d_model 768, 12 layers, 12 heads, d_ff 3072, 21 quantiles, patches of 16, context 8192, 64
output patches: 119,477,664 parameters), random weights saved by the package's own Chronos2Model.save_pretrained:

- crosscheck(): our quantile forecasts against Chronos2Pipeline.from_pretrained(folder).predict_quantiles(...)
  at the 21 released levels, each channel a univariate series, on the same windows, at three context / horizon
  pairs (one context not a whole number of patches, one horizon rolled out past the 64 patches of one pass);
  then our weights exported (python -m exp.export export --to chronos2) and read back by the package,
  which must forecast the same;
- speed(): zero-shot forecasts of the same 64 windows (one channel, context 512, horizon 96) on one CPU process,
  batch 64: ours (one forward, torch.inference_mode) against the package's predict_quantiles (batch_size 64),
  interleaved rounds, medians.

    python benchmarks/foundation_crosscheck.py --models Chronos2
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
SHAPES = ((512, 96), (1000, 720), (2048, 1100))  # (seq_len, pred_len)
WINDOWS, CHANNELS = 4, 2
SPEED_WINDOWS, SPEED_CONTEXT, SPEED_HORIZON, ROUNDS = 64, 512, 96, 5


def _package():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # from_pretrained of a local folder: nothing to fetch
    from chronos import chronos2

    return chronos2


def released_folder(folder, seed=0):
    """The package's Chronos2Model at the released size, its own random initialisation, saved as amazon/chronos-2
    is (save_pretrained: config.json + model.safetensors)."""
    from models.foundation.chronos2.adapter import RELEASED_CORE, RELEASED_FORECASTING

    package = _package()
    torch.manual_seed(seed)
    config = package.Chronos2CoreConfig(**RELEASED_CORE, reg_token_id=1, chronos_config=dict(RELEASED_FORECASTING))
    model = package.Chronos2Model(config)
    model.save_pretrained(folder)
    return folder, sum(p.numel() for p in model.parameters())


def ours(folder, seq_len, pred_len):
    from models.foundation.chronos2.Chronos2 import Model
    from exp.export import load_weights

    configs = Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=str(folder), dropout=0.1,
                        is_training=0)
    return load_weights(Model(configs), str(folder)).eval()


def package_forecast(pipeline, windows, pred_len):
    """[B, L, C] windows, each channel a univariate series -> the package's 21 quantiles, [B, pred_len, C, 21]."""
    from models.foundation.chronos2.adapter import RELEASED_QUANTILES

    batch, length, channels = windows.shape
    quantiles, _ = pipeline.predict_quantiles(windows.transpose(1, 2).reshape(batch * channels, 1, length),
                                              prediction_length=pred_len, quantile_levels=list(RELEASED_QUANTILES),
                                              batch_size=batch * channels)
    return torch.stack(quantiles).reshape(batch, channels, pred_len, -1).transpose(1, 2)


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


def differences(got, want):
    """(max |difference| / max |forecast|, max of |difference| / |forecast| element by element)."""
    difference = (got - want).abs()
    return float(difference.max() / want.abs().max()), float((difference / want.abs().clamp_min(1e-30)).max())


def crosscheck():
    from exp.export import export

    package = _package()
    rows, worst = [], 0.0
    with tempfile.TemporaryDirectory() as work:
        folder, parameters = released_folder(Path(work) / "release")
        pipeline = package.Chronos2Pipeline.from_pretrained(str(folder))
        for seq_len, pred_len in SHAPES:
            windows = windows_of(WINDOWS, seq_len, CHANNELS)
            model = ours(folder, seq_len, pred_len)
            with torch.inference_mode():
                got = model(windows)
            want = package_forecast(pipeline, windows, pred_len)
            patches = -(-pred_len // 16)
            what = (f"one pass of {patches} patches" if patches <= 64 else
                    f"64 patches, then the package's rollout ({patches - 64} more, 9 paths)")
            if seq_len % 16:
                what += f", context padded to {-(-seq_len // 16) * 16}"
            scaled, elementwise = differences(got, want)
            worst = max(worst, scaled)
            rows.append(f"| {seq_len} | {pred_len} | {what} | {scaled:.2e} | {elementwise:.2e} | "
                        f"{'yes' if scaled <= TOLERANCE else 'NO'} |")
        # our weights exported to the released layout, read back by the package
        seq_len, pred_len = SHAPES[0]
        model = ours(folder, seq_len, pred_len)
        torch.save(model.state_dict(), Path(work) / "ours.pth")
        export(str(Path(work) / "ours.pth"), str(Path(work) / "exported"), "chronos2")
        windows = windows_of(WINDOWS, seq_len, CHANNELS, seed=3)
        with torch.inference_mode():
            got = model(windows)
        want = package_forecast(package.Chronos2Pipeline.from_pretrained(str(Path(work) / "exported")), windows,
                                pred_len)
        scaled, elementwise = differences(got, want)
        worst = max(worst, scaled)
        rows.append(f"| {seq_len} | {pred_len} | our checkpoint exported (--to chronos2), read by the package | "
                    f"{scaled:.2e} | {elementwise:.2e} | {'yes' if scaled <= TOLERANCE else 'NO'} |")
    return [f"Random weights at the released size ({parameters:,} parameters; the package's own initialisation), "
            f"saved by the package's save_pretrained; {WINDOWS} windows x {CHANNELS} channels of ETTh1 each, every "
            "channel a univariate series. Ours: models/foundation/chronos2/Chronos2.py loaded through its adapter; the package: "
            "Chronos2Pipeline.from_pretrained(folder).predict_quantiles(series [N, 1, L], prediction_length, the 21 "
            "levels). Max |difference| over the 21 quantiles, relative to the largest |forecast| (and element by "
            "element).", "",
            "| seq_len | pred_len | what | max rel. difference | max elementwise rel. | within 1e-5 |",
            "|---|---|---|---|---|---|", *rows, "",
            f"Largest relative difference: {worst:.2e} (tolerance {TOLERANCE:g})."]


def speed():
    package = _package()
    windows = windows_of(SPEED_WINDOWS, SPEED_CONTEXT, 1, seed=2)
    times = {"ours": [], "package": []}
    with tempfile.TemporaryDirectory() as work:
        folder, _ = released_folder(Path(work) / "release")
        model = ours(folder, SPEED_CONTEXT, SPEED_HORIZON)
        pipeline = package.Chronos2Pipeline.from_pretrained(str(folder))

        def run_ours():
            with torch.inference_mode():
                return model(windows)

        runs = {"ours": run_ours, "package": lambda: package_forecast(pipeline, windows, SPEED_HORIZON)}
        for name, run in runs.items():  # a warm-up each
            run()
        for _ in range(ROUNDS):
            for name, run in runs.items():
                started = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - started)
    median = {name: statistics.median(values) for name, values in times.items()}
    rate = {name: SPEED_WINDOWS / seconds for name, seconds in median.items()}
    return [f"{SPEED_WINDOWS} windows of one ETTh1 channel, context {SPEED_CONTEXT}, horizon {SPEED_HORIZON}, one "
            f"batch of 64, released size, {torch.get_num_threads()} threads; median of {ROUNDS} interleaved rounds "
            "after a warm-up. The package: Chronos2Pipeline.predict_quantiles(batch_size=64) (its dataset, left "
            "padding and batching, then the same Chronos2Model forward, SDPA attention, as ours).", "",
            "| path | seconds per batch of 64 | windows/s |", "|---|---|---|",
            f"| ours (models/foundation/chronos2/Chronos2.py) | {median['ours']:.2f} | {rate['ours']:.2f} |",
            f"| chronos-forecasting Chronos2Pipeline.predict_quantiles | {median['package']:.2f} | "
            f"{rate['package']:.2f} |", "",
            f"Ours / package: {rate['ours'] / rate['package']:.2f}x the windows per second "
            f"(rounds: ours {', '.join(f'{t:.2f}' for t in times['ours'])} s; package "
            f"{', '.join(f'{t:.2f}' for t in times['package'])} s)."]


if __name__ == "__main__":
    print("\n".join(crosscheck()))
    print("\n".join(speed()))
