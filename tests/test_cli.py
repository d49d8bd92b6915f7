"""End-to-end launches as a user types them, bad input, and checkpoint loading."""
import time

import pytest
import torch

from helpers import SMALL_TIMERXL, assert_ok, free_port, records, run_cli, run_command
from utils.checkpoint import load_weights, save_atomic
from utils.errors import UserError


def test_plain_run_py_trains_and_tests_on_builtin_data(tmp_path):
    proc = run_cli(tmp_path, "--train_epochs", 1)
    assert_ok(proc)
    assert "epoch 1/1: train" in proc.stdout and "test long_term_forecast_test_DLinear_synthetic" in proc.stdout
    assert records(tmp_path)[-1]["world_size"] == 1


def test_ddp_without_torchrun_starts_local_workers(tmp_path):
    proc = run_cli(tmp_path, "--ddp", "--nproc_per_node", 3, "--train_epochs", 1)
    assert_ok(proc)
    assert records(tmp_path)[-1]["world_size"] == 3
    assert "global batch 96 (32 x 3 processes)" in proc.stdout


def test_ddp_forecast_script_runs_as_is(tmp_path):
    # MODEL picks the model, extra flags pass through (here: a TimerXL small enough for 2 CPU cores)
    small = [str(a) for a in SMALL_TIMERXL if a not in ("--model", "TimerXL")]
    proc = run_command(["bash", "scripts/ddp_forecast.sh", "--train_epochs", "1", *small,
                        "--checkpoints", str(tmp_path / "checkpoints"), "--results_dir", str(tmp_path / "results")],
                       extra_env={"MASTER_PORT": str(free_port()), "MODEL": "TimerXL"})
    assert_ok(proc)
    record = records(tmp_path)[-1]
    assert record["world_size"] == 2 and record["model"] == "TimerXL" and record["args"]["d_model"] == 32


def test_legacy_local_rank_argument_is_accepted(tmp_path):
    assert_ok(run_cli(tmp_path, "--train_epochs", 1, "--local_rank", 0, "--synthetic_rows", 1500))


BAD_INPUTS = {
    "unknown model": (["--model", "Nope"], "unknown --model 'Nope'; available: DLinear, "),
    "missing data file": (["--data", "custom", "--root_path", "/nowhere", "--data_path", "data.csv"],
                          "data file not found: /nowhere/data.csv"),
    "unknown target": (["--target", "price"], "--target 'price' is not a column of the data; columns are: x0"),
    "window longer than a split": (["--seq_len", 336, "--pred_len", 720, "--synthetic_rows", 3000],
                                   "the val split of synthetic has 636 rows, fewer than the 1056"),
    "unknown lradj": (["--lradj", "fancy"], "unknown --lradj 'fancy'"),
    "token length": (["--model", "TimerXL", "--input_token_len", 40], "must be a multiple of --input_token_len (40)"),
}


@pytest.mark.parametrize("ddp", [False, True], ids=["1proc", "ddp2"])
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_fails_fast_with_one_clear_line(tmp_path, case, ddp):
    argv, message = BAD_INPUTS[case]
    started = time.time()
    proc = run_cli(tmp_path, *argv, *(["--ddp", "--nproc_per_node", 2] if ddp else []), timeout=60)
    elapsed = time.time() - started
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert proc.stderr.count("error: ") == (2 if ddp else 1)  # the worker's message (+ the launcher's line)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert elapsed < 30, f"took {elapsed:.0f}s to fail"
    assert not (tmp_path / "results" / "results.jsonl").exists()


@pytest.fixture(scope="module")
def dlinear_checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    assert_ok(run_cli(tmp, "--train_epochs", 1))
    return tmp / "checkpoints" / records(tmp)[-1]["setting"] / "checkpoint.pth"


@pytest.mark.parametrize("argv, message", [
    (["--pred_len", 48], "mis-shaped: Linear_Seasonal.bias (file (96,), model (48,))"),
    (["--individual"], "missing: Linear_Seasonal.0.bias"),
])
def test_checkpoint_that_does_not_fit_is_refused_by_name(tmp_path, dlinear_checkpoint, argv, message):
    proc = run_cli(tmp_path, "--is_training", 0, "--checkpoint", dlinear_checkpoint, *argv)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_missing_and_corrupt_checkpoints(tmp_path, dlinear_checkpoint):
    proc = run_cli(tmp_path, "--is_training", 0, "--checkpoint", tmp_path / "none.pth")
    assert proc.returncode == 2 and "checkpoint not found" in proc.stderr
    broken = tmp_path / "broken.pth"
    broken.write_bytes(dlinear_checkpoint.read_bytes()[:100])
    proc = run_cli(tmp_path, "--is_training", 0, "--checkpoint", broken)
    assert proc.returncode == 2 and "truncated, corrupt" in proc.stderr


def test_loader_strips_wrapper_prefixes_and_loads_strictly(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    for prefix in ("module.", "_orig_mod.", "module._orig_mod."):
        path = tmp_path / "wrapped.pth"
        save_atomic({prefix + k: v + 1 for k, v in model.state_dict().items()}, path)
        fresh = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
        load_weights(fresh, path)
        for (k, v), (_, w) in zip(fresh.state_dict().items(), model.state_dict().items()):
            torch.testing.assert_close(v, w + 1)
    save_atomic({"0.weight": torch.zeros(2, 3), "extra": torch.zeros(1)}, tmp_path / "bad.pth")
    with pytest.raises(UserError, match=r"missing: 0.bias, 1.bias, 1.weight; unexpected: extra"):
        load_weights(model, tmp_path / "bad.pth")
