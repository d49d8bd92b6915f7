"""Toto 2.0 against the toto2 package through a committed fixture: tests/fixture/ (beside this file) is a tiny
configuration with the 2.5B release's flags (xPos, per-dim scale, attention biases, one variate layer, the last;
GQA: 4 heads over 2 key/value groups) in the released layout, written by the package's own save_pretrained, and
expected.safetensors holds the package's Toto2Model.forecast quantiles on fixed windows, each channel alone, a
window's 3 channels one series, and with a future-known row (known_dynamic) (models/foundation/toto2/crosscheck.py
--write-fixture, run in the side environment). Here: the folder loads through our adapter and forecasts those
quantiles; the training loss; the export's config; bad folders in one line. What every release shares is
tests/test_foundation.py's contract."""
import json
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from exp.export import export, load_weights
from models.foundation.toto2 import Toto2
from utils.errors import UserError

FIXTURE = Path(__file__).resolve().parent / "fixture"
SEQ_LEN, HORIZONS = 48, (8, 21)  # crosscheck.FIXTURE_SEQ_LEN / FIXTURE_HORIZONS


def configs(folder, seq_len, pred_len, **sizes):
    return Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=None if folder is None else str(folder),
                     **{"d_model": 16, "n_heads": 2, "e_layers": 2, "d_ff": 32, **sizes})


def ours(folder, seq_len, pred_len):
    return load_weights(Toto2.Model(configs(folder, seq_len, pred_len)), str(folder)).eval()


def joint(model, windows):
    target = windows.permute(0, 2, 1)
    out = model.forecast(target, series_ids=torch.zeros(target.shape[:-1], dtype=torch.long))
    return out.permute(1, 3, 2, 0)


@pytest.fixture(scope="module")
def expected():
    return load_file(FIXTURE / "expected.safetensors")


@pytest.mark.parametrize("horizon", HORIZONS, ids=["one-patch", "three-patches"])
def test_quantiles_equal_toto2_forecast(expected, horizon):
    """48 steps: 6 patches of 8; 8 steps one patch, 21 three (the last 3 steps past the horizon). Window 1's third
    channel is constant (its scale the scaler's floor). Each channel alone (the run's way) and the 3 channels one
    series (the variate layer attending across them)."""
    windows = expected["windows"]
    model = ours(FIXTURE, SEQ_LEN, horizon)
    with torch.no_grad():
        alone, together = model(windows), joint(model, windows)
    for got, want in ((alone, expected[f"forecast_{horizon}"]), (together, expected[f"joint_{horizon}"])):
        assert got.shape == want.shape == (2, horizon, 3, 9)
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert (together - alone).abs().max() > 1e-3 * alone.abs().max()  # the variate layer mixes the channels


@pytest.mark.parametrize("horizon", HORIZONS, ids=["one-patch", "three-patches"])
def test_future_known_rows_equal_toto2_forecasts_known_dynamic(expected, horizon):
    """A window's 3 channels one series with a future-known row (the package's known_dynamic: read beside the
    targets over context and horizon, its second half of the horizon unobserved, not forecast)."""
    from models.foundation.toto2.crosscheck import our_known

    windows, known = expected["windows"], expected["known"][..., :SEQ_LEN + horizon]
    with torch.no_grad():
        got = our_known(ours(FIXTURE, SEQ_LEN, horizon), windows, known, horizon)
    want = expected[f"known_{horizon}"]
    assert got.shape == want.shape == (2, horizon, 3, 9)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert (got - expected[f"joint_{horizon}"]).abs().max() > 1e-3 * want.abs().max()  # the row is read


def test_block_decoding_equals_toto2_forecast_with_decode_block_size(expected):
    """21 steps decoded a patch at a time (3 forwards, each block's median fed back as observed, the scaler run
    again), each channel alone, 3 channels one series, with a future-known row: the package's decode_block_size 8
    (its KV cache's keys at their own forward's xPos centre). One forward forecasts otherwise."""
    from models.foundation.toto2.crosscheck import FIXTURE_BLOCK, our_forecast, our_known

    windows = expected["windows"]
    model = ours(FIXTURE, SEQ_LEN, 21)
    with torch.no_grad():
        got = {"block_21": our_forecast(model, windows, block=FIXTURE_BLOCK),
               "block_joint_21": our_forecast(model, windows, joint=True, block=FIXTURE_BLOCK),
               "block_known_21": our_known(model, windows, expected["known"], 21, block=FIXTURE_BLOCK)}
    for name, values in got.items():
        want = expected[name]
        assert values.shape == want.shape == (2, 21, 3, 9)
        assert (values - want).abs().max() <= 1e-5 * want.abs().max(), name
    assert (got["block_21"] - expected["forecast_21"]).abs().max() > 1e-2 * want.abs().max()
    assert (got["block_21"][:, :8] - expected["forecast_8"]).abs().max() <= 1e-5 * want.abs().max()  # one forward
    by_configs = load_weights(Toto2.Model(configs(FIXTURE, SEQ_LEN, 21, decode_block_size=FIXTURE_BLOCK)),
                              str(FIXTURE)).eval()
    with torch.no_grad():
        assert (by_configs(windows) - got["block_21"]).abs().max() <= 1e-6 * want.abs().max()
    with pytest.raises(ValueError, match=r"decode_block_size 12 is not a positive multiple of the Toto 2.0 patch"):
        Toto2.Model(configs(FIXTURE, SEQ_LEN, 21, decode_block_size=12))


def test_run_py_decodes_in_blocks_with_decode_block_size(tmp_path):
    """--decode_block_size reaches the model run.py builds (its zero-shot metrics move off the one-forward run's);
    a size that is not whole patches is one line."""
    from helpers import ETTH1_ARGS, assert_ok, assert_one_error_line, records, run_cli, write_etth1_shaped
    from models.foundation.toto2.crosscheck import FIXTURE_BLOCK

    root = write_etth1_shaped(tmp_path / "data")
    argv = (*ETTH1_ARGS, "--root_path", root, "--model", "Toto2", "--is_training", 0, "--pretrain_model_path",
            FIXTURE, "--seq_len", SEQ_LEN, "--pred_len", 21, "--label_len", 0, "--test_windows", 4, "--val_windows",
            4, "--num_threads", 1)
    assert_ok(run_cli(tmp_path, *argv))
    assert_ok(run_cli(tmp_path, *argv, "--decode_block_size", FIXTURE_BLOCK))
    one, blocks = records(tmp_path)[-2:]
    assert blocks["args"]["decode_block_size"] == FIXTURE_BLOCK and blocks["mse"] != one["mse"]
    assert_one_error_line(run_cli(tmp_path, *argv, "--decode_block_size", 12),
                          "--decode_block_size 12 is not a positive multiple of the Toto 2.0 patch")


@pytest.mark.parametrize("part", ["per_dim_scale", "attn_tau", "xpos"])
def test_the_agreement_sees_a_changed_part(expected, part, monkeypatch):
    """Not vacuous: a 5 % larger per-dim scale or residual weight of one layer, or rotary position without xPos,
    moves the quantiles past the tolerance (xPos, over 9 positions of base 256: 6e-5 relative)."""
    model = ours(FIXTURE, SEQ_LEN, 21)
    layer = model.toto.transformer.layers[0]
    with torch.no_grad():
        if part == "per_dim_scale":
            layer.attn._pds.per_dim_scale.mul_(1.05)
        elif part == "attn_tau":
            layer.attn_tau.mul_(1.05)
        else:
            layer.attn.xpos = False
        got = model(expected["windows"])
    want = expected["forecast_21"]
    assert (got - want).abs().max() > 3e-5 * want.abs().max()


def test_a_window_forecasts_the_same_bits_alone_and_in_any_batch():
    """Each channel alone, its rows padded to a multiple of 8: a window's quantiles are the same bits in batches of
    1, 2, 3, 5 and 7 as in one of 32 (one thread, as the runs' tests; without the padding they differ by 1 ULP)."""
    model = ours(FIXTURE, 96, 24)
    windows = torch.randn(32, 96, 7, generator=torch.Generator().manual_seed(2)).cumsum(1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            whole = model(windows)
            for size in (1, 2, 3, 5, 7):
                assert torch.equal(torch.cat([model(windows[i:i + size]) for i in range(0, 32, size)]), whole), size
    finally:
        torch.set_num_threads(threads)


def test_a_bfloat16_copy_forecasts_near_the_float32_one(expected):
    """The network runs in its own dtype: the patch embeddings' input cast to it, the quantiles back to float32."""
    windows = expected["windows"]
    with torch.no_grad():
        full = ours(FIXTURE, SEQ_LEN, 21)(windows)
        half = ours(FIXTURE, SEQ_LEN, 21).to(torch.bfloat16)(windows.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16 and half.shape == full.shape
    assert (half.float() - full).abs().max() <= 0.02 * full.abs().max()


def test_a_context_not_whole_patches_loses_its_oldest_steps():
    """seq_len 53 = 6 patches of 8 and 5 steps: the oldest 5 are dropped (the package's GluonTS wrapper cuts so)."""
    windows = torch.randn(2, 53, 2, generator=torch.Generator().manual_seed(3)).cumsum(1)
    with torch.no_grad():
        assert torch.equal(ours(FIXTURE, 53, 8)(windows), ours(FIXTURE, 48, 8)(windows[:, 5:]))


def test_the_training_loss_is_the_forecasts_pinball_loss_in_the_models_space():
    """The loss of a window: the raw quantiles of the forecast's forward against asinh((y - loc) / scale), the
    pinball loss averaged over 9 levels and the horizon, then over channels; written apart from Model.training_loss.
    A perfect median alone is not zero (the other levels' spread)."""
    model = ours(FIXTURE, SEQ_LEN, 10)
    generator = torch.Generator().manual_seed(5)
    x, future = torch.randn(2, SEQ_LEN, 2, generator=generator).cumsum(1), torch.randn(2, 10, 2, generator=generator)
    with torch.no_grad():
        got = model(x, target=future)
        want = torch.zeros(2)
        for b in range(2):
            for c in range(2):
                row = x[b, :, c].view(1, 1, -1)
                raw, loc, scale = model.toto.forecast(row, torch.ones_like(row, dtype=torch.bool), None, 10, raw=True)
                truth = torch.asinh((future[b, :, c] - loc[0, 0, :10]) / scale[0, 0, :10])
                total = 0.0
                for k, level in enumerate(model.quantile_levels):
                    error = truth - raw[k, 0, 0, :10]
                    total += float(torch.where(error > 0, level * error, (level - 1) * error).mean())
                want[b] += total / 9 / 2
    assert torch.allclose(got, want, rtol=1e-5, atol=0)


def test_the_model_is_built_at_the_folders_sizes_and_without_one_at_configs():
    model = Toto2.Model(configs(FIXTURE, 96, 24))
    attention = model.toto.transformer.layers[0].attn
    assert (len(model.toto.transformer.layers), attention.heads, attention.groups, attention.qk, model.patch,
            model.toto.transformer.variate) == (3, 4, 2, 8, 8, [False, False, True])
    scratch = Toto2.Model(configs(None, 96, 24))
    assert (len(scratch.toto.transformer.layers), scratch.toto.transformer.layers[0].attn.heads, scratch.patch,
            scratch.toto.transformer.variate) == (2, 2, 32, [False, True])
    with pytest.raises(ValueError, match=r"at most 8192 patches of 8 steps .* --seq_len 65536 \+ --pred_len 8 make 8193"):
        Toto2.Model(configs(FIXTURE, 65536, 8))
    with pytest.raises(ValueError, match=r"--seq_len 7 is shorter than one Toto 2.0 patch \(8 steps\)"):
        Toto2.Model(configs(FIXTURE, 7, 8))


def test_the_released_size_is_2_454_281_792_parameters():
    """Without a folder, at the 2.5B's sizes (--d_model 2048 --n_heads 32 --e_layers 48 --d_ff 5464) on the meta
    device: the package's 2,454,281,792 parameters (its Toto2Model at the released config, counted there)."""
    with torch.device("meta"):
        model = Toto2.Model(configs(None, 4096, 96, d_model=2048, n_heads=32, e_layers=48, d_ff=5464))
    assert sum(p.numel() for p in model.parameters()) == 2_454_281_792
    assert len(model.state_dict()) == 444


def test_an_export_writes_the_releases_layout_and_config(tmp_path):
    """Changed weights exported: the fixture's tensor names and shapes, its config.json back from the weights'
    shapes and taus (residual_mult, residual_attn_ratio to rounding), read back alike."""
    model = ours(FIXTURE, 96, 24)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    torch.save(model.state_dict(), tmp_path / "checkpoint.pth")
    exported = tmp_path / "exported"
    export(str(tmp_path / "checkpoint.pth"), str(exported), "toto2")
    released, written = (load_file(folder / "model.safetensors") for folder in (FIXTURE, exported))
    assert {k: v.shape for k, v in written.items()} == {k: v.shape for k, v in released.items()}
    config, theirs = (json.loads((folder / "config.json").read_text()) for folder in (exported, FIXTURE))
    for key in ("residual_mult", "residual_attn_ratio"):
        assert config.pop(key) == pytest.approx(theirs.pop(key), rel=1e-5)
    assert config == theirs
    windows = torch.randn(2, 96, 3, generator=torch.Generator().manual_seed(3)).cumsum(1)
    with torch.no_grad():
        assert torch.equal(ours(exported, 96, 24)(windows), model(windows))


def test_a_truncated_or_foreign_folder_is_one_line(tmp_path):
    """Truncated weights, a config lacking Toto 2.0's fields, another model's config: each one line."""
    import shutil

    folder = tmp_path / "Toto-2.0"
    shutil.copytree(FIXTURE, folder)
    (folder / "expected.safetensors").unlink()
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(UserError, match=r"model.safetensors") as refused:
        ours(folder, 96, 24)
    assert "\n" not in str(refused.value)
    (folder / "config.json").write_text(json.dumps({"d_model": 32, "num_layers": 3}))
    with pytest.raises(UserError, match=r"lacks patch_size, num_heads, layer_group_size"):
        Toto2.Model(configs(folder, 96, 24))


def test_fev_bench_covariates_are_the_releases_rows():
    """benchmarks.fev_bench --covariates (covariates.py): two target columns one series, a past-only column as a
    target row, known columns over past and horizon (a categorical one as its ordinal codes), statics as constant
    known rows (a categorical one 0); the forecast is Model.forecast's on those rows, a NaN an unobserved step
    carrying the last value."""
    import numpy as np

    from models.foundation.toto2 import covariates

    generator = np.random.default_rng(0)
    length, horizon = 45, 10  # 45 steps: left-padded to 48, 6 patches of 8
    targets = generator.normal(size=(2, length + horizon)).cumsum(1) + 5
    targets[1, 20] = np.nan
    data = {"targets": [targets], "past": [[generator.normal(size=length + horizon)]],
            "known": [[generator.normal(size=length + horizon), np.array(["a", "b"] * 28)[:length + horizon]]],
            "static": [[3.0, "shop"]]}
    one = covariates.window_inputs(data, 0, 0, length, horizon, ["y1", "y2"])
    assert len(one["past"]) == 1 and len(one["known"]) == 4 and one["known"][1].tolist() == [0.0, 1.0] * 27 + [0.0]
    assert one["known"][2].tolist() == [3.0] * (length + horizon) and one["known"][3].tolist() == [0.0] * 55
    one["known"] = [one["known"][0], one["known"][2]]
    forecaster = covariates.CovariateForecaster(["--pretrain_model_path", str(FIXTURE)], "cpu", (0.1, 0.5, 0.9))
    got = forecaster.forecast([one], horizon)
    assert got.shape == (1, 2, 3, horizon)
    pad = lambda rows: torch.nn.functional.pad(torch.as_tensor(rows, dtype=torch.float32), (3, 0))  # noqa: E731
    rows = np.concatenate([targets[:, :length], data["past"][0][0][None, :length]])
    seen = pad(~np.isnan(rows)).bool()
    rows[1, 20] = rows[1, 19]
    known = np.stack([data["known"][0][0], np.full(length + horizon, 3.0)])
    model = ours(FIXTURE, 48, horizon)
    with torch.no_grad():
        want = model.forecast(pad(rows)[None], seen[None], torch.zeros(1, 3, dtype=torch.long), horizon,
                              known=pad(known)[None], known_mask=pad(np.ones_like(known)).bool()[None],
                              known_ids=torch.zeros(1, 2, dtype=torch.long))
    assert np.allclose(got[0], want[[0, 4, 8], 0, :2].permute(1, 0, 2).double().numpy(), rtol=0, atol=1e-6)
