"""End-to-end launches as a user types them, bad input, and checkpoint loading."""

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


def _a_python_first_on_path_that_is_not_the_interpreter(tmp_path, monkeypatch):
    """The suite run as under a virtual environment called by path, not activated: the first `python` on PATH
    is another program (here one that fails)."""
    import os

    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python").write_text("#!/bin/sh\necho 'not the interpreter running the tests' >&2\nexit 1\n")
    (shims / "python").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ.get('PATH', '')}")


def test_ddp_forecast_script_runs_as_is(tmp_path, monkeypatch):
    """MODEL picks the model, extra flags pass through (here: a TimerXL small enough for 2 CPU cores). The first
    `python` on the suite's PATH is not its interpreter: the script's `python` is still the running one
    (helpers.subprocess_env)."""
    _a_python_first_on_path_that_is_not_the_interpreter(tmp_path, monkeypatch)
    small = [str(a) for a in SMALL_TIMERXL if a not in ("--model", "TimerXL")]
    proc = run_command(["bash", "scripts/ddp_forecast.sh", "--train_epochs", "1", *small,
                        "--checkpoints", str(tmp_path / "checkpoints"), "--results_dir", str(tmp_path / "results")],
                       extra_env={"MASTER_PORT": str(free_port()), "MODEL": "TimerXL"})
    assert_ok(proc)
    record = records(tmp_path)[-1]
    assert record["world_size"] == 2 and record["model"] == "TimerXL" and record["args"]["d_model"] == 32


def test_ddp_forecast_script_starts_one_process_per_gpu(tmp_path):
    """It started 2 processes on an 8-GPU node. Here torch reports 3 GPUs to the script (the workers,
    seeing no CUDA, compute on the CPU)."""
    (tmp_path / "sitecustomize.py").write_text("import torch\ntorch.cuda.device_count = lambda: 3\n")
    proc = run_command(["bash", "scripts/ddp_forecast.sh", "--train_epochs", "1", "--synthetic_rows", "1500", "--no_plots",
                        "--checkpoints", str(tmp_path / "checkpoints"), "--results_dir", str(tmp_path / "results")],
                       extra_env={"MASTER_PORT": str(free_port()), "PYTHONPATH": str(tmp_path)})
    assert_ok(proc)
    assert records(tmp_path)[-1]["world_size"] == 3


def test_legacy_local_rank_argument_is_accepted(tmp_path):
    assert_ok(run_cli(tmp_path, "--train_epochs", 1, "--local_rank", 0, "--synthetic_rows", 1500))


def test_the_suite_runs_this_checkouts_code_wherever_pytest_starts(tmp_path):
    """pytest started in another folder that holds another copy of the project, also first on PYTHONPATH
    (as another checkout, or an installed copy, would be): the forked runs still run this checkout's code.
    The copy marks a file when it is imported; the test above runs as the inner session."""
    import shutil
    import subprocess
    import sys

    from helpers import REPO, subprocess_env

    elsewhere, marker = tmp_path / "elsewhere", tmp_path / "copy_imported"
    for name in ("exp", "models", "layers", "data_provider", "utils"):
        shutil.copytree(REPO / name, elsewhere / name, ignore=shutil.ignore_patterns("__pycache__"))
    mark = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (elsewhere / "run.py").write_text(mark + (REPO / "run.py").read_text())
    (elsewhere / "exp" / "__init__.py").write_text(mark + (REPO / "exp" / "__init__.py").read_text())
    inner = f"{REPO / 'tests' / 'test_cli.py'}::test_legacy_local_rank_argument_is_accepted"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                           str(tmp_path / "inner"), inner], cwd=elsewhere,
                          env=dict(subprocess_env(), PYTHONPATH=str(elsewhere)), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not marker.exists(), f"the other copy ran: {marker.read_text().split()}"


def test_tests_that_start_processes_do_not_depend_on_the_callers_path_or_pythonpath(tmp_path, monkeypatch):
    """Tests that start a child interpreter pass when the suite runs under a `python` on PATH that is not its
    interpreter and with PYTHONPATH naming this checkout: TSLib's file is imported without PYTHONPATH (this
    repository's regular `models` package would shadow a checkout's namespace folder). A script's `python`:
    test_ddp_forecast_script_runs_as_is."""
    from helpers import REPO
    from test_tslib_models import test_a_failure_is_checked_against_tslibs_own_file

    _a_python_first_on_path_that_is_not_the_interpreter(tmp_path, monkeypatch)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    (tmp_path / "tslib").mkdir()
    test_a_failure_is_checked_against_tslibs_own_file(tmp_path / "tslib")


def test_loader_strips_wrapper_prefixes_and_loads_strictly(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    # DDP(torch.compile(m)) and torch.compile(DDP(m)) nest the two wrappers either way round
    for prefix in ("", "module.", "_orig_mod.", "module._orig_mod.", "_orig_mod.module."):
        path = tmp_path / "wrapped.pth"
        save_atomic({prefix + k: v + 1 for k, v in model.state_dict().items()}, path)
        fresh = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
        load_weights(fresh, path)
        for (k, v), (_, w) in zip(fresh.state_dict().items(), model.state_dict().items()):
            torch.testing.assert_close(v, w + 1)
    save_atomic({"0.weight": torch.zeros(2, 3), "extra": torch.zeros(1)}, tmp_path / "bad.pth")
    with pytest.raises(UserError, match=r"missing: 0.bias, 1.bias, 1.weight; unexpected: extra"):
        load_weights(model, tmp_path / "bad.pth")


@pytest.mark.parametrize("saved, named", [
    ({"0.weight": torch.zeros(2, 3)}, "missing: 0.bias"),  # one key short, nothing else wrong
    ({"0.weight": torch.zeros(2, 3), "0.bias": torch.zeros(2), "extra": torch.zeros(1)}, "unexpected: extra"),
], ids=["one_missing", "one_unexpected"])
def test_a_checkpoint_one_key_off_is_refused_in_one_line(tmp_path, saved, named):
    """A single missing or single extra key is a mismatch on its own: the one-line UserError naming
    it, not torch's multi-line RuntimeError from load_state_dict."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    save_atomic(saved, tmp_path / "c.pth")
    with pytest.raises(UserError) as refused:
        load_weights(model, tmp_path / "c.pth")
    assert f"does not fit model container: {named}. Use the same --model" in str(refused.value)


@pytest.mark.parametrize("n, shown", [(6, r"p0, p1, p2, p3, p4, p5"), (7, r"p0, p1, p2, p3, p4, p5, \.\.\. \(7 in all\)")])
def test_a_mismatched_checkpoint_names_six_keys_and_counts_the_rest(tmp_path, n, shown):
    from utils.checkpoint import load_weights
    from utils.errors import UserError

    model = torch.nn.Module()
    for i in range(n):
        model.register_parameter(f"p{i}", torch.nn.Parameter(torch.zeros(1)))
    torch.save({"other": torch.zeros(1)}, tmp_path / "c.pth")
    with pytest.raises(UserError, match=f"missing: {shown}; unexpected: other\\."):
        load_weights(model, str(tmp_path / "c.pth"))
