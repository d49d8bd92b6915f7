"""TiRex-2 against the tirex-2 package: a release folder written with the package's own TiRex2 at a reduced size
(tests/writer.py: random weights, saved as NX-AI/TiRex-2 ships it) forecasts what the package's
TiRex2.predict does on the same windows (padding, trend differencing, band calibration, sign-flip TTA), a series
the same alone and in any batch, and an export of ours is what the package's load_model reads and forecasts from
alike. The package's reference runs here with TorchDynamo disabled (its ResidualBlock is compiled at class level:
a C++ build per shape; crosscheck.py compares with the compiled path). What every release shares (zero-shot and
fine-tuning on several processes, the export's layout, the bad inputs) is tests/test_foundation.py's contract."""
from argparse import Namespace

import pytest
import torch

tirex2 = pytest.importorskip("tirex2", reason="the tirex-2 package is not installed")

from exp.export import export, load_weights  # noqa: E402
from models.foundation.tirex2 import TiRex2  # noqa: E402
from models.foundation.tirex2.tests.writer import write as write_tirex2  # noqa: E402
from models.foundation.tirex2.adapter import LEVELS  # noqa: E402
from utils.errors import UserError  # noqa: E402


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    return write_tirex2(tmp_path_factory.mktemp("tirex2") / "NX-AI" / "TiRex-2")


def ours(folder, seq_len, pred_len):
    configs = Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=str(folder))
    return load_weights(TiRex2.Model(configs), str(folder)).eval()


def eager():
    """The package run without TorchDynamo (its class-level torch.compile would build C++ per shape)."""
    return torch._dynamo.config.patch(disable=True)


def packages_forecast(folder, windows, pred_len):
    """tirex2.load_model(folder).model.predict on every channel of `windows` [B, L, C], each a series of its own:
    [B, pred_len, C, 9]."""
    model = tirex2.load_model(str(folder), device="cpu").model
    batch, seq_len, channels = windows.shape
    series = windows.permute(0, 2, 1).reshape(batch * channels, seq_len)
    inputs = [tirex2.TimeseriesType(target=s[None], past_covariates=None, future_covariates=None) for s in series]
    with eager():
        forecasts = model.predict(inputs, pred_len)
    return torch.stack([f[0] for f in forecasts]).reshape(batch, channels, 9, pred_len).permute(0, 3, 1, 2)


def zero_shot_quantiles(release, windows, pred_len, monkeypatch):
    """The package's own forecast of every channel of raw `windows` [B, L, C]: [B, pred_len, C, levels], for the
    checks of tests/ that hold a packaged release's zero-shot runs to its package (test_zero_shot, test_gift_eval)."""
    return packages_forecast(release, windows, pred_len)


def windows_to_forecast(seq_len, channels=3):
    generator = torch.Generator().manual_seed(1)
    walk = torch.randn(4, seq_len, channels, generator=generator).cumsum(1) * 2 + 5
    walk[1, :, 2] = torch.arange(seq_len) * 0.5 + torch.randn(seq_len, generator=generator) * 0.1  # a trend: differenced
    walk[2, :, 0] = 3.0  # constant: std 0, the scaler's eps
    walk[3, :, 1] = (torch.arange(seq_len) % 7 == 0).float()  # binary: the scaler leaves it as it is
    return walk


@pytest.mark.parametrize("seq_len, pred_len, sign_flip", [(40, 24, False), (96, 64, False), (96, 64, True)],
                         ids=["padded", "full-context-whole-future", "sign-flip-tta"])
def test_forecasts_equal_the_packages_predict(tmp_path, seq_len, pred_len, sign_flip):
    """40 steps are NaN-padded to the 96 of context_len, 24 of the 64 future steps are read; 96 steps fill the
    context and 64 the whole future; with tta_sign_flip (config.json) the forecast of -x is averaged in. The
    windows hold a trending series (differenced and integrated back), a constant and a binary one."""
    folder = write_tirex2(tmp_path / "TiRex-2", tta_sign_flip=sign_flip)
    windows = windows_to_forecast(seq_len)
    with torch.no_grad():
        got = ours(folder, seq_len, pred_len)(windows)
    want = packages_forecast(folder, windows, pred_len)
    assert got.shape == want.shape == (4, pred_len, 3, 9)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_a_series_forecasts_the_same_alone_and_in_any_batch(released):
    """Bit for bit: 16 series in one batch, and in batches of 1, 3 and 7 (the rows padded to a multiple of 8 in
    evaluation: MKL's products and ATen's vector loops then sum and round each row alike)."""
    model = ours(released, 96, 48)
    series = windows_to_forecast(96, channels=4).permute(0, 2, 1).reshape(16, 96)
    with torch.no_grad():
        whole = model.forecast(series)
        for size in (1, 3, 7):
            parts = torch.cat([model.forecast(series[i:i + size]) for i in range(0, 16, size)])
            assert torch.equal(parts, whole), size


def test_the_patch_embeddings_run_eagerly(released):
    """No TorchDynamo frame is compiled by our forward (the package's own predict compiles its ResidualBlocks)."""
    from torch._dynamo.utils import counters

    model = ours(released, 40, 24)
    before = sum(counters["frames"].values())
    with torch.no_grad():
        model(windows_to_forecast(40))
    assert sum(counters["frames"].values()) == before
    assert all(type(m) is TiRex2.EagerResidualBlock for m in (model.tirex2.input_patch_embedding,
                                                             model.tirex2.output_patch_embedding))


def test_the_export_is_read_by_the_package_and_forecasts_alike(released, tmp_path):
    """Ours (weights moved off the release's) exported with --to tirex2: config.json + model.safetensors, each alias
    group stored once as the hub stores it; tirex2.load_model reads the folder strictly and forecasts as ours."""
    import json

    from safetensors.torch import load_file

    model = ours(released, 96, 48)
    with torch.no_grad():
        for value in model.parameters():
            value.add_(0.01)
    path = tmp_path / "checkpoint.pth"
    torch.save(model.state_dict(), path)
    exported = tmp_path / "NX-AI" / "TiRex-2-tuned"
    export(str(path), str(exported), "tirex2")
    assert sorted(p.name for p in exported.iterdir()) == ["config.json", "model.safetensors"]
    assert set(load_file(str(exported / "model.safetensors"))) == set(load_file(str(released / "model.safetensors")))
    assert json.loads((exported / "config.json").read_text()) == json.loads((released / "config.json").read_text())
    windows = windows_to_forecast(96)
    with torch.no_grad():
        got = model(windows)
    want = packages_forecast(exported, windows, 48)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_the_input_gate_bias_is_a_direction_the_forecast_does_not_depend_on(released):
    """Why the sLSTM's input-gate bias gets a zero gradient: shifting it leaves the forecast as it is (to
    rounding), shifting the forget gate's does not."""
    model = ours(released, 96, 48)
    windows = windows_to_forecast(96)
    with torch.no_grad():
        before = model(windows)
        bias = model.tirex2.stack[1].time_mixer.fwd_cell._bias_  # [heads, gates (i, f, z, o), head_dim]
        bias[:, 0] += 0.7
        shifted = model(windows)
        bias[:, 1] += 0.7
        moved = model(windows)
    assert (shifted - before).abs().max() <= 1e-5 * before.abs().max()
    assert (moved - before).abs().max() > 1e-3 * before.abs().max()


def test_a_horizon_past_future_len_or_a_context_past_context_len_is_one_line(released):
    for seq_len, pred_len, said in ((96, 65, "forecasts at most 64 steps (its future_len) in its one pass"),
                                    (97, 48, "reads at most 96 steps of context (its context_len)")):
        with pytest.raises(UserError, match=r"^TiRex-2 " + said.replace("(", r"\(").replace(")", r"\)")) as refused:
            ours(released, seq_len, pred_len)
        assert "\n" not in str(refused.value)


def test_the_trend_test_is_the_packages():
    """TiRex2.trends (torch, no host sync) decides as the package's PostProcessor._detect_trends (numpy.polyfit per
    row) on 400 rows: random walks, noisy lines from clean to lost in noise, constants, rows with NaN gaps and rows
    of fewer than 4 values."""
    from tirex2.model.component.postprocessor import PostProcessor

    generator = torch.Generator().manual_seed(3)
    steps = torch.arange(96, dtype=torch.float32)
    noise = torch.logspace(-2, 1.5, 200)[:, None]
    rows = torch.cat([torch.randn(120, 96, generator=generator).cumsum(1),
                      steps * 0.1 + noise * torch.randn(200, 96, generator=generator),
                      torch.full((20, 96), 4.0), torch.randn(60, 96, generator=generator).cumsum(1) + steps])
    rows[-60:-30, :50] = float("nan")
    rows[-30:, :93] = float("nan")
    post = PostProcessor()
    want = torch.tensor(post._detect_trends(rows))
    got = TiRex2.trends(rows, post.cfg)
    assert 50 < int(want.sum()) < 350 and torch.equal(got, want)


def test_the_covariate_forecaster_is_the_packages_multivariate_predict(released):
    """covariates.py (fev_bench --covariates): two target columns with a past-only and a known covariate, one
    window, forecast as the package's own load_model(...).model.predict does with them (its multivariate mode:
    variate attention across the group, the reverse pass over the known row); the covariates change the forecast."""
    import numpy as np

    from models.foundation.tirex2 import covariates

    generator = torch.Generator().manual_seed(5)
    target = torch.randn(2, 80, generator=generator).cumsum(1)
    past = torch.randn(1, 80, generator=generator)
    known = torch.sin(torch.arange(80 + 24) / 3.0)[None]
    forecaster = covariates.CovariateForecaster(["--pretrain_model_path", str(released)], "cpu", list(LEVELS))
    one = {"target": target.double().numpy(), "past": [past[0].double().numpy()], "known": [known[0].double().numpy()]}
    got = forecaster.forecast([one], 24)[0]  # [2, 9, 24]
    model = tirex2.load_model(str(released), device="cpu").model
    with eager():
        want = model.predict([tirex2.TimeseriesType(target=target, past_covariates=past, future_covariates=known)],
                             24)[0]
        alone = model.predict([tirex2.TimeseriesType(target=target, past_covariates=None, future_covariates=None)],
                              24)[0]
    assert got.shape == (2, 9, 24)
    assert np.abs(got - want.double().numpy()).max() <= 1e-5 * float(want.abs().max())
    assert (want - alone).abs().max() > 1e-3 * float(want.abs().max())
    with pytest.raises(UserError, match="its future_len"):
        forecaster.forecast([one], 65)


def test_the_older_layout_is_named_and_refused_in_one_line(tmp_path):
    """A folder in TiRex-2's older layout (model-config.yaml + a torch-pickled model.ckpt, which the package still
    reads with a deprecation warning): one line naming it and the current release (it was taken for the other
    release whose folder is a model.ckpt; that release's side: its tests/)."""
    from models.foundation.tirex2 import adapter as tirex2

    folder = tmp_path / "TiRex-2"
    folder.mkdir()
    torch.save({"stack.0.time_mixer.norm_lstm.weight": torch.ones(4)}, folder / "model.ckpt")
    (folder / "model-config.yaml").write_text("num_blocks: 12\n")
    with pytest.raises(UserError, match=r"holds TiRex-2's older layout .* download the current release \(NX-AI/TiRex-2"):
        tirex2.read_release(str(folder))
