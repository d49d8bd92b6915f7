"""TimesFM 2.5 (models/TimesFM25.py) against the timesfm package (issue 39): a released folder built here with the
package's own module at a reduced size (random weights, saved by the package's save_pretrained) forecasts what
the package's compile(ForecastConfig)/forecast does on the same windows, zero-shot scores the same on 1, 2 and 3
processes and at two --eval_batch_size, fine-tuning gives the same weights on 1 and 2 processes, and the
fine-tuned checkpoint exports to the released folder, which the package reads back and forecasts from alike.
The bad inputs (a missing or partial folder, another model's config, a horizon or context it cannot take) are
probes of tests/bad_inputs.py."""
import dataclasses
import math
import os

import pytest
import torch

from helpers import ETTH1_ARGS, assert_ok, records, run_cli, trained_on_1_and_2_processes, write_etth1_shaped

package = pytest.importorskip("timesfm.timesfm_2p5.timesfm_2p5_torch", reason="the timesfm package is not installed")
import timesfm  # noqa: E402

from models import TimesFM25  # noqa: E402
from utils.checkpoint import export, load_weights  # noqa: E402

RELEASED = package.timesfm_2p5_base.TimesFM_2p5_200M_Definition()


def reduced_definition():
    """The released definition at a small size, every width its own so that no two are mixed up."""
    block = RELEASED.stacked_transformers
    return dataclasses.replace(
        RELEASED,
        tokenizer=dataclasses.replace(RELEASED.tokenizer, hidden_dims=40, output_dims=32),
        stacked_transformers=dataclasses.replace(block, num_layers=2, transformer=dataclasses.replace(
            block.transformer, model_dims=32, hidden_dims=48, num_heads=4)),
        output_projection_point=dataclasses.replace(RELEASED.output_projection_point, input_dims=32, hidden_dims=24),
        output_projection_quantiles=dataclasses.replace(RELEASED.output_projection_quantiles, input_dims=32,
                                                        hidden_dims=20))


@pytest.fixture
def reduced_package(monkeypatch):
    """The package's classes building the reduced module (its module reads the class attribute `config`)."""
    monkeypatch.setattr(package.TimesFM_2p5_200M_torch_module, "config", reduced_definition())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return package.TimesFM_2p5_200M_torch


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    return write_release(tmp_path_factory.mktemp("timesfm25_release"))


def write_release(folder):
    """A folder as google/timesfm-2.5-200m-pytorch is laid out, written by the package: random weights (the
    package starts its norm scales at zero, which would silence every layer)."""
    # the package draws its matrices from the global generator: seeded here, so the folder does not depend on
    # which tests ran before (its fine-tuning's 1 vs 2 process rounding did: 1.5e-8 to 2.8e-6 by test order)
    with pytest.MonkeyPatch.context() as patch, torch.random.fork_rng():
        torch.manual_seed(0)
        patch.setattr(package.TimesFM_2p5_200M_torch_module, "config", reduced_definition())
        model = package.TimesFM_2p5_200M_torch(torch_compile=False)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, value in model.model.named_parameters():
                if value.dim() == 1:
                    value.copy_(torch.randn(value.shape, generator=generator) * 0.5 + (0 if "bias" in name else 1))
        model.save_pretrained(folder)
    assert sorted(os.listdir(folder)) == ["README.md", "config.json", "model.safetensors"]
    return folder


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


def windows_to_forecast(seq_len, channels=3):
    generator = torch.Generator().manual_seed(1)
    walk = torch.randn(4, seq_len, channels, generator=generator).cumsum(1) * 2 + 5
    walk[1] = walk[1].abs()  # non-negative: its forecast is clamped at 0
    walk[2, :, 0] = 3.0  # constant: std 0
    return walk


@pytest.mark.parametrize("seq_len, pred_len", [(48, 24), (96, 200)], ids=["padded-context", "rolled-out-horizon"])
def test_forecasts_equal_the_packages_compile_and_forecast(released, reduced_package, seq_len, pred_len):
    """48 steps are front-padded to 64 with masked zeros; 200 steps are 128 and one roll-out step of 128."""
    windows = windows_to_forecast(seq_len)
    with torch.no_grad():
        got = ours(released, seq_len, pred_len)(windows)
    want = packages_forecast(reduced_package, released, windows, pred_len)
    assert got.shape == want.shape == (4, pred_len, 3, 9)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.all(got[1] >= 0) and torch.all(got[..., 1:] >= got[..., :-1])  # clamped, never crossing


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


EVAL = [*ETTH1_ARGS, "--model", "TimesFM25", "--seq_len", 64, "--label_len", 32, "--pred_len", 24,
        "--val_windows", 30, "--test_windows", 40, "--num_threads", 1]
SCORES = ("mse", "mae", "wql", "mase", "smape", "coverage_80", "vali_loss", "test_objective_loss")


@pytest.fixture(scope="module")
def etth1(tmp_path_factory):
    return write_etth1_shaped(tmp_path_factory.mktemp("etth1"))


def test_zero_shot_scores_the_same_on_1_2_3_processes_and_two_eval_batch_sizes(released, etth1, tmp_path):
    argv = [*EVAL, "--root_path", etth1, "--is_training", 0, "--pretrain_model_path", released]
    runs = [((), None), ((), 2), ((), 3), (("--eval_batch_size", 5), None)]
    outcomes = []
    for extra, nproc in runs:
        proc = run_cli(tmp_path, *argv, *extra, *(["--ddp"] if nproc else []), nproc=nproc)
        assert_ok(proc)
        outcomes.append(records(tmp_path)[-1])
    first = outcomes[0]
    assert first["test_windows"] == 40 and first["wql_levels"] == [round(0.1 * k, 1) for k in range(1, 10)]
    for outcome in outcomes[1:]:  # float64 sums of float32 forecasts: a batch of another size may round a
        for key in SCORES:          # forecast's last bit otherwise (GEMM kernels by shape): 2e-10 seen in wql
            assert outcome[key] == pytest.approx(first[key], rel=1e-9, abs=0), key
    assert not any((tmp_path / "checkpoints").rglob("*.pth"))


TUNE = ["--adaptation", "--train_steps", 2, "--global_batch_size", 8, "--learning_rate", 1e-4,
        "--test_every_epoch", "false"]


def test_fine_tuning_gives_the_same_weights_on_1_and_2_processes_and_exports_to_the_package(
        released, reduced_package, etth1, tmp_path):
    argv = [*EVAL, "--root_path", etth1, "--pretrain_model_path", released, *TUNE]
    (_, path, one), (_, _, two) = trained_on_1_and_2_processes(tmp_path, *argv)
    initial = ours(released, 64, 24).state_dict()
    assert set(one) == set(initial)
    assert any(not torch.equal(one[k], initial[k]) for k in one), "fine-tuning changed nothing"
    for key in one:
        assert torch.allclose(one[key], two[key], rtol=0, atol=1e-6), key
    # the fine-tuned weights in the released layout: the package reads them and forecasts as we do
    exported = tmp_path / "exported"
    export(str(path), str(exported), "timesfm")
    assert sorted(os.listdir(exported)) == ["config.json", "model.safetensors"]
    tuned = TimesFM25.Model(_configs(released, 64, 24))
    tuned.load_state_dict(one)
    windows = windows_to_forecast(64)
    with torch.no_grad():
        got = tuned.eval()(windows)
    want = packages_forecast(reduced_package, exported, windows, 24)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    # and the exported folder loads back into ours as the released one does
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
