"""TiRex (TiRex.py) against tirex-ts at the released configuration's shapes (embedding_dim 512, 12 sLSTM
blocks of 4 heads, input_ff_dim 2048, patch 32, train_ctx_len 2048: 35,291,200 parameters), random weights
written as NX-AI/TiRex ships them (model.ckpt). Run through benchmarks/foundation_crosscheck.py --models TiRex.

crosscheck(): our forecasts (the folder loaded through utils.checkpoint.load_weights) against the package's own
prediction path, tirex.load_model(<folder>/model.ckpt).forecast(context, prediction_length), on the same windows.
speed(): zero-shot over the same windows, one CPU process, 64 series a batch: ours (one forward, all channels)
against the package's forecast(batch_size=64), medians of interleaved rounds."""
import os
import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import torch

CASES = ((96, 64), (2048, 64))  # (seq_len, pred_len): a padded context (61 patches of padding), 2 patches; a full one
SPEED = {"seq_len": 512, "pred_len": 32, "series": 64, "rounds": 3}


def released_folder(root):
    """root/NX-AI/TiRex/model.ckpt: the package's TiRexZero at the released hyper_parameters, random weights."""
    from tirex.models.tirex import TiRexZero

    from models.foundation.tirex.adapter import RELEASED

    hyper = {"model_config": {"input_patch_size": 32, "output_patch_size": 32, "quantiles": list(RELEASED["quantiles"]),
                              "block_kwargs": {"embedding_dim": 512, "num_heads": 4, "num_blocks": 12},
                              "input_ff_dim": 2048},
             "train_ctx_len": 2048}
    model = TiRexZero("torch", hyper["model_config"], train_ctx_len=hyper["train_ctx_len"])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, value in model.named_parameters():
            fan_in = value.shape[-1] if value.dim() > 1 else 1
            noise = torch.randn(value.shape, generator=generator)
            value.copy_(noise / fan_in ** 0.5 if value.dim() > 1 else 0.1 * noise + ("norm" in name))
    folder = Path(root) / "NX-AI" / "TiRex"
    folder.mkdir(parents=True)
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": hyper}, folder / "model.ckpt")
    return folder


def ours(folder, seq_len, pred_len):
    from models.foundation.tirex import TiRex
    from exp.export import load_weights

    configs = Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=str(folder))
    return load_weights(TiRex.Model(configs), str(folder)).eval()


def package_model(folder):
    """tirex.load_model on the local file (its path's second component names the model: NX-AI/TiRex/...)."""
    import tirex

    here = os.getcwd()
    os.chdir(folder.parent.parent)
    try:
        return tirex.load_model("NX-AI/TiRex/model.ckpt", device="cpu", backend="torch")
    finally:
        os.chdir(here)


def windows(count, seq_len, channels, seed=1):
    generator = torch.Generator().manual_seed(seed)
    steps = torch.arange(seq_len, dtype=torch.float32)
    season = torch.sin(2 * torch.pi * steps / 24)[None, :, None] * torch.rand(count, 1, channels, generator=generator)
    return (torch.randn(count, seq_len, channels, generator=generator).cumsum(1) * 0.3 + 3 * season
            + 10 * torch.rand(count, 1, channels, generator=generator))


def crosscheck():
    lines = ["| seq_len | pred_len | windows x channels | max abs difference | max relative difference (of the largest |forecast|) |",
             "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as root:
        folder = released_folder(root)
        reference = package_model(folder)
        for seq_len, pred_len in CASES:
            batch = windows(2, seq_len, 3)
            with torch.no_grad():
                got = ours(folder, seq_len, pred_len)(batch)
            series = batch.permute(0, 2, 1).reshape(-1, seq_len)
            want, _ = reference.forecast(context=series, prediction_length=pred_len, batch_size=5)
            want = want.reshape(2, 3, pred_len, -1).transpose(1, 2)
            difference = float((got - want).abs().max())
            relative = difference / float(want.abs().max())
            verdict = "ok" if relative <= 1e-5 else "FAILS 1e-5"
            lines.append(f"| {seq_len} | {pred_len} | 2 x 3 | {difference:.3g} | {relative:.3g} ({verdict}) |")
    lines += ["", "Ours: the folder read by utils.checkpoint.load_weights into models/foundation/tirex/TiRex.py, one forward of the 6 "
              "series (the padding's patches once for all); the package: tirex.load_model(NX-AI/TiRex/model.ckpt).forecast(batch_size=5), its own "
              "prediction path (torch backend, CPU)."]
    return lines


def speed():
    seq_len, pred_len, count, rounds = (SPEED[k] for k in ("seq_len", "pred_len", "series", "rounds"))
    with tempfile.TemporaryDirectory() as root:
        folder = released_folder(root)
        model, reference = ours(folder, seq_len, pred_len), package_model(folder)
        batch = windows(count, seq_len, 1)
        series = batch[..., 0]
        times = {"ours": [], "package": []}
        for _ in range(rounds):
            started = time.perf_counter()
            with torch.no_grad():
                model(batch)
            times["ours"].append(time.perf_counter() - started)
            started = time.perf_counter()
            reference.forecast(context=series, prediction_length=pred_len, batch_size=count)
            times["package"].append(time.perf_counter() - started)
    median = {name: statistics.median(values) for name, values in times.items()}
    lines = [f"{count} series of {seq_len} steps, horizon {pred_len}, {torch.get_num_threads()} threads, "
             f"{rounds} interleaved rounds (median)", "",
             "| path | seconds | windows/s |", "|---|---|---|"]
    for name, label in (("ours", "ours: Model(x) [64, 512, 1]"),
                        ("package", "package: load_model(...).forecast(batch_size=64)")):
        lines.append(f"| {label} | {median[name]:.2f} | {count / median[name]:.1f} |")
    lines += ["", f"ours / package windows/s: {median['package'] / median['ours']:.2f}. The package runs every series' "
              f"whole 2048-step window, {seq_len} steps NaN-padded in front: 64 patches through 12 sLSTM blocks, step "
              f"by step; ours runs the {(2048 - seq_len) // 32} patches of padding once for all series (the same input "
              f"in each) and each series' {-(-seq_len // 32)} patches from the states they leave."]
    return lines
