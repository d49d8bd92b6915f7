"""TimerBase (TimerBase.py) against the release's own code, thuml/timer-base-84m's modeling_timer.py as sktime
1.2 vendors it (sktime.libs.timer: TimerForPrediction, its generate), at the released configuration (hidden 1024,
8 layers of 8 heads, intermediate 2048, tokens of 96, one head of 96: 84,142,080 parameters), random weights saved
by the reference's save_pretrained (config.json + model.safetensors, the release's layout).

The reference's generate needs transformers 4.40 (the release pins transformers==4.40.1; under transformers 5 its
cache and mask helpers are gone), so this runs in a virtual environment of its own, which sees the system's
torch and our dependencies and the sktime venv's packages:

    python -m venv --system-site-packages /work/venvs/timer
    /work/venvs/timer/bin/pip install "transformers==4.40.1"
    echo /work/venvs/sktime/lib/python3.11/site-packages > \\
        /work/venvs/timer/lib/python3.11/site-packages/zz_sktime.pth   # sktime 1.2.0 (sktime.libs.timer)
    cd /work/main && /work/venvs/timer/bin/python benchmarks/foundation_crosscheck.py --models TimerBase
    cd /work/main && /work/venvs/timer/bin/python -m models.foundation.timer_base.crosscheck --write-fixture

crosscheck(): our forecasts (the folder loaded through utils.checkpoint.load_weights) against
TimerForPrediction.from_pretrained(folder).generate(context, max_new_tokens=pred_len) (its default cache) on the
same windows: one token (96) and rolled out (192, 250), contexts 672 and 2880 (and 700, not whole tokens); the
training objective against the reference's forward(labels=...) loss; our export read back by the reference.
speed(): zero-shot, one CPU process, 64 series a batch, ours against the reference's generate, interleaved rounds.
--write-fixture: tests/fixture/, the same at a tiny size, for
tests/test_timer_base.py."""
import json
import statistics
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]  # models/foundation/<release>/crosscheck.py
FIXTURE = Path(__file__).resolve().parent / "tests" / "fixture"
CASES = ((672, 96), (672, 192), (2880, 96), (2880, 192), (700, 250))  # (seq_len, pred_len)
SPEED = {"seq_len": 2880, "horizons": (96, 192), "series": 64, "rounds": 3}
TINY = {"input_token_len": 8, "output_token_lens": [8], "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 2, "num_attention_heads": 2}
FIXTURE_CASES = ((40, 8), (45, 20), (16, 24))  # one token; a context of 5 whole tokens + 5 left out, rolled out


def reference_model(config, seed=0):
    """sktime.libs.timer's TimerForPrediction at `config` (the released one's fields over TimerConfig's), random
    weights: every Linear N(0, 1/fan_in), LayerNorms 1 + N(0, 0.1) and biases N(0, 0.1), so none is trivial."""
    from sktime.libs.timer import TimerConfig, TimerForPrediction

    from models.foundation.timer_base.adapter import RELEASED

    fields = {k: v for k, v in {**RELEASED, **config}.items() if k not in ("architectures", "auto_map")}
    model = TimerForPrediction(TimerConfig(**fields))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.named_parameters():
            noise = torch.randn(value.shape, generator=generator)
            if value.dim() > 1:
                value.copy_(noise / value.shape[1] ** 0.5)
            else:
                value.copy_(0.1 * noise + (1.0 if "norm" in name and name.endswith("weight") else 0.0))
    return model.eval()


def save_release(model, folder):
    """The reference's save_pretrained (model.safetensors + config.json), the release's auto_map added."""
    from models.foundation.timer_base.adapter import RELEASED

    model.save_pretrained(folder, safe_serialization=True)
    config = json.loads((Path(folder) / "config.json").read_text())
    config["auto_map"] = RELEASED["auto_map"]
    (Path(folder) / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return Path(folder)


def ours(folder, seq_len, pred_len):
    from models.foundation.timer_base import TimerBase
    from exp.export import load_weights

    configs = Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=str(folder))
    return load_weights(TimerBase.Model(configs), str(folder)).eval()


def reference_forecast(model, windows, pred_len):
    """generate on every channel of `windows` [B, L, C] as one batch: [B, pred_len, C]."""
    batch, seq_len, channels = windows.shape
    series = windows.transpose(1, 2).reshape(batch * channels, seq_len)
    with torch.no_grad():
        out = model.generate(series, max_new_tokens=pred_len)
    return out.reshape(batch, channels, pred_len).transpose(1, 2)


def reference_losses(model, windows, future):
    """The reference's training loss (forward(input_ids, labels)) of each window's series, normalised by its
    context's statistics as TimerBase.py normalises it: [B * C] (pred_len whole tokens of one head)."""
    token = model.config.input_token_len
    batch, seq_len, channels = windows.shape
    context = windows[:, seq_len % token:].transpose(1, 2).reshape(batch * channels, -1)
    sequence = torch.cat((context, future.transpose(1, 2).reshape(batch * channels, -1)), dim=1)
    mean, std = context.mean(-1, keepdim=True), context.std(-1, keepdim=True)
    sequence = (sequence - mean) / std
    with torch.no_grad():
        return torch.stack([model(input_ids=row[None, :-token], labels=row[None, token:], return_dict=True).loss
                            for row in sequence])


def windows(count, seq_len, channels, seed=1):
    generator = torch.Generator().manual_seed(seed)
    steps = torch.arange(seq_len, dtype=torch.float32)
    season = torch.sin(2 * torch.pi * steps / 24)[None, :, None] * torch.rand(count, 1, channels, generator=generator)
    return (torch.randn(count, seq_len, channels, generator=generator).cumsum(1) * 0.3 + 3 * season
            + 10 * torch.rand(count, 1, channels, generator=generator))


def _relative(got, want):
    difference = float((got - want).abs().max())
    return difference, difference / float(want.abs().max())


def crosscheck():
    lines = ["| seq_len | pred_len | windows x channels | max abs difference | max relative difference (of the largest "
             "\\|forecast\\|) |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as root:
        reference = reference_model({})
        folder = save_release(reference, Path(root) / "timer-base-84m")
        worst = 0.0
        for seq_len, pred_len in CASES:
            batch = windows(2, seq_len, 3)
            with torch.no_grad():
                got = ours(folder, seq_len, pred_len)(batch)
            difference, relative = _relative(got, reference_forecast(reference, batch, pred_len))
            worst = max(worst, relative)
            lines.append(f"| {seq_len} | {pred_len} | 2 x 3 | {difference:.3g} | {relative:.3g} "
                         f"({'ok' if relative <= 1e-5 else 'FAILS 1e-5'}) |")
        lines += ["", *_objective_and_export(reference, folder, Path(root)),
                  "", f"Parameters: {sum(p.numel() for p in reference.parameters()):,}. Ours: the folder read by "
                  "utils.checkpoint.load_weights into models/foundation/timer_base/TimerBase.py, one forward of the 6 series; the reference: "
                  "TimerForPrediction.generate(series, max_new_tokens=pred_len) (transformers 4.40.1, its default "
                  f"cache), CPU, float32. Largest forecast difference {worst:.3g}."]
    return lines


def _objective_and_export(reference, folder, root):
    """The training loss against the reference's; our export read back by the reference's from_pretrained."""
    from sktime.libs.timer import TimerForPrediction

    from exp.export import export

    from utils.checkpoint import save_atomic

    batch, future = windows(2, 672, 3), windows(2, 192, 3, seed=2)
    model = ours(folder, 672, 192)
    with torch.no_grad():
        got = model.loss(batch.transpose(1, 2).reshape(6, -1), future.transpose(1, 2).reshape(6, -1))
    _, loss_relative = _relative(got, reference_losses(reference, batch, future))
    with torch.no_grad():  # a changed model (as fine-tuning leaves it), exported and read by the reference
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    save_atomic(model.state_dict(), root / "tuned.pth")
    export(str(root / "tuned.pth"), str(root / "exported"), "timer-base")
    back = TimerForPrediction.from_pretrained(root / "exported").eval()
    with torch.no_grad():
        _, export_relative = _relative(model(batch), reference_forecast(back, batch, 192))
    return [f"Training objective, 672 + 192 steps (9 tokens scored), 2 x 3 series: our per-series next-token MSE "
            f"against the reference's forward(input_ids, labels).loss: max relative difference {loss_relative:.3g}.",
            f"Export: our weights (perturbed) written by `python -m exp.export export --to timer-base`, read by "
            f"TimerForPrediction.from_pretrained: forecasts 672 -> 192 max relative difference {export_relative:.3g}."]


def speed():
    seq_len, count, rounds = SPEED["seq_len"], SPEED["series"], SPEED["rounds"]
    lines = [f"{count} series of {seq_len} steps, {torch.get_num_threads()} threads, {rounds} interleaved rounds "
             "(median seconds)", "", "| horizon | ours: Model(x) [64, L, 1] | reference: generate(batch of 64) | "
             "ours windows/s | reference windows/s | ours / reference |", "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as root:
        reference = reference_model({})
        folder = save_release(reference, Path(root) / "timer-base-84m")
        batch = windows(count, seq_len, 1)
        for horizon in SPEED["horizons"]:
            model = ours(folder, seq_len, horizon)
            times = {"ours": [], "reference": []}
            for _ in range(rounds):
                for name, run in (("ours", lambda: model(batch)),
                                  ("reference", lambda: reference_forecast(reference, batch, horizon))):
                    started = time.perf_counter()
                    with torch.no_grad():
                        run()
                    times[name].append(time.perf_counter() - started)
            ours_s, ref_s = statistics.median(times["ours"]), statistics.median(times["reference"])
            lines.append(f"| {horizon} | {ours_s:.2f} | {ref_s:.2f} | {count / ours_s:.1f} | {count / ref_s:.1f} | "
                         f"{ref_s / ours_s:.2f} |")
    lines += ["", "Both run the same computation: the context's 30 tokens once, then (192) one more token against "
              "the cached keys and values."]
    return lines


def write_fixture(folder=FIXTURE):
    """A tiny release folder (TINY, written by the reference) and the reference's outputs on fixed windows:
    forecasts at FIXTURE_CASES and the training loss of 40 + 16 steps, in reference.safetensors."""
    from safetensors.torch import save_file

    reference = reference_model(TINY, seed=3)
    save_release(reference, folder)
    outputs = {}
    for seq_len, pred_len in FIXTURE_CASES:
        batch = windows(3, seq_len, 2, seed=seq_len)
        outputs[f"windows_{seq_len}"] = batch
        outputs[f"forecast_{seq_len}_{pred_len}"] = reference_forecast(reference, batch, pred_len)
    future = windows(3, 16, 2, seed=5)
    outputs["future_16"] = future
    outputs["loss_40_16"] = reference_losses(reference, outputs["windows_40"], future)
    save_file({k: v.contiguous() for k, v in outputs.items()}, str(folder / "reference.safetensors"))
    return folder


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    if "--write-fixture" in sys.argv:
        print(f"wrote {write_fixture()}")
