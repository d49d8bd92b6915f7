"""TiRex2 (TiRex2.py) against tirex-2 0.4.0 at the presumed released shape (12 blocks alternating bi-mLSTM /
bi-sLSTM, 512 wide, 4 heads, input_ff_dim 2048, h_expand 4, patch 32, context_len 2048, future_len 320:
82,501,744 parameters, the README's 38.4M + 44.1M), random weights written as NX-AI/TiRex-2 ships them
(config.json + model.safetensors, aliases stored once). Run through benchmarks/foundation_crosscheck.py --models
TiRex2 (pip install -e '.[tirex2]').

crosscheck(): our forecasts (the folder loaded through utils.checkpoint.load_weights) against the package's own
prediction path, tirex2.load_model(<folder>, device="cpu").forecast(series, prediction_length) (TiRex2.predict),
as released (its patch embeddings compiled by TorchInductor) and with TorchDynamo disabled (eager).
speed(): zero-shot, 64 series of 2048 steps, one CPU process: ours (one forward) against the package's
forecast(batch_size=64), compiled (its default) and eager, medians of interleaved rounds after a warm-up call each."""
import json
import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import torch

CASES = ((512, 64, False), (2048, 320, False), (512, 96, True))  # (seq_len, pred_len, tta_sign_flip)
SPEED = {"seq_len": 2048, "pred_len": 64, "series": 64, "rounds": 3}


def released_folder(root, tta_sign_flip=False):
    """root/NX-AI/TiRex-2: the package's TiRex2 at the presumed released config, random weights, saved as the hub
    lays it out (each alias group once, under its alphabetically first name)."""
    from safetensors.torch import save_file
    from tirex2 import TiRex2
    from tirex2._state_dict import shared_tensor_groups

    from models.foundation.tirex2.adapter import presumed_config

    config = {**presumed_config(), "tta_sign_flip": tta_sign_flip}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = TiRex2(**config, device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for value in model.parameters():
            if value.dim() > 1:
                value.copy_(torch.randn(value.shape, generator=generator) * 0.6 / value.shape[-1] ** 0.5)
            else:
                value.add_(torch.randn(value.shape, generator=generator) * 0.1)
    state = model.state_dict()
    for group in shared_tensor_groups(model):
        for name in group[1:]:
            state.pop(name, None)
    folder = Path(root) / "NX-AI" / "TiRex-2"
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder, sum(p.numel() for p in model.parameters())


def ours(folder, seq_len, pred_len):
    from exp.export import load_weights
    from models.foundation.tirex2 import TiRex2

    configs = Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=str(folder))
    return load_weights(TiRex2.Model(configs), str(folder)).eval()


def package_forecast(reference, series, pred_len, compiled=True):
    """load_model(...).forecast of every row of `series` [N, L], batch 64: [N, Q, pred_len]."""
    import tirex2

    inputs = [tirex2.TimeseriesType(target=s[None], past_covariates=None, future_covariates=None) for s in series]
    with torch._dynamo.config.patch(disable=not compiled):
        out = reference.forecast(inputs, prediction_length=pred_len, batch_size=64)
    return torch.stack([f[0] for f in out])


def compiled_frames():
    """How many frames TorchDynamo has compiled in this process (the package's ResidualBlock calls)."""
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


def windows(count, seq_len, seed=1):
    """`count` series: random walks with a daily season, every fourth a clean trend (differenced by tta_diff)."""
    generator = torch.Generator().manual_seed(seed)
    steps = torch.arange(seq_len, dtype=torch.float32)
    season = torch.sin(2 * torch.pi * steps / 24)[None] * torch.rand(count, 1, generator=generator)
    walk = torch.randn(count, seq_len, generator=generator).cumsum(1) * 0.3 + 3 * season + 10 * torch.rand(
        count, 1, generator=generator)
    walk[::4] = 0.05 * steps + 0.1 * torch.randn(walk[::4].shape, generator=generator)
    return walk


def crosscheck():
    import tirex2

    lines = ["| seq_len | pred_len | TTA sign flip | series | vs the package as released (compiled): max abs / max "
             "relative (of the largest \\|forecast\\|) | vs the package eager: max abs / relative | frames the "
             "package's call compiled |", "|---|---|---|---|---|---|---|"]
    torch._dynamo.reset()  # what an earlier call compiled, or ran eagerly, is forgotten
    count, rows = 0, []
    with tempfile.TemporaryDirectory() as root:
        for n, (seq_len, pred_len, flip) in enumerate(CASES):
            folder, count = released_folder(Path(root) / str(n), tta_sign_flip=flip)
            reference = tirex2.load_model(str(folder), device="cpu")
            series = windows(8, seq_len)
            with torch.no_grad():
                got = ours(folder, seq_len, pred_len).forecast(series)
            before = compiled_frames()
            rows.append([seq_len, pred_len, flip, got, reference, series,
                         package_forecast(reference, series, pred_len, compiled=True), compiled_frames() - before])
        # the eager calls after every compiled one: a frame first run with TorchDynamo disabled is not compiled later
        for row in rows:
            seq_len, pred_len, flip, got, reference, series, compiled, frames = row
            cells = []
            for want in (compiled, package_forecast(reference, series, pred_len, compiled=False)):
                difference = float((got - want).abs().max())
                relative = difference / float(want.abs().max())
                cells.append(f"{difference:.3g} / {relative:.3g} ({'ok' if relative <= 1e-5 else 'FAILS 1e-5'})")
            lines.append(f"| {seq_len} | {pred_len} | {'yes' if flip else 'no'} | 8 (2 trending) | {cells[0]} | "
                         f"{cells[1]} | {frames} |")
    lines += ["", f"{count:,} parameters. Ours: the folder read by utils.checkpoint.load_weights into "
              "models/foundation/tirex2/TiRex2.py, one forward of the 8 series (padded to a multiple of 8 rows); the "
              "package: tirex2.load_model(folder, device='cpu').forecast(batch_size=64), its own prediction path "
              "(TiRex2.predict), compiled as released (TorchInductor patch embeddings) and with TorchDynamo disabled."]
    return lines


def speed():
    import tirex2

    seq_len, pred_len, count, rounds = (SPEED[k] for k in ("seq_len", "pred_len", "series", "rounds"))
    torch._dynamo.reset()  # the compiled path compiles afresh: crosscheck()'s eager calls are forgotten
    paths = ("compiled", "ours", "eager")  # compiled first: a frame first run with Dynamo disabled stays eager
    times = {name: [] for name in paths}
    with tempfile.TemporaryDirectory() as root:
        folder, _ = released_folder(root)
        model, reference = ours(folder, seq_len, pred_len), tirex2.load_model(str(folder), device="cpu")
        series = windows(count, seq_len)
        batch = series[..., None]

        def run(name):
            started = time.perf_counter()
            if name == "ours":
                with torch.no_grad():
                    model(batch)
            else:
                package_forecast(reference, series, pred_len, compiled=name == "compiled")
            return time.perf_counter() - started

        before = compiled_frames()
        warm = {name: run(name) for name in paths}  # the compiled path builds its kernels here (it runs first)
        frames = compiled_frames() - before
        for _ in range(rounds):
            for name in paths:
                times[name].append(run(name))
    median = {name: statistics.median(values) for name, values in times.items()}
    lines = [f"{count} series of {seq_len} steps (the whole context_len), horizon {pred_len}, "
             f"{torch.get_num_threads()} threads, {rounds} interleaved rounds after one warm-up call each (median)", "",
             "| path | seconds | windows/s | first call (s) |", "|---|---|---|---|"]
    labels = {"ours": "ours: Model(x) [64, 2048, 1]",
              "compiled": "package: load_model(...).forecast(batch_size=64), as released (Inductor patch embeddings)",
              "eager": "package: the same with TorchDynamo disabled"}
    for name in paths:
        lines.append(f"| {labels[name]} | {median[name]:.2f} | {count / median[name]:.1f} | {warm[name]:.1f} |")
    lines += ["", f"ours / package windows/s: {median['compiled'] / median['ours']:.2f} against the compiled path, "
              f"{median['eager'] / median['ours']:.2f} against the eager one ({frames} frames compiled by the "
              "package's first call, none by ours). Both run every series' 2368 steps "
              "(context_len + future_len: 74 patches) through the same 12 blocks; the package's first call compiles."]
    return lines
