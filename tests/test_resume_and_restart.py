"""Nothing lost, nothing hung: resume, elastic restarts, failing ranks, and the bad-input catalogue."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import (REPO, SMALL_TIMERXL as TIMERXL, assert_ok, free_port, make_args, make_experiment, records,
                     run_cli, run_command, run_on_ranks, subprocess_env)

SMALL_TIMERXL = [*TIMERXL, "--input_token_len", 24, "--output_token_len", 24]


class Streamed:
    """A process whose output is collected line by line while it runs."""

    def __init__(self, cmd, env=None):
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env or subprocess_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, text, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(text in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"never saw {text!r}:\n{''.join(self.lines)[-3000:]}")

    def finish(self, timeout=240):
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return self.proc.returncode, "".join(self.lines)


def _outputs(tmp):
    return ["--checkpoints", tmp / "checkpoints", "--results_dir", tmp / "results"]


def _losses(record):
    return [(h["epoch"], h["train_loss"], h["vali_loss"], h["test_loss"]) for h in record["history"]]


def _assert_same_run(a, b):
    assert [e for e, *_ in _losses(a)] == [e for e, *_ in _losses(b)]
    for x, y in zip(_losses(a), _losses(b)):
        assert x == pytest.approx(y, rel=1e-6)
    for key in ("mse", "mae", "rmse", "mape", "mspe", "vali_loss"):
        assert a[key] == pytest.approx(b[key], rel=1e-6), key


# ---------------------------------------------------------------- resume
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    argv = [*SMALL_TIMERXL, "--train_epochs", 4, "--lradj", "type1"]
    assert_ok(run_cli(tmp_path / "straight", *argv))
    reference = records(tmp_path / "straight")[-1]

    broken = tmp_path / "broken"
    run = Streamed([sys.executable, "run.py", *map(str, argv + _outputs(broken))])
    run.wait_for("epoch 2/")
    os.killpg(run.proc.pid, signal.SIGKILL)  # no chance to clean up, as in a preemption
    run.finish()
    assert not (broken / "results" / "results.jsonl").exists()
    proc = run_cli(broken, *argv, "--resume")
    assert_ok(proc)
    assert "resumed from" in proc.stdout
    _assert_same_run(records(broken)[-1], reference)


def test_resume_refuses_other_model_arguments(tmp_path):
    assert_ok(run_cli(tmp_path, "--train_epochs", 1))
    last = tmp_path / "checkpoints" / records(tmp_path)[-1]["setting"] / "last.pth"
    proc = run_cli(tmp_path, "--train_epochs", 2, "--resume", last, "--moving_avg", 13, "--individual",
                   "--times_padding", "tail")
    assert proc.returncode == 2
    assert "moving_avg (saved 25, now 13); individual (saved False, now True)" in proc.stderr
    assert "times_padding (saved 'zeros', now 'tail')" in proc.stderr


def test_resume_of_a_finished_run_trains_no_more(tmp_path):
    assert_ok(run_cli(tmp_path, "--train_epochs", 2))
    proc = run_cli(tmp_path, "--train_epochs", 2, "--resume")
    assert_ok(proc)
    assert "epoch " not in proc.stdout.replace("after epoch", "")
    first, second = records(tmp_path)
    _assert_same_run(first, second)


# ---------------------------------------------------------------- elastic restarts
def _worker_pids(launcher_pid):
    """Worker processes started by torchrun's agent, as {local_rank: pid}."""
    workers = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher_pid:
            for item in environ:
                if item.startswith(b"LOCAL_RANK="):
                    workers[int(item.split(b"=")[1])] = int(entry.name)
    return workers


def test_sigkilled_worker_is_restarted_and_resumes(tmp_path):
    argv = [*SMALL_TIMERXL, "--train_epochs", 3]
    env = dict(MODEL="TimerXL", MASTER_PORT=str(free_port()), MAX_RESTARTS="1")
    straight = run_command(["bash", "scripts/ddp_forecast.sh", *map(str, argv + _outputs(tmp_path / "a"))],
                           timeout=300, extra_env=env)
    assert_ok(straight)
    reference = records(tmp_path / "a")[-1]

    env["MASTER_PORT"] = str(free_port())
    run = Streamed(["bash", "scripts/ddp_forecast.sh", *map(str, argv + _outputs(tmp_path / "b"))],
                   env=dict(subprocess_env(), **env))
    run.wait_for("epoch 1/")  # the summary line: last.pth of epoch 1 exists
    time.sleep(0.3)  # into epoch 2
    victim = _worker_pids(run.proc.pid)[1]
    os.kill(victim, signal.SIGKILL)
    code, output = run.finish()
    assert code == 0, output[-3000:]
    assert "resumed from" in output and "after epoch 1" in output
    result = records(tmp_path / "b")[-1]
    assert result["world_size"] == 2
    _assert_same_run(result, reference)


# ---------------------------------------------------------------- failing ranks
FAULT = '''
import os, sys
if os.environ.get("RANK") == "1":
    sys.path.insert(0, os.environ["TSL_REPO"])
    import exp.forward
    forward = exp.forward.forward
    calls = []
    def faulty(model, batch, args, stage, device):
        calls.append(stage)
        if calls.count("train") == 3:
            raise RuntimeError("injected fault on rank 1, third batch")
        return forward(model, batch, args, stage, device)
    exp.forward.forward = faulty  # before exp.exp_forecast imports it
'''


def test_a_raising_rank_ends_the_whole_job_promptly(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(FAULT)  # injected from outside the code under test
    started = time.time()
    proc = run_command([sys.executable, "run.py", "--ddp", "--nproc_per_node", "3", "--dist_timeout", "5",
                        *map(str, _outputs(tmp_path))], timeout=120,
                       extra_env={"PYTHONPATH": str(tmp_path), "TSL_REPO": str(REPO)})
    elapsed = time.time() - started
    assert proc.returncode != 0
    assert elapsed < 5 + 10 + 5, f"{elapsed:.1f}s"  # dist_timeout + 10 s, plus process start-up
    first_error = proc.stderr.index("RuntimeError: injected fault on rank 1")
    assert first_error < proc.stderr.index("worker(s) failed")
    assert "Watchdog" not in proc.stderr


def _evaluate_small(rank, world, argv):
    from data_provider.data_factory import data_provider

    args = make_args(*argv, "--ddp")
    exp = make_experiment(args)
    _, vali_loader = data_provider(args, "val")
    return exp.vali(vali_loader), len(vali_loader.sampler)


def test_ranks_without_windows_contribute_nothing():
    argv = ["--synthetic_rows", 970]  # 2 validation windows
    (reference, n), = run_on_ranks(_evaluate_small, 1, argv)
    assert n == 2
    results = run_on_ranks(_evaluate_small, 3, argv)
    assert [count for _, count in results] == [0, 1, 1]
    assert all(loss == pytest.approx(reference, rel=1e-6) for loss, _ in results)


# ---------------------------------------------------------------- bad-input catalogue
def _csv(tmp, name, frame):
    frame.to_csv(tmp / name, index=False)
    return ["--data", "custom", "--root_path", tmp, "--data_path", name]


def _dated(rows=400, **columns):
    frame = pd.DataFrame({"date": pd.date_range("2021-01-01", periods=rows, freq="h")})
    for name, values in columns.items():
        frame[name] = values
    return frame


def _empty(tmp):
    (tmp / "empty.csv").write_text("")
    return ["--data", "custom", "--root_path", tmp, "--data_path", "empty.csv"]


def _nan(tmp):
    values = np.arange(400.0)
    values[[5, 9]] = np.nan
    return _csv(tmp, "nan.csv", _dated(a=values, OT=np.ones(400)))


def _inf(tmp):
    values = np.ones(400)
    values[7] = np.inf
    return _csv(tmp, "inf.csv", _dated(a=np.ones(400), OT=values))


def _text(tmp):
    return _csv(tmp, "text.csv", _dated(a=["x"] + [1.0] * 399, OT=np.ones(400)))


def _bad_date(tmp):
    frame = _dated(a=np.ones(400), OT=np.ones(400))
    frame["date"] = frame["date"].astype(str)
    frame.loc[10, "date"] = "yesterday-ish"
    return _csv(tmp, "dates.csv", frame)


def _univariate(tmp):
    return [*_csv(tmp, "uni.csv", _dated(OT=np.sin(np.arange(400.0)))), "--features", "MS"]


def _file_in_the_way(tmp, option):
    (tmp / "a_file").write_text("not a folder")
    return [f"--{option}", tmp / "a_file" / "sub"]


CATALOGUE = {
    "missing file": (lambda t: ["--data", "custom", "--root_path", t, "--data_path", "nope.csv"],
                     "data file not found"),
    "empty file": (_empty, "empty.csv is empty"),
    "unknown target": (lambda t: ["--target", "price"], "--target 'price' is not a column of the data"),
    "non-numeric column": (_text, "column 'a' is not numeric (e.g. 'x' in row 1)"),
    "NaN values": (_nan, "NaN or infinite values in column(s) 'a' (2)"),
    "inf values": (_inf, "NaN or infinite values in column(s) 'OT' (1)"),
    "series too short": (lambda t: ["--synthetic_rows", 1000, "--pred_len", 200],
                         "the val split of synthetic has 196 rows, fewer than the 296"),
    "unparsable date": (_bad_date, "the 'date' column cannot be parsed as timestamps"),
    "batch size": (lambda t: ["--batch_size", 0], "--batch_size must be positive, got 0"),
    "no batch left to train": (lambda t: ["--train_drop_last", "--batch_size", 100000],
                               "--train_drop_last leaves no training batch: each process holds 1655 training "
                               "windows, fewer than --batch_size 100000"),
    "token multiple": (lambda t: ["--model", "TimerXL", "--seq_len", 100],
                       "--seq_len (100) must be a multiple of --input_token_len (24)"),
    "MS on univariate": (_univariate, "--features MS needs covariates"),
    "unknown model": (lambda t: ["--model", "Nope"], "unknown --model 'Nope'; available: DLinear, "),
    "unknown data": (lambda t: ["--data", "ETTh3"], "unknown --data 'ETTh3'; choose one of ETTh1"),
    "unknown lradj": (lambda t: ["--lradj", "fancy"], "unknown --lradj 'fancy'; choose one of type1"),
    "unwritable checkpoints": (lambda t: _file_in_the_way(t, "checkpoints"), "--checkpoints"),
    "unwritable results_dir": (lambda t: _file_in_the_way(t, "results_dir"), "--results_dir"),
}


@pytest.mark.parametrize("case", CATALOGUE)
def test_bad_input_catalogue_under_ddp(tmp_path, case):
    build, message = CATALOGUE[case]
    argv = build(tmp_path)
    sentinel = tmp_path / "results" / "results.jsonl"
    sentinel.parent.mkdir()
    sentinel.write_text('{"earlier": "result"}\n')
    outputs = [] if any(str(a).startswith("--checkpoints") or str(a).startswith("--results_dir") for a in argv) \
        else _outputs(tmp_path)
    started = time.time()
    proc = run_cli(tmp_path, *argv, *outputs, "--ddp", "--nproc_per_node", 2, outputs=False, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr, proc.stderr[-2000:]
    worker_lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ") and "worker" not in line]
    assert len(worker_lines) == 1  # one line, from rank 0
    assert "Traceback" not in proc.stderr + proc.stdout
    assert time.time() - started < 30
    assert sentinel.read_text() == '{"earlier": "result"}\n'  # nothing overwritten
    if "unwritable" in case:
        assert "is not a writable folder" in proc.stderr


@pytest.fixture(scope="module")
def timerxl_checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("timerxl")
    assert_ok(run_cli(tmp, *SMALL_TIMERXL, "--train_epochs", 1))
    return tmp / "checkpoints" / records(tmp)[-1]["setting"] / "checkpoint.pth"


def test_checkpoint_of_another_model_is_refused_and_left_intact(tmp_path, timerxl_checkpoint):
    before = timerxl_checkpoint.read_bytes()
    proc = run_cli(tmp_path, "--is_training", 0, "--checkpoint", timerxl_checkpoint, "--ddp", "--nproc_per_node", 2)
    assert proc.returncode == 2
    assert "does not fit model DLinear: missing: Linear_Seasonal.bias" in proc.stderr
    assert "unexpected: blocks." in proc.stderr
    assert timerxl_checkpoint.read_bytes() == before
    assert not (tmp_path / "results" / "results.jsonl").exists()


def test_corrupt_training_state_is_refused(tmp_path):
    (tmp_path / "last.pth").write_bytes(b"PK\x03\x04 definitely not a checkpoint")
    proc = run_cli(tmp_path, "--resume", tmp_path / "last.pth")
    assert proc.returncode == 2 and "truncated or corrupt" in proc.stderr
