"""Sundial (Sundial.py) against the reference code (thuml/sundial-base-128m's modeling_sundial.py and
flow_loss.py, as sktime 1.2 vendors them: sktime.libs.sundial), at the released configuration (hidden 768, 12
layers of 12 heads, intermediate 3072, tokens of 16, one output token of 720, TimeFlow depth 3, 50 sampling steps,
diffusion_batch_mul 4: 128M parameters), random weights saved by the reference's own save_pretrained:

- crosscheck(): the same noise given to both (the reference's torch.randn / randn_like / rand patched to return
  what ours drew through layers.noise, reordered to its (sample, series) rows): decoder states, flow velocities,
  the flow-matching training loss, and generate(revin=True)'s samples (one output token, and rolled out past it,
  on a context that is not whole tokens), then ours exported (python -m exp.export export --to sundial) and
  read back by SundialForPrediction.from_pretrained;
- speed(): zero-shot over 64 windows (one channel) on one CPU process, 20 samples each: ours (one forward, the 9
  quantiles of the samples) against the reference's generate(num_samples=20) (the samples alone), interleaved
  rounds, medians;
- write_fixture(): the tiny-configuration folder and reference outputs tests/test_sundial.py checks
  ours against without the reference installed (tests/fixture/).

The reference's generate runs only under transformers 4.40 (its cache and mask helpers are gone from
transformers 5), so it runs in its own virtual environment, which sees torch 2.13 and this repository's packages
from the system and sktime from /work/venvs/sktime:

    python -m venv --system-site-packages /work/venvs/sundial
    /work/venvs/sundial/bin/pip install "transformers==4.40.1"
    echo /work/venvs/sktime/lib/python3.11/site-packages > \\
        /work/venvs/sundial/lib/python3.11/site-packages/zz_sktime.pth   # sktime 1.2.0 (pandas < 3.1)
    cd /work/main && /work/venvs/sundial/bin/python benchmarks/foundation_crosscheck.py --models Sundial
    cd /work/main && /work/venvs/sundial/bin/python -m models.foundation.sundial.crosscheck --write-fixture
"""
import contextlib
import json
import statistics
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path
from unittest import mock

import torch

REPO = Path(__file__).resolve().parents[3]  # models/foundation/<release>/crosscheck.py
sys.path.insert(0, str(REPO))

TOLERANCE = 1e-5
FIXTURE = Path(__file__).resolve().parent / "tests" / "fixture"
# The fixture's configuration: every size its own and small; a context of 30 steps (not whole tokens of 4), a
# horizon of 30 (12 + 12 + 6: two roll-out steps).
TINY = {"input_token_len": 4, "hidden_size": 16, "intermediate_size": 24, "output_token_lens": [12],
        "num_hidden_layers": 2, "num_attention_heads": 2, "flow_loss_depth": 2, "num_sampling_steps": 3,
        "diffusion_batch_mul": 2, "dropout_rate": 0.1}
CASES = ((2880, 720), (1000, 1000))  # (seq_len, pred_len): one output token; a padded context rolled out
LOSS_CASE = (2880, 96)
WINDOWS, CHANNELS, SAMPLES = 2, 2, 20
SPEED = {"windows": 64, "seq_len": 512, "pred_len": 96, "samples": 20, "rounds": 4}


# ------------------------------------------------------------ the reference
def reference_class():
    from sktime.libs.sundial import SundialConfig, SundialForPrediction

    return SundialConfig, SundialForPrediction


def reference_folder(folder, config=None, seed=0):
    """`folder` written by the reference's save_pretrained: SundialForPrediction at `config` (the released one
    when None), every weight drawn at random (its own init zeroes the flow head's output and modulations)."""
    SundialConfig, SundialForPrediction = reference_class()
    model = SundialForPrediction(SundialConfig(**(config or {})))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.named_parameters():
            draw = torch.randn(value.shape, generator=generator)
            if value.dim() > 1:
                value.copy_(draw / value.shape[1] ** 0.5)
            else:
                value.copy_(0.1 * draw + (1.0 if "norm" in name or "ln" in name else 0.0))
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def reference_model(folder):
    return reference_class()[1].from_pretrained(str(folder)).eval()


@contextlib.contextmanager
def given_draws(randn=(), rand=(), randn_like=()):
    """torch.randn / rand / randn_like return the given tensors in turn (the reference draws through them)."""
    queues = {"randn": list(randn), "rand": list(rand), "randn_like": list(randn_like)}

    def take(name):
        return lambda *args, **kwargs: queues[name].pop(0).clone()

    with mock.patch("torch.randn", take("randn")), mock.patch("torch.rand", take("rand")), \
            mock.patch("torch.randn_like", take("randn_like")):
        yield
    assert not any(queues.values()), "the reference drew fewer numbers than given"


@contextlib.contextmanager
def recorded_draws(record):
    """layers.noise's randn / rand as usual (unkeyed: torch's), each draw appended to record[name]."""
    from layers import noise

    originals = {"randn": noise.randn, "rand": noise.rand}

    def recording(name):
        def draw(*args, **kwargs):
            out = originals[name](*args, **kwargs)
            record.setdefault(name, []).append(out.clone())
            return out
        return draw

    with mock.patch.object(noise, "randn", recording("randn")), mock.patch.object(noise, "rand", recording("rand")):
        yield


def to_reference_rows(draw, samples):
    """Our sampler's noise, rows (series, sample), as the reference's rows (sample, series)."""
    return draw.view(-1, samples, draw.shape[-1]).transpose(0, 1).reshape(-1, draw.shape[-1])


def reference_samples(reference, series, pred_len, samples, draws):
    """generate(revin=True)'s samples [N, S, pred_len] given our sampler's draws (one per roll-out step)."""
    with given_draws(randn=[to_reference_rows(d, samples) for d in draws]), torch.no_grad():
        return reference.generate(series, max_new_tokens=pred_len, num_samples=samples, revin=True)


def training_inputs(series, future, token, output_len):
    """The reference's forward(labels=...) inputs for ours' objective: labels (each token's next steps),
    loss_masks (whole tokens) and mask_y (the first pred_len steps), as sktime's collator lays them out."""
    tokens = -(-series.shape[1] // token)
    pad = tokens * token - series.shape[1]
    useful = min(future.shape[1], output_len)
    full = torch.cat([series, future], dim=1)[:, token - pad:]
    # past the future: the context's mean, which revin turns into ours' zeros (the steps are not scored, but the
    # flow network reads the whole noised target)
    tail = series.mean(1, keepdim=True).expand(-1, output_len - useful)
    labels = torch.cat([full[:, :(tokens - 1) * token + useful], tail], dim=1)
    loss_masks = torch.ones(series.shape[0], tokens)
    loss_masks[:, 0] = 1.0 if pad == 0 else 0.0
    mask_y = torch.zeros(series.shape[0], output_len)
    mask_y[:, :useful] = 1.0
    return labels, loss_masks, mask_y


def reference_loss(reference, series, future, draws, mul):
    """forward(labels, revin=True).loss given our draws: rows (series, repeat, token) -> (repeat, series, token);
    revin normalises the labels by the context's statistics, as ours does the future."""
    config = reference.config
    labels, loss_masks, mask_y = training_inputs(series, future, config.input_token_len, config.output_token_lens[-1])
    rows = series.shape[0]

    def reorder(x):
        return x.view(rows, mul, -1, *x.shape[1:]).transpose(0, 1).reshape(x.shape)

    with given_draws(randn_like=[reorder(draws["randn"][0])], rand=[reorder(draws["rand"][0])]), torch.no_grad():
        return reference(input_ids=series, labels=labels, loss_masks=loss_masks, mask_y=mask_y, revin=True,
                         return_dict=True).loss


# ------------------------------------------------------------ ours
def ours(folder, seq_len, pred_len, samples=SAMPLES):
    from models.foundation.sundial import Sundial
    from exp.export import load_weights

    configs = Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=str(folder), num_samples=samples)
    return load_weights(Sundial.Model(configs), str(folder)).eval()


def our_samples(model, series):
    record = {}
    with recorded_draws(record), torch.no_grad():
        out = model.samples(series)
    return out, record["randn"]


def our_loss(model, series, future):
    record = {}
    with recorded_draws(record), torch.no_grad():
        out = model.loss(series, future)
    return out, record


def windows(count, seq_len, channels, seed=1):
    generator = torch.Generator().manual_seed(seed)
    steps = torch.arange(seq_len, dtype=torch.float32)
    season = torch.sin(2 * torch.pi * steps / 24)[None, :, None] * torch.rand(count, 1, channels, generator=generator)
    return (torch.randn(count, seq_len, channels, generator=generator).cumsum(1) * 0.3 + 3 * season
            + 10 * torch.rand(count, 1, channels, generator=generator))


def relative(got, want):
    return float((got - want).abs().max()) / float(want.abs().max())


# ------------------------------------------------------------ the checks
def compare(folder, reference, seq_len, pred_len):
    """{what: max relative difference} of ours (from `folder`) and the reference on the same series."""
    model = ours(folder, seq_len, pred_len)
    series = windows(WINDOWS, seq_len + pred_len, CHANNELS).transpose(1, 2).reshape(-1, seq_len + pred_len)
    context, future = series[:, :seq_len], series[:, seq_len:]
    out = {}
    with torch.no_grad():
        out["decoder states"] = relative(model.encode(context), reference.model(input_ids=context)[0])
        z = torch.randn(8, model.flow.cond_embed.in_features)
        x, t = torch.randn(8, model.output_len), torch.rand(8) * 1000
        out["flow velocities"] = relative(model.flow(x, t, z), reference.flow_loss.net(x, t, z))
    got, draws = our_samples(model, context)
    out[f"samples ({len(draws)} output token{'s' if len(draws) > 1 else ''})"] = relative(
        got, reference_samples(reference, context, pred_len, SAMPLES, draws))
    if (seq_len, pred_len) == LOSS_CASE or seq_len % model.token == 0:
        loss, record = our_loss(model, context, future[:, :LOSS_CASE[1]])
        out["flow-matching loss"] = relative(loss.mean(), reference_loss(reference, context, future[:, :LOSS_CASE[1]],
                                                                         record, model.diffusion_batch_mul))
    return out


def crosscheck():
    lines = ["| seq_len | pred_len | series | compared | max relative difference |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as root:
        folder = reference_folder(Path(root) / "sundial")
        reference = reference_model(folder)
        parameters = sum(p.numel() for p in reference.parameters())
        for seq_len, pred_len in CASES:
            for what, value in compare(folder, reference, seq_len, pred_len).items():
                verdict = "ok" if value <= TOLERANCE else "FAILS 1e-5"
                lines.append(f"| {seq_len} | {pred_len} | {WINDOWS * CHANNELS} | {what} | {value:.3g} ({verdict}) |")
        exported = export_check(folder, Path(root))
        lines.append(f"| 2880 | 720 | {WINDOWS * CHANNELS} | ours exported, samples of the reference reading it | "
                     f"{exported:.3g} ({'ok' if exported <= TOLERANCE else 'FAILS 1e-5'}) |")
    lines += ["", f"Released configuration, {parameters:,} parameters (random weights, the reference's "
              "save_pretrained). Ours: the folder read by utils.checkpoint.load_weights into models/foundation/sundial/Sundial.py; the "
              "reference: SundialForPrediction.from_pretrained(folder), its generate(revin=True, num_samples=20) "
              "(transformers 4.40.1), forward(labels, loss_masks, mask_y, revin=True).loss, model(...) and "
              "flow_loss.net(...). Both given the same noise: ours drawn through layers.noise, the reference's "
              "torch.randn / randn_like / rand patched to return it in its row order. Relative: max |difference| "
              "over max |reference|."]
    return lines


def export_check(folder, root):
    """Ours exported to the release's layout, read by the reference: its samples against ours (same noise)."""
    from exp.export import export

    model = ours(folder, 2880, 720)
    path = root / "ours.pth"
    torch.save(model.state_dict(), path)
    export(str(path), str(root / "exported"), "sundial")
    reference = reference_model(root / "exported")
    context = windows(WINDOWS, 2880, CHANNELS, seed=3).transpose(1, 2).reshape(-1, 2880)
    got, draws = our_samples(model, context)
    return relative(got, reference_samples(reference, context, 720, SAMPLES, draws))


def speed():
    count, seq_len, pred_len, samples, rounds = (SPEED[k] for k in ("windows", "seq_len", "pred_len", "samples",
                                                                   "rounds"))
    with tempfile.TemporaryDirectory() as root:
        folder = reference_folder(Path(root) / "sundial")
        reference, model = reference_model(folder), ours(folder, seq_len, pred_len, samples)
        batch = windows(count, seq_len, 1)
        times, cpu = {"ours": [], "reference": []}, {"ours": [], "reference": []}
        runs = {"ours": lambda: model(batch),
                "reference": lambda: reference.generate(batch[..., 0], max_new_tokens=pred_len, num_samples=samples,
                                                        revin=True)}
        for _ in range(rounds):
            for name, run in runs.items():
                started, started_cpu = time.perf_counter(), time.process_time()
                with torch.inference_mode():
                    run()
                times[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - started_cpu)  # this process's threads: less the others' load
    median = {name: statistics.median(values) for name, values in times.items()}
    median_cpu = {name: statistics.median(values) for name, values in cpu.items()}
    lines = [f"{count} windows of {seq_len} steps, horizon {pred_len}, {samples} samples, 50 sampling steps, "
             f"{torch.get_num_threads()} threads, {rounds} interleaved rounds (median; each round's seconds)", "",
             "| path | seconds | windows/s | CPU seconds | rounds (s) |", "|---|---|---|---|---|"]
    for name, label in (("ours", "ours: Model(x) [64, 512, 1] -> 9 quantiles of 20 samples"),
                        ("reference", "reference: generate(num_samples=20, revin=True)")):
        spread = ", ".join(f"{v:.1f}" for v in times[name])
        lines.append(f"| {label} | {median[name]:.2f} | {count / median[name]:.2f} | {median_cpu[name]:.1f} | "
                     f"{spread} |")
    ratios = ", ".join(f"{r / o:.2f}" for o, r in zip(times["ours"], times["reference"]))
    lines += ["", f"ours / reference windows/s: {median['reference'] / median['ours']:.2f} (rounds: {ratios}; CPU "
              f"seconds: {median_cpu['reference'] / median_cpu['ours']:.2f}). The same decoder pass; "
              "the flow head's modulations (adaLN of time + condition) depend on the series and the step only, so "
              "ours computes them once per series, the reference once per sample row (20 times)."]
    return lines


# ------------------------------------------------------------ the tests' fixture
def write_fixture(out=FIXTURE):
    """tests/fixture/: the reference at TINY written by save_pretrained (config.json +
    model.safetensors), and reference.safetensors: its outputs on fixed inputs, with the noise it was given."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    reference_folder(out, TINY, seed=7)
    reference = reference_model(out)
    generator = torch.Generator().manual_seed(11)
    context = torch.randn(6, 30, generator=generator).cumsum(1) + 4  # 3 windows of 2 channels, (window, channel)
    tensors = {"context": context}
    with torch.no_grad():
        tensors["decoder_states"] = reference.model(input_ids=context)[0]
        x, t = torch.randn(5, 12, generator=generator), torch.rand(5, generator=generator) * 1000
        z = torch.randn(5, 16, generator=generator)
        tensors.update(flow_x=x, flow_t=t, flow_z=z, velocities=reference.flow_loss.net(x, t, z))
    draws = [torch.randn(6 * 5, 12, generator=generator) for _ in range(3)]  # ours' rows (series, sample)
    tensors.update({f"sampler_noise_{i}": d for i, d in enumerate(draws)})
    tensors["samples"] = reference_samples(reference, context, 30, 5, draws)  # [6, 5, 30]
    series = torch.randn(6, 40, generator=generator).cumsum(1)  # 32 steps of context (8 tokens), 8 of future
    record = {"randn": [torch.randn(6 * 2 * 8, 12, generator=generator)], "rand": [torch.rand(6 * 2 * 8,
                                                                                             generator=generator)]}
    tensors.update(loss_series=series, loss_noise=record["randn"][0], loss_times=record["rand"][0])
    tensors["loss"] = reference_loss(reference, series[:, :32], series[:, 32:], record, 2).reshape(1)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "reference.safetensors"))
    (out / "README.md").write_text(
        "Written by `python -m models.foundation.sundial.crosscheck --write-fixture` (the reference, sktime.libs.sundial, "
        "transformers 4.40.1):\nconfig.json + model.safetensors (SundialForPrediction.save_pretrained at "
        f"{json.dumps(TINY)}, random weights) and reference.safetensors (its outputs on fixed inputs, with the "
        "noise it was given in our row order).\n")
    return out


if __name__ == "__main__":
    if "--write-fixture" in sys.argv:
        print(f"wrote {write_fixture()}")
