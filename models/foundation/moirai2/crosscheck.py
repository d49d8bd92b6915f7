"""Moirai 2.0 (Moirai2.py) against the official uni2ts 2.0.0 at the released configuration's shapes
(Salesforce/moirai-2.0-R-small: d_model 384, 6 layers of 6 heads, d_ff 1024, patch 16, 4 tokens a step, 9
quantile levels: 11,387,208 parameters), random weights written as the release is (Moirai2Module.save_pretrained:
config.json + model.safetensors).

    cd /work/main && /work/venvs/uni2ts/bin/python benchmarks/foundation_crosscheck.py --models Moirai2
    /work/venvs/uni2ts/bin/python -m models.foundation.moirai2.crosscheck --write-fixture   # tests/fixture/

The reference environment: the OFFICIAL package, installed without its pins beside torch 2.13 (uni2ts 2.0.0
declares torch < 2.5, numpy ~= 1.26, gluonts ~= 0.14.3; its Moirai 2.0 model code runs unchanged under torch
2.13, numpy 2.4 and gluonts 0.17, gluonts 0.14 being uninstallable beside numpy 2):

    python -m venv --system-site-packages /work/venvs/uni2ts
    /work/venvs/uni2ts/bin/pip install --no-deps uni2ts==2.0.0
    echo "torch==$(python -c 'import torch; print(torch.__version__)')" > /tmp/constraints.txt
    /work/venvs/uni2ts/bin/pip install -c /tmp/constraints.txt jaxtyping lightning gluonts "pandas<3"

(jaxtyping, lightning and gluonts are what uni2ts.model.moirai2 imports; the system site packages give torch,
einops, huggingface_hub and safetensors.) Why the result is trustworthy: the reference is uni2ts's own code,
unmodified, run through its own prediction path (Moirai2Forecast.predict: padding, packed std scaler, causal
packed attention mask, recursive multi-quantile decoding); the only thing the newer versions could change is
numerics of torch's kernels, which both sides share, and ours is written separately from the facts.

crosscheck(): our quantiles (the folder loaded through utils.checkpoint.load_weights) against
Moirai2Forecast(...).predict(series) on the same windows: contexts of 512 (whole patches), 500 (left-padded) and
4000 (the context of GIFT-Eval's official notebook, notebooks/moirai2.ipynb), horizons of 4 tokens (one forward)
and of more (rolled out: 96 steps, and ETT's long horizon 720, 45 tokens);
then our export read back by Moirai2Module.from_pretrained.
speed(): zero-shot over the same windows, one CPU process, 64 series a batch: ours (one call) against
Moirai2Forecast.predict, medians of interleaved rounds."""
import argparse
import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]  # models/foundation/<release>/crosscheck.py
FIXTURE = Path(__file__).resolve().parent / "tests" / "fixture"
CASES = ((512, 64), (500, 64), (512, 96), (4000, 720))  # (seq_len, pred_len): 4 tokens, padded, rolled out
SPEED = {"cases": ((512, 64), (512, 96)), "series": 64, "rounds": 5}
# The tests' fixture: the released architecture at a tiny size (1 head of 64, patch 4, 2 tokens a step).
TINY = {"attn_dropout_p": 0.0, "d_ff": 16, "d_model": 64, "dropout_p": 0.0, "max_seq_len": 64, "num_layers": 2,
        "num_predict_token": 2, "patch_size": 4, "quantile_levels": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
        "scaling": True}
FIXTURE_SEQ_LEN, FIXTURE_HORIZONS = 30, (8, 21)  # 30 steps: 8 patches, 2 steps of padding; 2 tokens; 6 rolled out


def reference_module(config, seed=0):
    """uni2ts's Moirai2Module at `config`, its own initialisation, norms' weights moved off 1 (so they count)."""
    from uni2ts.model.moirai2 import Moirai2Module

    torch.manual_seed(seed)
    module = Moirai2Module(**config)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, value in module.named_parameters():
            if "norm" in name:
                value.add_(0.2 * torch.randn(value.shape, generator=generator))
    return module.eval()


def released_folder(root, config=None, seed=0):
    """root/moirai-2.0-R-small: the reference's save_pretrained at `config` (default: the release's)."""
    from models.foundation.moirai2.adapter import RELEASED

    folder = Path(root) / "moirai-2.0-R-small"
    reference_module(dict(config or RELEASED), seed).save_pretrained(str(folder))
    return folder


def ours(folder, seq_len, pred_len):
    from models.foundation.moirai2 import Moirai2
    from exp.export import load_weights

    configs = Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=str(folder))
    return load_weights(Moirai2.Model(configs), str(folder)).eval()


def reference_forecast(folder, batch, pred_len, module=None):
    """Moirai2Forecast.predict (uni2ts's prediction path) on every channel of `batch` [B, L, C]: [B, H, C, 9]."""
    from uni2ts.model.moirai2 import Moirai2Forecast, Moirai2Module

    count, seq_len, channels = batch.shape
    module = module or Moirai2Module.from_pretrained(str(folder))
    forecaster = Moirai2Forecast(prediction_length=pred_len, target_dim=1, feat_dynamic_real_dim=0,
                                 past_feat_dynamic_real_dim=0, context_length=seq_len, module=module)
    series = batch.permute(0, 2, 1).reshape(count * channels, seq_len).numpy()
    quantiles = torch.from_numpy(forecaster.predict(list(series)))  # [N, 9, H]
    return quantiles.reshape(count, channels, -1, pred_len).permute(0, 3, 1, 2)


def windows(count, seq_len, channels, seed=1):
    generator = torch.Generator().manual_seed(seed)
    steps = torch.arange(seq_len, dtype=torch.float32)
    season = torch.sin(2 * torch.pi * steps / 24)[None, :, None] * torch.rand(count, 1, channels, generator=generator)
    return (torch.randn(count, seq_len, channels, generator=generator).cumsum(1) * 0.3 + 3 * season
            + 10 * torch.rand(count, 1, channels, generator=generator))


def _row(seq_len, pred_len, got, want, what):
    difference = float((got - want).abs().max())
    relative = difference / float(want.abs().max())
    verdict = "ok" if relative <= 1e-5 else "FAILS 1e-5"
    tokens = -(-pred_len // 16)
    return f"| {what} | {seq_len} | {pred_len} ({tokens} tokens) | {difference:.3g} | {relative:.3g} ({verdict}) |"


def crosscheck():
    from exp.export import export

    lines = ["| check | seq_len | pred_len | max abs difference | max relative difference (of the largest |quantile|) |",
             "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as root:
        folder = released_folder(root)
        for seq_len, pred_len in CASES:
            batch = windows(2, seq_len, 3)
            with torch.no_grad():
                got = ours(folder, seq_len, pred_len)(batch)
            lines.append(_row(seq_len, pred_len, got, reference_forecast(folder, batch, pred_len),
                              "ours vs Moirai2Forecast.predict, 2 x 3 series"))
        # our weights (changed, so not the folder's) exported to the release's layout, read back by uni2ts
        model = ours(folder, 512, 96)
        with torch.no_grad():
            for value in model.parameters():
                value.mul_(1.01)
        source = Path(root) / "ours.pth"
        torch.save({"model": model.state_dict()}, source)
        exported = Path(root) / "exported"
        export(str(source), str(exported), "moirai2")
        batch = windows(2, 512, 3, seed=2)
        with torch.no_grad():
            got = model(batch)
        lines.append(_row(512, 96, got, reference_forecast(exported, batch, 96),
                          "our export read by Moirai2Module.from_pretrained"))
    lines += ["", "Ours: the folder read by utils.checkpoint.load_weights into models/foundation/moirai2/Moirai2.py, one call for the 6 "
              "series (B*C rows); the reference: uni2ts 2.0.0's Moirai2Forecast(...).predict(list of series), its own "
              "prediction path (CPU, float32). 96 and 720 steps are 6 and 45 tokens: the 4 of the first forward, the "
              "rest by recursive multi-quantile decoding (9 paths, 81 values a step collapsed to 9 quantiles)."]
    return lines


def _timed(call):
    """(wall seconds, this process's CPU seconds) of call(): the CPU time is the steadier figure on a shared machine."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def speed():
    count, rounds = SPEED["series"], SPEED["rounds"]
    lines = [f"{count} series a batch, {torch.get_num_threads()} threads, {rounds} interleaved rounds: median wall "
             "seconds (windows/s) and median CPU seconds of the process", "",
             "| seq_len | pred_len | ours | uni2ts Moirai2Forecast.predict | ours / reference windows/s (wall) | "
             "reference / ours CPU seconds |", "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as root:
        folder = released_folder(root)
        from uni2ts.model.moirai2 import Moirai2Module

        module = Moirai2Module.from_pretrained(str(folder))
        for seq_len, pred_len in SPEED["cases"]:
            model, batch = ours(folder, seq_len, pred_len), windows(count, seq_len, 1)
            times = {"ours": [], "reference": []}
            for _ in range(rounds):
                with torch.no_grad():
                    times["ours"].append(_timed(lambda: model(batch)))
                times["reference"].append(_timed(lambda: reference_forecast(folder, batch, pred_len, module)))
            (ours_s, ours_cpu), (ref_s, ref_cpu) = ([statistics.median(t[i] for t in times[k]) for i in (0, 1)]
                                                    for k in ("ours", "reference"))
            lines.append(f"| {seq_len} | {pred_len} | {ours_s:.3f} s ({count / ours_s:.0f}/s); CPU {ours_cpu:.2f} s | "
                         f"{ref_s:.3f} s ({count / ref_s:.0f}/s); CPU {ref_cpu:.2f} s | {ref_s / ours_s:.2f} | "
                         f"{ref_cpu / ours_cpu:.2f} |")
    lines += ["", "Both run the same network; ours forwards only the tokens up to the last one forecast (the "
              "reference also runs the horizon's placeholder tokens, masked out), uses PyTorch's causal "
              "scaled_dot_product_attention instead of a materialised [rows, heads, T, T] float mask (the any-"
              "variate bias is a constant per head for one variate), and projects only the last token's output."]
    return lines


def write_fixture(folder=FIXTURE):
    """The tests' golden folder: TINY written by uni2ts's save_pretrained, and expected.safetensors holding the
    windows [2, 30, 3] and the reference's quantiles for each horizon (forecast_<H>: [2, H, 3, 9])."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    module = reference_module(dict(TINY), seed=3)
    module.save_pretrained(str(folder))
    (folder / "README.md").unlink(missing_ok=True)  # huggingface_hub's model card: not part of the weights
    batch = windows(2, FIXTURE_SEQ_LEN, 3, seed=4)
    batch[1, :, 2] = 7.0  # a constant series: std 0, scale sqrt(1e-5)
    tensors = {"windows": batch.contiguous()}
    for horizon in FIXTURE_HORIZONS:
        tensors[f"forecast_{horizon}"] = reference_forecast(folder, batch, horizon, module).contiguous()
    save_file(tensors, str(folder / "expected.safetensors"))
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-fixture", action="store_true")
    if parser.parse_args().write_fixture:
        print(f"written {write_fixture()}")
