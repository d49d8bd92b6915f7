"""Time-MoE (TimeMoE.py) against Time-MoE's own code at the released configurations' shapes (TimeMoE-50M:
hidden 384, intermediate 1536; TimeMoE-200M: hidden 768, intermediate 3072; both 12 layers of 12 heads, 8 experts,
top-2, heads [1, 8, 32, 64]), random weights saved by the reference (save_pretrained: config.json +
model.safetensors, the released layout). Run in the reference's environment:

    /work/venvs/timemoe/bin/python benchmarks/foundation_crosscheck.py --models TimeMoE
    /work/venvs/timemoe/bin/python -m models.foundation.time_moe.crosscheck --write-fixture  # tests/fixture/

The reference is Time-MoE/Time-MoE at d3524fd (time_moe/models/modeling_time_moe.py, ts_generation_mixin.py,
configuration_time_moe.py; Apache-2.0), which needs transformers 4.40.1 (its requirements.txt; under transformers
5 its generate and attention-mask helpers are gone, so sktime's vendored copy imports but cannot forecast). The
environment, recreated with:

    python -m venv --system-site-packages /work/venvs/timemoe      # torch 2.13 and this repository's deps
    /work/venvs/timemoe/bin/pip install transformers==4.40.1 tokenizers==0.19.1 huggingface_hub==0.36.2
    mkdir -p /work/venvs/timemoe/src/Time-MoE && git -C <clone of github.com/Time-MoE/Time-MoE> archive d3524fd \\
        time_moe README.md LICENSE | tar -x -C /work/venvs/timemoe/src/Time-MoE

(TIME_MOE_SRC names another place of that source.) crosscheck(): our forecasts (the folder loaded through
utils.checkpoint.load_weights) against the reference's predict path, Time-MoE's README: each series standardised
(mean, unbiased standard deviation), model.generate(normed, max_new_tokens=pred_len), scaled back; one head
(pred_len 1) and rolled out (96 = 64 + 32; 720 = 11 x 64 + 2 x 8); also the training loss (the reference's
forward with labels and loss masks: Huber per head, averaged, + 0.02 x balancing) against ours, and a fine-tuned
state of ours exported with `--to time-moe` and read back by TimeMoeForPrediction.from_pretrained.
speed(): zero-shot, 64 series a batch, one CPU process: ours (one call, all channels) against the README path
(generate on the batch), medians of interleaved rounds."""
import os
import statistics
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]  # models/foundation/<release>/crosscheck.py
SOURCE = os.environ.get("TIME_MOE_SRC", "/work/venvs/timemoe/src/Time-MoE")
FIXTURE = Path(__file__).resolve().parent / "tests" / "fixture"
# The fixture's reduced configuration: the released one at small sizes (2 layers, 4 experts).
TINY = {"hidden_size": 24, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 2, "num_experts": 4}
FIXTURE_CASES = ((96, 1), (96, 20), (96, 96))  # (seq_len, pred_len): one head; 8 + 8 + 1 x 4; 64 + 32
# (seq_len, pred_len) per size: one head (1), rolled out (96 = 64 + 32; 720 = 11 x 64 + 2 x 8)
CASES = {"50M": ((512, 1), (512, 96), (1024, 720)), "200M": ((512, 1), (512, 96))}
SPEED = {"seq_len": 256, "pred_len": 96, "series": 64, "rounds": 2, "sizes": ("50M",)}


def reference():
    """Time-MoE's modeling module (TimeMoeForPrediction, TimeMoeConfig), or SystemExit naming the environment."""
    import transformers

    if not transformers.__version__.startswith("4.40"):
        raise SystemExit(f"Time-MoE's code needs transformers 4.40.1 (this is {transformers.__version__}): run with "
                         "/work/venvs/timemoe/bin/python (models/foundation/time_moe/crosscheck.py says how to make it)")
    if SOURCE not in sys.path:
        sys.path.insert(0, SOURCE)
    from time_moe.models.configuration_time_moe import TimeMoeConfig
    from time_moe.models.modeling_time_moe import TimeMoeForPrediction

    return TimeMoeForPrediction, TimeMoeConfig


def released_folder(root, size="50M", seed=0, **overrides):
    """root/TimeMoE-<size>: the reference model at that configuration (or `overrides` of it), random weights of
    unit-scale activations (weights N(0, 1/fan_in), biases N(0, 0.1^2), norms 1 + N(0, 0.1^2)), saved by
    save_pretrained: config.json + model.safetensors."""
    from models.foundation.time_moe.adapter import released_config

    model_class, config_class = reference()
    config = {k: v for k, v in released_config(size, **overrides).items() if k not in ("architectures", "model_type")}
    model = model_class(config_class(**config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.named_parameters():
            noise = torch.randn(value.shape, generator=generator)
            value.copy_(noise / value.shape[-1] ** 0.5 if value.dim() > 1 else 0.1 * noise + ("norm" in name))
    folder = Path(root) / f"TimeMoE-{size}"
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def ours(folder, seq_len, pred_len, use_norm=1):
    from models.foundation.time_moe import TimeMoE
    from exp.export import load_weights

    configs = Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=str(folder), use_norm=use_norm)
    return load_weights(TimeMoE.Model(configs), str(folder)).eval()


def readme_forecast(model, series, pred_len):
    """Time-MoE's README predict path on series [N, L]: standardise, generate, scale back -> [N, pred_len]."""
    mean, std = series.mean(dim=-1, keepdim=True), series.std(dim=-1, keepdim=True)
    with torch.no_grad():
        out = model.generate(((series - mean) / std).clone(), max_new_tokens=pred_len)  # generate edits its input
    return out[:, -pred_len:] * std + mean


def reference_loss(model, sequence):
    """The reference's training loss on sequences [N, T+1] (its window dataset's input_ids / labels / loss_masks)."""
    labels = sequence[:, 1:].clone()
    out = model(input_ids=sequence[:, :-1].clone(), labels=labels, loss_masks=torch.ones_like(labels),
                return_dict=True)
    return out.loss


def windows(count, seq_len, seed=1):
    generator = torch.Generator().manual_seed(seed)
    walk = torch.randn(count, seq_len, generator=generator).cumsum(1) * 0.5
    season = torch.sin(torch.arange(seq_len) * 2 * torch.pi / 24)
    return walk + 3 * season + 10


def relative(got, want):
    return ((got - want).abs().max() / want.abs().max()).item()


def our_forecast(model, series):
    """Our model on series [N, L] as N windows of one channel -> [N, pred_len]."""
    with torch.no_grad():
        return model(series.unsqueeze(-1))[..., 0]


# ------------------------------------------------------------ the committed fixture (tests)
def write_fixture(folder=FIXTURE):
    """tests/fixture/: the reference at TINY sizes in the released layout, and its outputs:
    forecasts of 4 windows (README path) at FIXTURE_CASES, and its training loss on 4 sequences."""
    import shutil

    with tempfile.TemporaryDirectory() as root:
        made = released_folder(root, "50M", seed=0, **TINY)
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "model.safetensors", "generation_config.json"):
            shutil.copy(made / name, folder / name)
    model_class, _ = reference()
    model = model_class.from_pretrained(str(folder)).eval()
    outputs = {"windows": windows(4, 96)}
    for seq_len, pred_len in FIXTURE_CASES:
        outputs[f"forecast_{seq_len}_{pred_len}"] = readme_forecast(model, outputs["windows"][:, -seq_len:], pred_len)
    outputs["sequence"] = torch.randn(4, 41, generator=torch.Generator().manual_seed(2))
    model.train()
    with torch.no_grad():
        outputs["loss"] = reference_loss(model, outputs["sequence"])
        outputs["loss_first_two"] = reference_loss(model, outputs["sequence"][:2])
    torch.save(outputs, folder / "reference_outputs.pt")
    return folder


# ------------------------------------------------------------ crosscheck and speed
def crosscheck():
    model_class, _ = reference()
    lines = ["Max relative difference (|ours - reference| / max |reference|, float32) of the forecasts of 4 windows "
             "(2 at 1024 steps; random walk + daily season), our Model through load_weights against "
             "Time-MoE's README "
             "path "
             "(standardise, TimeMoeForPrediction.generate, scale back); heads used per the reference's rule.", "",
             "| size | parameters | seq_len | pred_len | heads used | max rel. diff |", "|---|---|---|---|---|---|"]
    worst = 0.0
    with tempfile.TemporaryDirectory() as root:
        for size in ("50M", "200M"):
            folder = released_folder(root, size)
            reference_model = model_class.from_pretrained(str(folder)).eval()
            count = sum(p.numel() for p in reference_model.parameters())
            for seq_len, pred_len in CASES[size]:
                series = windows(4 if seq_len <= 512 else 2, seq_len)  # 2 of a long context: the reference's eager
                mine = ours(folder, seq_len, pred_len)                  # attention weights are 12 x L x L a series
                diff = relative(our_forecast(mine, series), readme_forecast(reference_model, series, pred_len))
                worst = max(worst, diff)
                lines.append(f"| {size} | {count:,} | {seq_len} | {pred_len} | {heads_used(mine)} | {diff:.2e} |")
            lines += loss_and_export_lines(folder, reference_model, model_class, size)
    lines += ["", f"Largest difference: {worst:.2e} (tolerance 1e-5)."]
    return lines


def heads_used(model):
    used, remaining = [], model.pred_len
    while remaining > 0:
        step = min(model.horizons[model.head_for(remaining)], remaining)
        used.append(str(step))
        remaining -= step
    return " + ".join(used)


def loss_and_export_lines(folder, reference_model, model_class, size):
    """The training loss of 4 sequences of 512 + 96 steps, ours (mean of the per-window losses) against the
    reference's forward with labels; then ours with every weight moved, exported and read back by the reference."""
    from exp.export import export

    sequence = windows(4, 608, seed=3)
    sequence = (sequence - sequence.mean(1, keepdim=True)) / sequence.std(1, keepdim=True)
    mine = ours(folder, 512, 96, use_norm=0)
    with torch.no_grad():
        got = mine(sequence[:, :512, None], target=sequence[:, 512:, None]).mean()
        want = reference_loss(reference_model.train(), sequence)
    reference_model.eval()
    lines = [f"| {size} | training loss, 512 + 96 | | | all four, + balancing | {relative(got, want):.2e} |"]
    mine = ours(folder, 512, 96)  # forecasts standardised as the README path standardises them
    with torch.no_grad():
        for parameter in mine.parameters():
            parameter.mul_(1.01)
    with tempfile.TemporaryDirectory() as scratch:
        torch.save(mine.state_dict(), os.path.join(scratch, "checkpoint.pth"))
        export(os.path.join(scratch, "checkpoint.pth"), os.path.join(scratch, "exported"), to="time-moe")
        back = model_class.from_pretrained(os.path.join(scratch, "exported")).eval()
        series = windows(4, 512)
        diff = relative(our_forecast(mine, series), readme_forecast(back, series, 96))
    lines.append(f"| {size} | exported (`--to time-moe`), read by from_pretrained | | 96 | 64 + 32 | {diff:.2e} |")
    return lines


def speed():
    model_class, _ = reference()
    seq_len, pred_len, count = SPEED["seq_len"], SPEED["pred_len"], SPEED["series"]
    lines = [f"{count} series of {seq_len} steps, horizon {pred_len} (heads 64 + 32), {torch.get_num_threads()} "
             f"threads; {SPEED['rounds']} interleaved rounds (each path's times listed), medians.", "",
             "| size | ours (windows/s) | reference README path, generate (windows/s) | ours / reference |",
             "|---|---|---|---|"]
    series = windows(count, seq_len)
    with tempfile.TemporaryDirectory() as root:
        for size in SPEED["sizes"]:
            folder = released_folder(root, size)
            reference_model = model_class.from_pretrained(str(folder)).eval()
            mine = ours(folder, seq_len, pred_len)
            paths = {"ours": lambda: our_forecast(mine, series),
                     "reference": lambda: readme_forecast(reference_model, series, pred_len)}
            times = {name: [] for name in paths}
            for _ in range(SPEED["rounds"]):  # no warm-up (a call is minutes on 2 shared cores): both pay a first call
                for name, run in paths.items():
                    started = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - started)
            rate = {name: count / statistics.median(values) for name, values in times.items()}
            lines.append(f"| {size} | {rate['ours']:.2f} | {rate['reference']:.2f} | "
                         f"{rate['ours'] / rate['reference']:.2f} |")
            lines.append("")
            lines += [f"{name}: " + ", ".join(f"{t:.1f} s" for t in values) + " a batch"
                      for name, values in times.items()]
    return lines


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-fixture", action="store_true", help=f"write {FIXTURE.relative_to(REPO)}")
    if parser.parse_args().write_fixture:
        sys.path.insert(0, str(REPO))
        print(f"wrote {write_fixture()}")
