"""TimeXer with exogenous variables (--features MS, --covariate): the target is the one endogenous series, the
other columns reach it only through its global token's cross-attention, and training is exact on 1 and 2
processes. Its function against TSLib's own TimeXer: lab/tslib_timexer.py --tslib PATH."""
import types

import pytest
import torch

from helpers import assert_ok, records, run_cli, trained_on_1_and_2_processes, write_etth1_shaped
from models.TimeXer import Model

TINY = ["--model", "TimeXer", "--d_model", 16, "--d_ff", 32, "--n_heads", 2, "--e_layers", 1, "--seq_len", 48,
        "--label_len", 24, "--pred_len", 24, "--patch_len", 8]


def _configs(**changes):
    fields = dict(features="MS", covariate=False, seq_len=48, pred_len=24, patch_len=8, enc_in=5, d_model=16,
                  n_heads=2, d_ff=32, dropout=0.0, activation="gelu", e_layers=2, use_norm=1, factor=3,
                  embed="timeF", freq="h")
    return types.SimpleNamespace(**(fields | changes))


def _forecast(model, x):
    with torch.no_grad():
        return model.eval()(x, torch.randn(x.shape[0], x.shape[1], 4, generator=torch.Generator().manual_seed(1)))


@pytest.mark.parametrize("mode", [{"features": "MS"}, {"features": "M", "covariate": True}])
def test_the_other_columns_reach_the_target_only_through_cross_attention(mode):
    torch.manual_seed(0)
    model = Model(_configs(**mode))
    x = torch.randn(3, 48, 5)
    other_exogenous = torch.cat([torch.randn(3, 48, 4), x[..., -1:]], dim=-1)
    other_target = torch.cat([x[..., :-1], torch.randn(3, 48, 1)], dim=-1)
    base = _forecast(model, x)
    assert base.shape == (3, 24, 1)  # the target alone is forecast
    assert not torch.allclose(_forecast(model, other_exogenous), base)  # the exogenous columns inform it
    for layer in model.encoder["layers"]:  # cut the cross-attention: they no longer can
        torch.nn.init.zeros_(layer.cross_attention.out_projection.weight)
        torch.nn.init.zeros_(layer.cross_attention.out_projection.bias)
    base = _forecast(model, x)
    torch.testing.assert_close(_forecast(model, other_exogenous), base, rtol=0, atol=0)
    assert not torch.allclose(_forecast(model, other_target), base)  # the target's own patches still do


def test_multivariate_forecasts_every_column_and_a_single_column_has_no_exogenous_variables():
    torch.manual_seed(0)
    assert _forecast(Model(_configs(features="M")), torch.randn(2, 48, 5)).shape == (2, 24, 5)
    with pytest.raises(ValueError, match="single column: use --features S"):
        Model(_configs(covariate=True, features="M", enc_in=1))


def test_exogenous_training_is_exact_on_1_and_2_processes(tmp_path):
    """The ETT columns as exogenous variables of OT: 3 steps of a global batch of 8 with dropout 0.1 give the
    same weights and test metrics on 1 process and on 2 (every dropout mask keyed by window)."""
    root = write_etth1_shaped(tmp_path / "ETT-small")
    argv = [*TINY, "--features", "MS", "--data", "ETTh1", "--root_path", root, "--data_path", "ETTh1.csv",
            "--train_steps", 3, "--global_batch_size", 8, "--dropout", 0.1, "--learning_rate", 1e-3]
    (first, _, one), (second, _, two) = trained_on_1_and_2_processes(tmp_path, *argv)
    assert (first["world_size"], second["world_size"]) == (1, 2)
    assert all(first["dropout_keyed"].values()) and len(first["dropout_keyed"]) >= 5, first["dropout_keyed"]
    for key in one:
        # a key bias adds the same score to every key of a query: its gradient is zero up to rounding, which
        # Adam scales to a whole step, so it is noise on any number of processes and changes no forecast
        if not key.endswith("attention.key_projection.bias"):
            assert torch.allclose(one[key], two[key], rtol=0, atol=1e-6), key
    for key in ("vali_loss", "mse", "mae"):
        assert second[key] == pytest.approx(first[key], rel=1e-6), key
    # the checkpoint evaluates again: one scored channel, the target's
    checkpoint = tmp_path / "nproc1" / "checkpoints" / first["setting"] / "checkpoint.pth"
    assert_ok(run_cli(tmp_path / "nproc1", *argv, "--is_training", 0, "--checkpoint", checkpoint))
    again = records(tmp_path / "nproc1")[-1]
    assert again["mse"] == pytest.approx(first["mse"], rel=1e-6)
