"""ChronosBolt (ChronosBolt.py) against chronos-forecasting's ChronosBoltPipeline, at the four released
sizes (amazon/chronos-bolt-tiny, -mini, -small, -base: 9M, 21M, 48M, 205M parameters), random weights in the
released layout written by the package's save_pretrained:

- crosscheck(): our quantile forecasts against ChronosBoltPipeline.from_pretrained(folder).predict on the same
  windows, at each size, horizon 64 (one block) and 160 (rolled out twice) from 512 steps of context, and at
  the small size from the full 2048; then our weights exported (utils.checkpoint.export --to chronos-bolt) and
  read back by the package, which must forecast what we do;
- speed(): zero-shot over the same 64 windows (one channel, context 512, horizons 64 and 96: one block, and
  rolled out), one CPU process, batch 64: ours (one forward of [64, 512, 1], torch.inference_mode) against the
  package's own prediction path (pipeline.predict of the batch's series), a warm-up, then interleaved rounds
  (each first in every other), medians.

    python benchmarks/foundation_crosscheck.py --models ChronosBolt
"""
import os
import statistics
import sys
import tempfile
import time
import warnings
from argparse import Namespace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]  # models/foundation/<release>/crosscheck.py
sys.path.insert(0, str(REPO))

TOLERANCE = 1e-5
SIZES = ("tiny", "mini", "small", "base")
SHAPES = ((512, 64), (512, 160))  # (seq_len, pred_len) at every size; small also (2048, 64)
WINDOWS, CHANNELS = 4, 3
SPEED_WINDOWS, SPEED_CHANNELS, SPEED_CONTEXT, SPEED_HORIZONS, ROUNDS = 64, 1, 512, (64, 96), 8


def released_folder(folder, size, seed=0):
    """The package's model at a released size, random weights, saved as the hub holds amazon/chronos-bolt-<size>."""
    from chronos.chronos_bolt import ChronosBoltModelForForecasting
    from transformers import T5Config

    from models.foundation.chronos_bolt.adapter import released_config

    torch.manual_seed(seed)
    ChronosBoltModelForForecasting(T5Config.from_dict(released_config(size))).save_pretrained(folder)
    return folder


def ours(folder, seq_len, pred_len, weights=None):
    from models.foundation.chronos_bolt.ChronosBolt import Model
    from exp.export import load_weights

    model = Model(Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=str(folder)))
    return load_weights(model, str(weights or folder)).eval()


def pipeline(folder):
    from chronos import ChronosBoltPipeline

    return ChronosBoltPipeline.from_pretrained(folder)


def windows(seq_len, batch=WINDOWS, channels=CHANNELS, seed=0):
    """Random walks on different levels and scales, [batch, seq_len, channels]."""
    generator = torch.Generator().manual_seed(seed)
    walk = torch.randn(batch, seq_len, channels, generator=generator).cumsum(1)
    scales = torch.logspace(-2, 2, channels)
    return walk * scales + 10 * scales


def predicted(pipe, x, pred_len):
    """The pipeline's quantiles of the channels of x, as ours: [B, pred_len, C, 9]."""
    batch, seq_len, channels = x.shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "We recommend keeping prediction length <= 64" past a block
        out = pipe.predict(x.transpose(1, 2).reshape(batch * channels, seq_len), prediction_length=pred_len)
    return out.reshape(batch, channels, -1, pred_len).permute(0, 3, 1, 2)


def relative(a, b):
    return ((a - b).abs() / b.abs().clamp_min(1e-6)).max().item()


def crosscheck():
    from exp.export import export

    lines = ["Quantile forecasts (9 levels) of random walks, ours against `ChronosBoltPipeline.from_pretrained(folder)"
             ".predict` on the same windows, random weights at each released size (float32, CPU); 160 steps roll out "
             "twice past the 64-step block.", "",
             f"| size | parameters | context | horizon | series | max relative difference | within {TOLERANCE:g} |",
             "|---|---|---|---|---|---|---|"]
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for size in SIZES:
            folder = released_folder(Path(tmp) / size, size)
            pipe = pipeline(folder)
            shapes = SHAPES + (((2048, 64),) if size == "small" else ())
            for seq_len, pred_len in shapes:
                model = ours(folder, seq_len, pred_len)
                x = windows(seq_len)
                with torch.inference_mode():
                    mine = model(x)
                diff = relative(mine, predicted(pipe, x, pred_len))
                worst = max(worst, diff)
                params = sum(p.numel() for p in model.parameters()) / 1e6
                lines.append(f"| {size} | {params:.1f}M | {seq_len} | {pred_len} | {WINDOWS * CHANNELS} | {diff:.2e} | "
                             f"{'yes' if diff <= TOLERANCE else 'NO'} |")
        # our weights (a fine-tuned model's state) exported, and read back by the package
        folder = Path(tmp) / "small"
        model = ours(folder, 512, 160)
        with torch.no_grad():
            for p in model.parameters():  # as a fine-tuning would: every weight moved
                p.add_(torch.randn_like(p) * 1e-3)
        torch.save(model.state_dict(), Path(tmp) / "checkpoint.pth")
        export(str(Path(tmp) / "checkpoint.pth"), str(Path(tmp) / "exported"), to="chronos-bolt")
        x = windows(512, seed=1)
        with torch.inference_mode():
            mine = model(x)
        back = relative(mine, predicted(pipeline(Path(tmp) / "exported"), x, 160))
    lines += ["", f"Largest difference: {worst:.2e} (tolerance {TOLERANCE:g}).", "",
              "Exported: our small model with every weight moved, `python -m exp.export export --to "
              f"chronos-bolt`, "
              f"read by `ChronosBoltPipeline.from_pretrained`: its forecasts (context 512, horizon 160) differ from "
              f"ours by at most {back:.2e} relative ({'within' if back <= TOLERANCE else 'NOT within'} {TOLERANCE:g})."]
    return lines


def _forward(model, x):
    with torch.inference_mode():
        return model(x)


def speed():
    threads = torch.get_num_threads()
    lines = [f"amazon/chronos-bolt-small's shapes (random weights), {SPEED_WINDOWS} windows of {SPEED_CHANNELS} "
             f"channel, context {SPEED_CONTEXT}: ours is one forward of [{SPEED_WINDOWS}, {SPEED_CONTEXT}, "
             f"{SPEED_CHANNELS}] (torch.inference_mode), the package's path is `pipeline.predict` of the batch's "
             f"{SPEED_WINDOWS * SPEED_CHANNELS} series (torch.no_grad inside); a warm-up, then {ROUNDS} interleaved "
             f"rounds (each path first in every other), medians and the rounds' range, {threads} threads; a round's "
             f"ratio is ours / package within the round.", "",
             "| horizon | ours (windows/s) | package (windows/s) | ours / package | rounds' ratios | same forecasts |",
             "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = released_folder(Path(tmp) / "small", "small")
        pipe = pipeline(folder)
        x = windows(SPEED_CONTEXT, SPEED_WINDOWS, SPEED_CHANNELS, seed=2)
        for pred_len in SPEED_HORIZONS:
            model = ours(folder, SPEED_CONTEXT, pred_len)
            paths = {"ours": lambda: _forward(model, x), "package": lambda: predicted(pipe, x, pred_len)}
            mine, theirs = paths["ours"](), paths["package"]()  # a warm-up, and the forecasts compared
            times = {"ours": [], "package": []}
            for round_ in range(ROUNDS):
                for name in ("ours", "package") if round_ % 2 == 0 else ("package", "ours"):
                    started = time.perf_counter()
                    paths[name]()
                    times[name].append(time.perf_counter() - started)
            rate = {k: SPEED_WINDOWS / statistics.median(v) for k, v in times.items()}
            spread = {k: f"{SPEED_WINDOWS / max(v):.1f}-{SPEED_WINDOWS / min(v):.1f}" for k, v in times.items()}
            ratios = [package / mine for mine, package in zip(times["ours"], times["package"])]
            lines.append(f"| {pred_len}{' (rolled out)' if pred_len > 64 else ''} | {rate['ours']:.1f} "
                         f"({spread['ours']}) | {rate['package']:.1f} ({spread['package']}) | "
                         f"{rate['ours'] / rate['package']:.2f} | {min(ratios):.2f}-{max(ratios):.2f} | "
                         f"{relative(mine, theirs):.1e} |")
    return lines


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print("\n".join(crosscheck() + [""] + speed()))
