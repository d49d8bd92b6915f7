"""Chronos-2 against chronos-forecasting: a folder the package wrote (tests/writer.py: its
Chronos2Model at a reduced size, random weights, save_pretrained) forecasts what Chronos2Pipeline.predict_quantiles
forecasts on the same windows, and an export of ours is what the package reads and forecasts from alike. What
every release shares (zero-shot and fine-tuning on several processes, the export's layout, the bad inputs) is
tests/test_foundation.py's contract."""
import argparse
import json

import pytest
import torch

chronos = pytest.importorskip("chronos.chronos2", reason="the chronos extra (chronos-forecasting) is not installed")

from models.foundation.chronos2.Chronos2 import Model  # noqa: E402
from models.foundation.chronos2 import adapter as chronos2  # noqa: E402
from exp.export import load_weights  # noqa: E402
from test_foundation import checkpoints  # noqa: E402
from models.foundation.chronos2.tests.writer import write as write_chronos2  # noqa: E402

LEVELS = list(chronos2.RELEASED_QUANTILES)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_chronos2(tmp_path_factory.mktemp("chronos-2") / "chronos-2")


def ours(path, pred_len, seq_len=64, is_training=0):
    model = Model(argparse.Namespace(pretrain_model_path=str(path), seq_len=seq_len, pred_len=pred_len, dropout=0.1,
                                     is_training=is_training))
    return load_weights(model, str(path)).eval()


def windows(seed=1, batch=6, length=64, channels=3):
    generator = torch.Generator().manual_seed(seed)
    steps = torch.arange(length, dtype=torch.float32)
    level = 5 * torch.randn(batch, 1, channels, generator=generator)
    return level + torch.sin(steps / 4)[None, :, None] + torch.randn(batch, length, channels, generator=generator)


def packages_quantiles(path, x, pred_len, batch_size=256):
    """Chronos2Pipeline.predict_quantiles on every channel of `x` [B, L, C] as a univariate series: [B, T, C, Q]."""
    pipeline = chronos.Chronos2Pipeline.from_pretrained(str(path))
    batch, length, channels = x.shape
    quantiles, _ = pipeline.predict_quantiles(x.transpose(1, 2).reshape(batch * channels, 1, length),
                                              prediction_length=pred_len, quantile_levels=LEVELS, batch_size=batch_size)
    return torch.stack(quantiles).reshape(batch, channels, pred_len, len(LEVELS)).permute(0, 2, 1, 3)


def zero_shot_quantiles(release, windows, pred_len, monkeypatch):
    """The package's own forecast of every channel of raw `windows` [B, L, C]: [B, pred_len, C, levels], for the
    checks of tests/ that hold a packaged release's zero-shot runs to its package (test_zero_shot, test_gift_eval)."""
    return packages_quantiles(release, windows, pred_len)


def relative(a, b):
    return float(((a - b).abs() / b.abs().clamp_min(1e-6)).max())


@pytest.mark.parametrize("pred_len", [24, 40], ids=["one-pass", "rolled-out"])
def test_forecasts_are_the_packages_predict_quantiles(release, pred_len):
    """One pass up to max_output_patches (2 patches here), the package's long-horizon rollout beyond."""
    x = windows()
    with torch.no_grad():
        forecast = ours(release, pred_len)(x)
    assert forecast.shape == (6, pred_len, 3, len(LEVELS))
    assert relative(forecast, packages_quantiles(release, x, pred_len)) <= 1e-5
    assert forecast.std() > 0.1  # the weights show: not a flat forecast that any model would match


def test_each_channel_is_its_own_series(release):
    """A channel's forecast does not depend on the other channels of its window, nor on the other windows."""
    x, model = windows(), ours(release, 24)
    with torch.no_grad():
        whole = model(x)
        alone = model(x[2:3, :, 1:2])
    assert torch.allclose(alone[0, :, 0], whole[2, :, 1], rtol=1e-5, atol=1e-6)


def test_an_export_is_read_by_the_package_and_forecasts_as_ours(tmp_path, release):
    """Changed weights exported to the released layout (export --to chronos2): the
    package's pipeline forecasts from them what ours does, and ours reads them back alike."""
    model = ours(release, 24, seq_len=32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    torch.save(model.state_dict(), tmp_path / "checkpoint.pth")
    exported = tmp_path / "exported"
    checkpoints().export(str(tmp_path / "checkpoint.pth"), str(exported), "chronos2")
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Chronos2Model"] and config["d_model"] == 32 and config["num_heads"] == 4
    x = windows(length=32)
    with torch.no_grad():
        assert relative(model(x), packages_quantiles(exported, x, 24)) <= 1e-5
        assert relative(ours(exported, 24, seq_len=32)(x), packages_quantiles(exported, x, 24)) <= 1e-5


def read_release(folder):
    from utils.adapters import read_safetensors

    return read_safetensors(str(folder / "model.safetensors")), json.loads((folder / "config.json").read_text())


def test_a_training_horizon_past_one_pass_is_kept_as_fit_keeps_it(release, tmp_path):
    """Chronos2Pipeline.fit raises max_output_patches to the horizon it trained; so does a training run here, and
    export writes it: the package then forecasts those 3 patches in one pass, as ours does."""
    model = ours(release, 40, is_training=1)
    assert model.one_pass == 3 and int(model.max_output_patches[0]) == 3
    out = chronos2.CHRONOS2.from_ours(model.state_dict())
    chronos2.CHRONOS2.write(out, tmp_path / "fit")
    assert json.loads((tmp_path / "fit" / "config.json").read_text())["chronos_config"]["max_output_patches"] == 3
    x = windows()
    with torch.no_grad():
        assert relative(model(x), packages_quantiles(tmp_path / "fit", x, 40)) <= 1e-5
    assert ours(release, 40).one_pass == 2  # zero-shot keeps the release's


def test_the_released_layout_round_trips_key_for_key(release):
    state, config = read_release(release)
    converted = chronos2.CHRONOS2.to_ours(state, config)
    weights, written = chronos2.CHRONOS2.from_ours(converted)
    assert set(weights) == set(state) and all(torch.equal(weights[k], state[k]) for k in state)
    assert written["chronos_config"] == config["chronos_config"]
    assert {k: written[k] for k in chronos2.CORE_FIELDS if k in config} == {k: config[k] for k in chronos2.CORE_FIELDS
                                                                             if k in config}


def test_a_missing_package_is_one_line(monkeypatch):
    import importlib
    import sys

    from utils.errors import UserError

    monkeypatch.setitem(sys.modules, "chronos.chronos2", None)
    monkeypatch.delitem(sys.modules, "models.foundation.chronos2.Chronos2")
    with pytest.raises(UserError, match=r"model Chronos2 needs the chronos-forecasting package .*pip install -e "
                                        r"'\.\[chronos\]'"):
        importlib.import_module("models.foundation.chronos2.Chronos2")
