"""Toto 2.0 (Toto2.py) against the toto2 package (timecopilot-toto-2 0.1.1, DataDog/toto's toto2 code) through its
own Toto2Model.forecast (one forward, decode_block_size None), random weights written as the release is
(PyTorchModelHubMixin.save_pretrained: config.json + model.safetensors).

    cd /work/main && /work/venvs/toto2/bin/python benchmarks/foundation_crosscheck.py --models Toto2
    /work/venvs/toto2/bin/python -m models.foundation.toto2.crosscheck --write-fixture   # tests/fixture/

The reference environment: the package pins gluonts 0.17, which pins pandas < 3, so it lives in a venv over this
project's packages (torch 2.13, numpy 2.4 stay; pandas 2.3.3 inside the venv only):

    python -m venv --system-site-packages /work/venvs/toto2
    /work/venvs/toto2/bin/pip install timecopilot-toto-2==0.1.1

Why the result is trustworthy: the reference is the package's own code, unmodified, through its own forecast
path; ours is written apart from it, from its code and unit_scaling's read as facts.

crosscheck(): our quantiles (the folder loaded through exp.export.load_weights) against Toto2Model.forecast on the
same windows: the 2.5B release's flags at a reduced width (every code path of the 2.5B: xPos, per-dim scale,
attention biases, one variate layer last), a GQA + qk-norm + plain-RoPE variant, the 2.5B's width at 4 of its 48
layers, each channel alone and several variates of one series together; the 2.5B's full shape (one 9.8 GB copy
of the weights, shared by both sides; `--full-only` runs it alone, `--no-full` leaves it out); then our export
read back by Toto2Model.from_pretrained.
speed(): zero-shot at batch 64, ours against Toto2Model.forecast, medians of interleaved rounds."""
import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import torch

FIXTURE = Path(__file__).resolve().parent / "tests" / "fixture"
# The tests' fixture: the 2.5B release's flags at a tiny size; GQA (4 heads over 2 key/value groups).
TINY = {"attn_bias": True, "d_ff": 24, "d_model": 32, "dropout_p": 0.0, "layer_group_size": 3, "mlp_bias": False,
        "norm_eps": 0.0005, "norm_include_weight": False, "num_groups": 2, "num_heads": 4, "num_layers": 3,
        "num_output_patches": 1, "num_variate_layers_per_group": 1, "patch_size": 8, "per_dim_scale": True,
        "pre_norm": True, "qk_dim": 8, "qk_norm": False, "qk_norm_include_weight": False,
        "residual_attn_ratio": 5.136215466577748, "residual_mult": 0.75, "use_xpos": True, "v_dim": 8,
        "variate_layer_first": False}
FIXTURE_SEQ_LEN, FIXTURE_HORIZONS = 48, (8, 21)  # 6 patches; one patch, three (the last 3 steps past)
FIXTURE_BLOCK = 8  # decode_block_size: the 21 steps decoded a patch at a time
# The 2.5B release's flags at reduced width and depth, and a variant of the other code paths (qk norm, plain RoPE,
# a variate layer first of each group of two)
REDUCED = {**TINY, "d_model": 256, "d_ff": 680, "num_heads": 4, "num_groups": 4, "qk_dim": 64, "v_dim": 64,
           "num_layers": 4, "layer_group_size": 4, "patch_size": 32}
VARIANT = {**REDUCED, "qk_norm": True, "use_xpos": False, "per_dim_scale": False, "attn_bias": False,
           "num_groups": 2, "layer_group_size": 2, "variate_layer_first": True, "residual_mult": 1.0,
           "residual_attn_ratio": 2.0}
# The 2.5B's width (d_model 2048, 32 heads of 64, d_ff 5464) at 4 of its 48 layers: 1 GB a copy on a shared machine
WIDE = {**REDUCED, "d_model": 2048, "d_ff": 5464, "num_heads": 32, "num_groups": 32, "qk_dim": 64, "v_dim": 64}
CASES = ((512, 64), (500, 96), (4096, 720))  # (seq_len, pred_len)
BLOCK = 256  # decode_block_size of the rolled-out checks: 720 steps in 3 forwards
SPEED = {"config": REDUCED, "seq_len": 4096, "pred_len": 96, "series": 64, "rounds": 3}


def reference_model(config, seed=0):
    """toto2's Toto2Model at `config`, its own initialisation, then biases and per-dim scales moved off 0."""
    from toto2 import Toto2Model
    from toto2.configuration import Toto2ModelConfig

    torch.manual_seed(seed)
    fields = {f.name for f in dataclasses.fields(Toto2ModelConfig)}
    model = Toto2Model(Toto2ModelConfig(**{k: v for k, v in config.items() if k in fields}))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, value in model.named_parameters():
            if name.endswith("bias") or "per_dim_scale" in name:
                value.add_(0.3 * torch.randn(value.shape, generator=generator))
    return model.eval()


def released_folder(root, config, seed=0, name="Toto-2.0"):
    folder = Path(root) / name
    reference_model(dict(config), seed).save_pretrained(str(folder))
    (folder / "README.md").unlink(missing_ok=True)
    return folder


def ours(folder, seq_len, pred_len):
    from exp.export import load_weights
    from models.foundation.toto2 import Toto2

    configs = Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=str(folder))
    return load_weights(Toto2.Model(configs), str(folder)).eval()


def reference_forecast(model, batch, pred_len, joint=False, block=None):
    """Toto2Model.forecast on a window batch [B, L, C]: each channel its own series ([B*C, 1, L], our default),
    or, joint, the window's channels one series ([B, C, L], series id 0): [B, H, C, 9]."""
    count, length, channels = batch.shape
    if joint:
        target = batch.permute(0, 2, 1)
    else:
        target = batch.permute(0, 2, 1).reshape(count * channels, 1, length)
    inputs = {"target": target, "target_mask": torch.ones_like(target, dtype=torch.bool),
              "series_ids": torch.zeros(target.shape[:-1], dtype=torch.long)}
    out = model.forecast(inputs, pred_len, decode_block_size=block)  # [9, rows, V, H]
    return out.reshape(9, count, channels, pred_len).permute(1, 3, 2, 0)


def known_inputs(batch, known):
    """A window's channels one series with a future-known row (known [B, 1, L + H], its last steps unobserved
    past the first half of the horizon), the package's known_dynamic: (target [B, C, L], its ids, known, mask, ids)."""
    target = batch.permute(0, 2, 1)
    mask = torch.ones_like(known, dtype=torch.bool)
    mask[..., batch.shape[1] + (known.shape[-1] - batch.shape[1]) // 2:] = False
    ids = torch.zeros(known.shape[:-1], dtype=torch.long)
    return target, torch.zeros(target.shape[:-1], dtype=torch.long), known, mask, ids


def reference_known(model, batch, known, pred_len, block=None):
    """Toto2Model.forecast with known_dynamic rows: [B, H, C, 9]."""
    target, ids, known, mask, known_ids = known_inputs(batch, known)
    inputs = {"target": target, "target_mask": torch.ones_like(target, dtype=torch.bool), "series_ids": ids,
              "known_dynamic": known, "known_dynamic_mask": mask, "known_dynamic_series_ids": known_ids}
    return model.forecast(inputs, pred_len, decode_block_size=block).permute(1, 3, 2, 0)


def our_known(model, batch, known, pred_len, block=None):
    target, ids, known, mask, known_ids = known_inputs(batch, known)
    return model.forecast(target, series_ids=ids, horizon=pred_len, known=known, known_mask=mask,
                          known_ids=known_ids, block=block).permute(1, 3, 2, 0)


def our_forecast(model, batch, joint=False, block=None, horizon=None):
    target = batch[:, -model.context:].permute(0, 2, 1)
    if not joint and block is None and horizon is None:
        return model(batch)
    if not joint:
        count, channels, length = target.shape
        out = model.forecast(target.reshape(count * channels, 1, length), horizon=horizon,
                             block=block)  # [9, B*C, 1, H]
        return out.reshape(9, count, channels, -1).permute(1, 3, 2, 0)
    out = model.forecast(target, series_ids=torch.zeros(target.shape[:-1], dtype=torch.long), horizon=horizon,
                         block=block)
    return out.permute(1, 3, 2, 0)


def windows(count, seq_len, channels, seed=1):
    generator = torch.Generator().manual_seed(seed)
    steps = torch.arange(seq_len, dtype=torch.float32)
    season = torch.sin(2 * torch.pi * steps / 24)[None, :, None] * torch.rand(count, 1, channels, generator=generator)
    return (torch.randn(count, seq_len, channels, generator=generator).cumsum(1) * 0.3 + 3 * season
            + 10 * torch.rand(count, 1, channels, generator=generator))


def _row(what, seq_len, pred_len, got, want):
    difference = float((got - want).abs().max())
    relative = difference / float(want.abs().max())
    verdict = "ok" if relative <= 1e-5 else "FAILS 1e-5"
    return f"| {what} | {seq_len} | {pred_len} | {difference:.3g} | {relative:.3g} ({verdict}) |"


def crosscheck(full=True):
    from exp.export import export

    lines = ["| check | seq_len | pred_len | max abs difference | max relative difference (of the largest |quantile|) |",
             "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as root:
        for label, config in (("2.5B flags, d_model 256, 4 layers", REDUCED),
                              ("GQA, qk norm, RoPE, variate layers first", VARIANT),
                              ("2.5B width (d_model 2048, 32 heads, d_ff 5464), 4 layers", WIDE)):
            folder = released_folder(root, config, name=label.split(",")[0].replace(" ", "_").replace(".", ""))
            from toto2 import Toto2Model

            reference = Toto2Model.from_pretrained(str(folder))
            for seq_len, pred_len in CASES:
                batch = windows(2, seq_len, 3)
                model = ours(folder, seq_len, pred_len)
                for joint, block in ((False, None), (True, None), *(((False, BLOCK), (True, BLOCK))
                                                                    if pred_len > BLOCK else ())):
                    with torch.no_grad():
                        got = our_forecast(model, batch, joint, block)
                    want = reference_forecast(reference, batch[:, -model.context:], pred_len, joint, block)
                    mode = ("3 channels one series" if joint else "each channel alone") + (
                        f", decoded in blocks of {block}" if block else "")
                    lines.append(_row(f"{label}: {mode}", seq_len, pred_len, got, want))
            if config is REDUCED:  # our weights (changed) exported, read back by the package
                with torch.no_grad():
                    for value in model.parameters():
                        value.mul_(1.01)
                source = Path(root) / "ours.pth"
                torch.save({"model": model.state_dict()}, source)
                exported = Path(root) / "exported"
                export(str(source), str(exported), "toto2")
                batch = windows(2, 4096, 3, seed=2)
                with torch.no_grad():
                    got = model(batch)
                lines.append(_row("our export read by Toto2Model.from_pretrained", 4096, 720, got,
                                  reference_forecast(Toto2Model.from_pretrained(str(exported)), batch, 720)))
            del reference
        if full:
            lines.append(full_width())
    lines += ["", "Ours: the folder read by exp.export.load_weights into models/foundation/toto2/Toto2.py; the reference: "
              "toto2's Toto2Model.from_pretrained(folder).forecast(inputs, horizon) (one forward, its default; "
              f"decode_block_size={BLOCK} where decoded in blocks: medians fed back, its KV cache), CPU, float32. "
              "A seq_len not whole patches (500) loses its oldest steps in ours; the reference is given the same "
              "whole-patch window (its GluonTS wrapper cuts so)."]
    return lines


def full_width(root=None):
    """The 2.5B release's shape (d_model 2048, 48 layers, 2,454,281,792 parameters) with one copy of the weights in
    memory (9.8 GB): the reference at random weights forecasts first; ours, built on the meta device, is then given
    the same tensors (load_state_dict(assign=True): shared, not copied) and forecasts the same windows. The file
    reader is the smaller checks' (the layout is the same at every size)."""
    import gc

    from models.foundation.toto2 import Toto2
    from models.foundation.toto2.adapter import RELEASED

    reference = reference_model(dict(RELEASED), seed=7)
    batch = windows(1, 512, 2)
    with torch.no_grad():
        want = reference_forecast(reference, batch, 64)
        rolled = reference_forecast(reference, batch, 720, block=BLOCK)
    with torch.device("meta"):
        model = Toto2.Model(Namespace(seq_len=512, pred_len=64, pretrain_model_path=None, d_model=2048, n_heads=32,
                                      e_layers=48, d_ff=5464))
    model.toto.load_state_dict(reference.state_dict(), strict=True, assign=True)
    model.level_bits = torch.tensor(model.quantile_levels, dtype=torch.float32).view(torch.int32)
    del reference
    gc.collect()
    count = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        got = model.eval()(batch)
        rolled_ours = our_forecast(model, batch, block=BLOCK, horizon=720)
    what = f"the 2.5B release's shape ({count:,} parameters, 48 layers), each channel alone"
    return "\n".join([_row(what, 512, 64, got, want),
                      _row(f"{what}, decoded in blocks of {BLOCK}", 512, 720, rolled_ours, rolled)])


def _timed(call):
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def speed():
    count, rounds, seq_len, pred_len = SPEED["series"], SPEED["rounds"], SPEED["seq_len"], SPEED["pred_len"]
    lines = [f"{count} series a batch, context {seq_len}, horizon {pred_len}, the 2.5B flags at d_model 256 and 4 "
             f"layers (a 2-core CPU), {torch.get_num_threads()} threads, {rounds} interleaved rounds: median wall "
             "seconds and CPU seconds", "",
             "| ours | toto2 Toto2Model.forecast | ours / reference windows/s (wall) | reference / ours CPU seconds |",
             "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as root:
        from toto2 import Toto2Model

        folder = released_folder(root, SPEED["config"])
        reference, model = Toto2Model.from_pretrained(str(folder)), ours(folder, seq_len, pred_len)
        batch = windows(count, seq_len, 1)
        times = {"ours": [], "reference": []}
        for _ in range(rounds):
            with torch.no_grad():
                times["ours"].append(_timed(lambda: model(batch)))
                times["reference"].append(_timed(lambda: reference_forecast(reference, batch, pred_len)))
        (ours_s, ours_cpu), (ref_s, ref_cpu) = ([statistics.median(t[i] for t in times[k]) for i in (0, 1)]
                                                for k in ("ours", "reference"))
        lines.append(f"| {ours_s:.3f} s ({count / ours_s:.1f}/s); CPU {ours_cpu:.2f} s | {ref_s:.3f} s "
                     f"({count / ref_s:.1f}/s); CPU {ref_cpu:.2f} s | {ref_s / ours_s:.2f} | {ref_cpu / ours_cpu:.2f} |")
    lines += ["", "Both run the same forward; the reference builds float masks for every time layer "
              "(has_missing_values), ours the causal kernel where every patch is observed and a variate layer over "
              "one variate as its value projection."]
    return lines


def write_fixture(folder=FIXTURE):
    """The tests' golden folder: TINY written by the package's save_pretrained, and expected.safetensors holding
    the windows [2, 48, 3], the reference's quantiles for each horizon, each channel alone (forecast_<H>), the
    3 channels one series (joint_<H>) and with a future-known row `known` [2, 1, 48 + 21] (known_<H>), and the 21
    steps decoded in blocks of a patch, each way (block_21, block_joint_21, block_known_21), all [2, H, 3, 9]."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model = reference_model(dict(TINY), seed=3)
    model.save_pretrained(str(folder))
    (folder / "README.md").unlink(missing_ok=True)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    batch = windows(2, FIXTURE_SEQ_LEN, 3, seed=4)
    batch[1, :, 2] = 7.0  # a constant series: scale at the floor
    tensors = {"windows": batch.contiguous()}
    generator = torch.Generator().manual_seed(5)
    known = torch.randn(2, 1, FIXTURE_SEQ_LEN + max(FIXTURE_HORIZONS), generator=generator).cumsum(-1)
    tensors["known"] = known.contiguous()
    for horizon in FIXTURE_HORIZONS:
        tensors[f"forecast_{horizon}"] = reference_forecast(model, batch, horizon).contiguous()
        tensors[f"joint_{horizon}"] = reference_forecast(model, batch, horizon, joint=True).contiguous()
        tensors[f"known_{horizon}"] = reference_known(model, batch, known[..., :FIXTURE_SEQ_LEN + horizon],
                                                      horizon).contiguous()
    horizon = max(FIXTURE_HORIZONS)  # decoded in blocks of one patch (3 forwards, medians fed back)
    tensors[f"block_{horizon}"] = reference_forecast(model, batch, horizon, block=FIXTURE_BLOCK).contiguous()
    tensors[f"block_joint_{horizon}"] = reference_forecast(model, batch, horizon, joint=True,
                                                           block=FIXTURE_BLOCK).contiguous()
    tensors[f"block_known_{horizon}"] = reference_known(model, batch, known, horizon, block=FIXTURE_BLOCK).contiguous()
    save_file(tensors, str(folder / "expected.safetensors"))
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-fixture", action="store_true")
    parser.add_argument("--no-full", action="store_true", help="without the 2.5B shape (about 10 GB of memory)")
    parser.add_argument("--full-only", action="store_true", help="the 2.5B shape alone")
    options = parser.parse_args()
    if options.write_fixture:
        print(f"written {write_fixture()}")
    elif options.full_only:
        print(full_width())
    else:
        print("\n".join(crosscheck(not options.no_full)))
