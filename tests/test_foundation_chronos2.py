"""Chronos-2 (models/Chronos2.py on chronos-forecasting's Chronos2Model; utils/chronos2.py): a released folder
built here with the package's own model class at a reduced size (random weights, save_pretrained: config.json +
model.safetensors) is evaluated zero-shot exactly on any number of processes and batch size, forecasts what the
package's Chronos2Pipeline.predict_quantiles forecasts, fine-tunes to the same weights on 1 and 2 processes, and
exports back to a folder the package reads and forecasts the same from. Bad inputs: tests/bad_inputs.py."""
import argparse
import json

import pytest
import torch

from helpers import (ETTH1_ARGS, assert_ok, records, run_cli, run_command, trained_on_1_and_2_processes,
                     write_etth1_shaped)

chronos = pytest.importorskip("chronos.chronos2", reason="the chronos extra (chronos-forecasting) is not installed")

from models.Chronos2 import Model  # noqa: E402
from utils import chronos2  # noqa: E402
from utils.checkpoint import load_weights  # noqa: E402

LEVELS = list(chronos2.RELEASED_QUANTILES)
# the released architecture at a reduced size; one pass forecasts 2 patches (32 steps), more is rolled out
SMALL = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.1, reg_token_id=1)
SHORT = ["--seq_len", 32, "--label_len", 16, "--pred_len", 24, "--val_windows", 24, "--test_windows", 24,
         "--num_threads", 1]


def release_folder(folder, seed=0, **forecasting):
    """The package's Chronos2Model, its weights random and away from their small initial scale, saved as
    amazon/chronos-2 is (Chronos2Model.save_pretrained)."""
    torch.manual_seed(seed)
    config = chronos.Chronos2CoreConfig(**SMALL, chronos_config=dict(chronos2.RELEASED_FORECASTING,
                                                                     max_output_patches=2, **forecasting))
    model = chronos.Chronos2Model(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return release_folder(tmp_path_factory.mktemp("chronos-2"))


@pytest.fixture(scope="module")
def etth1(tmp_path_factory):
    folder = write_etth1_shaped(tmp_path_factory.mktemp("data"))
    return [*ETTH1_ARGS[:2], "--root_path", folder, "--data_path", "ETTh1.csv"]


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


def test_zero_shot_is_identical_on_1_2_3_processes_and_two_batch_sizes(tmp_path, release, etth1):
    argv = ["--model", "Chronos2", "--is_training", 0, "--pretrain_model_path", release, *etth1, *SHORT]
    runs = [(None, []), (2, ["--ddp"]), (3, ["--ddp"]), (None, ["--eval_batch_size", 5])]
    for nproc, extra in runs:
        proc = run_cli(tmp_path, *argv, *extra, nproc=nproc)
        assert_ok(proc)
    first, *others = records(tmp_path)
    assert [r["world_size"] for r in (first, *others)] == [1, 2, 3, 1]
    assert first["args"]["loss"] == "quantile" and first["args"]["quantiles"].count(",") == 20
    for record in others:
        for key in ("vali_loss", "mse", "mae", "wql", "mase", "coverage_80"):
            assert record[key] == pytest.approx(first[key], rel=1e-6, abs=0), key
    # the released weights are what was scored: another seed's folder scores otherwise
    assert_ok(run_cli(tmp_path, *argv[:5], release_folder(tmp_path / "other", seed=5), *argv[6:]))
    assert records(tmp_path)[-1]["mse"] != pytest.approx(first["mse"], rel=1e-3)


def test_fine_tuning_with_dropout_is_exact_on_2_processes_and_exports_for_the_package(tmp_path, release, etth1):
    argv = ["--model", "Chronos2", "--adaptation", "--pretrain_model_path", release, *etth1, *SHORT,
            "--train_steps", 3, "--global_batch_size", 8, "--dropout", 0.1, "--learning_rate", 1e-3]
    runs = trained_on_1_and_2_processes(tmp_path, *argv)
    for record, _, _ in runs:
        keyed = record["dropout_keyed"]  # the folder's dropout 0.1, the attention weights' and group residual's too
        assert len([name for name in keyed if name.endswith("self_attention.weights_dropout")]) == 4, keyed
        assert all(keyed.values()), keyed
    (_, path, one), (_, _, two) = runs
    released = chronos2.CHRONOS2.to_ours(*read_release(release))
    assert set(one) == set(two) == set(released)
    moved = max(float((one[k].double() - released[k].double()).abs().max()) for k in one if k.startswith("chronos."))
    assert moved > 1e-4  # fine-tuning changed the weights
    for key in one:
        assert torch.allclose(one[key].double(), two[key].double(), rtol=0, atol=1e-6), key

    exported = tmp_path / "exported"
    proc = run_command(["python", "-m", "utils.checkpoint", "export", "--to", "chronos2", str(path), str(exported)])
    assert proc.returncode == 0, proc.stderr
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Chronos2Model"] and config["d_model"] == 32 and config["num_heads"] == 4
    x = windows(length=32)
    fine_tuned = Model(argparse.Namespace(pretrain_model_path=str(release), seq_len=32, pred_len=24, dropout=0.1,
                                          is_training=1))
    fine_tuned.load_state_dict(one)
    with torch.no_grad():
        assert relative(fine_tuned.eval()(x), packages_quantiles(exported, x, 24)) <= 1e-5
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
    monkeypatch.delitem(sys.modules, "models.Chronos2")
    with pytest.raises(UserError, match=r"model Chronos2 needs the chronos-forecasting package .*pip install -e "
                                        r"'\.\[chronos\]'"):
        importlib.import_module("models.Chronos2")
