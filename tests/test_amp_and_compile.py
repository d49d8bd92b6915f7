"""--use_amp and --compile change speed, never results: bf16 AMP trains to nearly the fp32 result, a
compiled model saves plain checkpoints, and fp16 AMP is refused on CPU."""
import pytest
import torch

from helpers import assert_ok, make_args, make_experiment, records, run_cli
from utils.errors import UserError


def test_bf16_amp_trains_to_nearly_the_fp32_result(tmp_path):
    argv = ["--train_epochs", 2, "--synthetic_rows", 2500]
    assert_ok(run_cli(tmp_path, *argv))
    assert_ok(run_cli(tmp_path, *argv, "--use_amp"))
    fp32, amp = records(tmp_path)
    assert amp["mse"] == pytest.approx(fp32["mse"], rel=0.02)
    assert amp["args"]["use_amp"] is True


def test_compiled_training_saves_plain_checkpoints(tmp_path):
    assert_ok(run_cli(tmp_path, "--train_epochs", 1, "--synthetic_rows", 1500, "--compile"))
    compiled = records(tmp_path)[-1]
    state = torch.load(tmp_path / "checkpoints" / compiled["setting"] / "checkpoint.pth", weights_only=True)
    assert sorted(state) == ["Linear_Seasonal.bias", "Linear_Seasonal.weight", "Linear_Trend.bias", "Linear_Trend.weight"]
    assert_ok(run_cli(tmp_path, "--train_epochs", 1, "--synthetic_rows", 1500))
    assert records(tmp_path)[-1]["mse"] == pytest.approx(compiled["mse"], rel=1e-4)


def test_fp16_is_refused_on_cpu():
    with pytest.raises(UserError, match="--amp_dtype fp16 needs a GPU"):
        make_experiment(make_args("--use_amp", "--amp_dtype", "fp16", "--use_gpu", "false"))
