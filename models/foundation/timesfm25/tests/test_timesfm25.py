"""TimesFM 2.5 against the timesfm package: a folder the package wrote (tests/writer.py: its module at
a reduced size, random weights, save_pretrained) forecasts what the package's compile(ForecastConfig)/forecast does
on the same windows, and an export of ours is what the package reads and forecasts from alike. What every release
shares (zero-shot and fine-tuning on several processes, the export's layout, the bad inputs) is
tests/test_foundation.py's contract."""
import math

import pytest
import torch

package = pytest.importorskip("timesfm.timesfm_2p5.timesfm_2p5_torch", reason="the timesfm package is not installed")
import timesfm  # noqa: E402

from models.foundation.timesfm25 import TimesFM25  # noqa: E402
from models.foundation.timesfm25.tests.writer import reduced_definition, write as write_timesfm25  # noqa: E402
from exp.export import export, load_weights  # noqa: E402

def reduce_package(monkeypatch):
    """The package's classes building the reduced module (its module reads the class attribute `config`)."""
    monkeypatch.setattr(package.TimesFM_2p5_200M_torch_module, "config", reduced_definition())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return package.TimesFM_2p5_200M_torch


@pytest.fixture
def reduced_package(monkeypatch):
    return reduce_package(monkeypatch)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    return write_timesfm25(tmp_path_factory.mktemp("timesfm25") / "timesfm-2.5-200m-pytorch")


def ours(folder, seq_len, pred_len):
    model = TimesFM25.Model(_configs(folder, seq_len, pred_len))
    return load_weights(model, str(folder)).eval()


def _configs(folder, seq_len, pred_len):
    from argparse import Namespace

    return Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=None if folder is None else str(folder), d_model=8, n_heads=2,
                     e_layers=1, d_ff=8)


def packages_forecast(package_class, folder, windows, pred_len):
    """The package's own prediction path on every channel of `windows` [B, L, C]: [B, pred_len, C, 9]."""
    reference = package_class.from_pretrained(str(folder), torch_compile=False)
    batch, seq_len, channels = windows.shape
    reference.compile(timesfm.ForecastConfig(max_context=seq_len, max_horizon=pred_len,
                                             per_core_batch_size=batch * channels, **TimesFM25.FORECAST_FLAGS))
    series = [windows[b, :, c].numpy() for b in range(batch) for c in range(channels)]
    _, quantiles = reference.forecast(horizon=pred_len, inputs=series)
    out = torch.from_numpy(quantiles[..., 1:]).float()  # without the mean
    return out.reshape(batch, channels, pred_len, -1).transpose(1, 2)


# The package sorts its quantiles (fix_quantile_crossing) and forecasts no value below 0 from a non-negative context.
QUANTILES_SORTED_NON_NEGATIVE = True


def zero_shot_quantiles(release, windows, pred_len, monkeypatch):
    """The package's own forecast of every channel of raw `windows` [B, L, C]: [B, pred_len, C, levels], for the
    checks of tests/ that hold a packaged release's zero-shot runs to its package (test_zero_shot, test_gift_eval)."""
    return packages_forecast(reduce_package(monkeypatch), release, windows, pred_len)


def windows_to_forecast(seq_len, channels=3):
    generator = torch.Generator().manual_seed(1)
    walk = torch.randn(4, seq_len, channels, generator=generator).cumsum(1) * 2 + 5
    walk[1] = walk[1].abs()  # non-negative: its forecast is clamped at 0
    walk[2, :, 0] = 3.0  # constant: std 0
    return walk


@pytest.mark.parametrize("seq_len, pred_len", [(48, 24), (96, 200), (40, 1000)],
                         ids=["padded-context", "rolled-out-horizon", "padded-rolled-out-seven-steps"])
def test_forecasts_equal_the_packages_compile_and_forecast(released, reduced_package, seq_len, pred_len):
    """48 steps are front-padded to 64 with masked zeros; 200 steps are 128 and one roll-out step of 128; 1000
    steps from a padded context are seven roll-out steps on the kept keys and values."""
    windows = windows_to_forecast(seq_len)
    with torch.no_grad():
        got = ours(released, seq_len, pred_len)(windows)
    want = packages_forecast(reduced_package, released, windows, pred_len)
    assert got.shape == want.shape == (4, pred_len, 3, 9)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.all(got[1] >= 0) and torch.all(got[..., 1:] >= got[..., :-1])  # clamped, never crossing


def test_a_layer_with_its_cache_is_the_packages_layer(released):
    """TimesFM25.transformer_layer (the package's Transformer with keys and values in and out) is layer(x, mask) bit
    for bit over a whole padded sequence, and its last patches run after the cache of the first are the whole's
    last patches (to float32 rounding: on a CPU scaled_dot_product_attention and the matrix products sum a row in
    an order that can depend on how many rows a call has)."""
    model = ours(released, 96, 200)
    layer = model.timesfm.stacked_xf[1]
    x = torch.randn(6, 11, 32, generator=torch.Generator().manual_seed(2))
    padding = torch.zeros(6, 11, dtype=torch.bool)
    padding[:, :3] = True
    masked = padding.to(torch.int32).sum(-1)
    with torch.no_grad():
        whole, kept = TimesFM25.transformer_layer(layer, x, masked, 0, None)
        assert torch.equal(whole, layer(x, padding)[0])
        head, kept = TimesFM25.transformer_layer(layer, x[:, :7], masked, 0, None)
        tail, _ = TimesFM25.transformer_layer(layer, x[:, 7:], masked, 7, kept)
    assert torch.equal(head, whole[:, :7]) or (head - whole[:, :7]).abs().max() <= 1e-6 * whole.abs().max()
    assert (tail - whole[:, 7:]).abs().max() <= 1e-6 * whole.abs().max()


def test_a_roll_out_step_runs_its_new_patches_only(released):
    """Each roll-out step feeds the layers its 4 new patches (the kept keys and values stand for the rest), and
    forecasts what a pass over the whole sequence does, to float32 rounding."""
    model = ours(released, 96, 1000)  # 3 patches, then 7 steps of 4
    seen = []
    original = TimesFM25.transformer_layer

    def counted(layer, x, *rest):
        seen.append(x.shape[1])
        return original(layer, x, *rest)

    TimesFM25.transformer_layer = counted
    try:
        with torch.no_grad():
            got = model(windows_to_forecast(96))
    finally:
        TimesFM25.transformer_layer = original
    assert seen == [3] * 2 + [4] * 2 * 7  # 2 layers
    whole = model.last_outputs
    rerun = []

    def without_cache(tokens, masks, spread, cache=None):  # the pass over all patches so far, every step
        if cache is not None:
            tokens, masks = torch.cat([rerun[-1][0], tokens], 1), torch.cat([rerun[-1][1], masks], 1)
        rerun.append((tokens, masks))
        return whole(tokens, masks, spread)

    model.last_outputs = without_cache
    with torch.no_grad():
        want = model(windows_to_forecast(96))
    assert (got - want).abs().max() <= 1e-6 * want.abs().max()


def test_the_reference_check_sees_a_changed_weight(released, reduced_package, tmp_path):
    """The agreement is not vacuous: one weight changed in the package's copy changes its forecast."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(released / "model.safetensors"))
    state["stacked_xf.1.ff0.weight"] = state["stacked_xf.1.ff0.weight"] * 1.01  # (ff1 feeds an RMSNorm: scale-free)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((released / "config.json").read_text())
    windows = windows_to_forecast(48)
    with torch.no_grad():
        got = ours(released, 48, 24)(windows)
    want = packages_forecast(reduced_package, tmp_path, windows, 24)
    assert (got - want).abs().max() > 1e-4 * want.abs().max()


def test_an_export_is_read_by_the_package_and_forecasts_as_ours(released, reduced_package, tmp_path):
    """Changed weights exported to the released layout (--to timesfm): the package reads them and forecasts what
    ours does, and ours reads them back alike."""
    model = ours(released, 64, 24)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    torch.save(model.state_dict(), tmp_path / "checkpoint.pth")
    exported = tmp_path / "exported"
    export(str(tmp_path / "checkpoint.pth"), str(exported), "timesfm")
    windows = windows_to_forecast(64)
    with torch.no_grad():
        got = model(windows)
    want = packages_forecast(reduced_package, exported, windows, 24)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.equal(ours(exported, 64, 24)(windows), got)


def test_the_model_is_built_at_the_folders_sizes_and_without_one_at_configs(released):
    model = TimesFM25.Model(_configs(released, 48, 24))
    config = model.timesfm.config
    assert (config.stacked_transformers.num_layers, config.stacked_transformers.transformer.model_dims,
            config.stacked_transformers.transformer.num_heads) == (2, 32, 4)
    scratch = TimesFM25.Model(_configs(None, 48, 24))
    layer = scratch.timesfm.config.stacked_transformers
    assert (layer.num_layers, layer.transformer.model_dims, layer.transformer.num_heads,
            layer.transformer.hidden_dims) == (1, 8, 2, 8)
    assert math.isclose(TimesFM25.Model.quantile_levels[4], 0.5)



def test_a_context_or_horizon_it_cannot_take_is_refused_when_built():
    with pytest.raises(ValueError, match="at most 16384 steps of context and horizon together"):
        TimesFM25.Model(_configs(None, 16300, 96))  # 16320 + 128
    with pytest.raises(ValueError, match="quantile head forecasts at most 1024 steps"):
        TimesFM25.Model(_configs(None, 48, 1100))
    TimesFM25.Model(_configs(None, 16384 - 1024, 1024))  # the longest of each that fit together


def test_transformers_timesfm_folder_is_named_and_refused(tmp_path):
    from utils.errors import UserError

    (tmp_path / "config.json").write_text('{"model_type": "timesfm2_5", "architectures": ["TimesFm2_5ModelForPrediction"]}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="transformers' TimesFM 2.5 layout .google/timesfm-2.5-200m-transformers"):
        TimesFM25.Model(_configs(tmp_path, 48, 24))
