"""The processes of a run: every rank evaluates one model and reads one data set; workers die with
their launcher; a user error is not retried; a stopped or killed run leaves nothing behind."""
import pytest
import torch

from helpers import make_args, make_experiment, run_on_ranks

# A PatchTST small enough for CPU tests: its BatchNorm keeps running statistics per rank.
SMALL_PATCHTST = ["--model", "PatchTST", "--d_model", 16, "--d_ff", 32, "--e_layers", 1, "--n_heads", 2,
                  "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--synthetic_rows", 1200,
                  "--batch_size", 16, "--train_epochs", 1]


def output_args(folder):
    return ["--checkpoints", folder / "checkpoints", "--results_dir", folder / "results"]


def _train_patchtst(rank, world, folder):
    """One epoch of PatchTST on this rank; (history, checkpoint, whether the ranks' BatchNorm
    statistics differed before the evaluation's broadcast)."""
    from exp.settings import setting_name
    from utils import distributed

    args = make_args(*SMALL_PATCHTST, "--ddp", *output_args(folder))
    exp = make_experiment(args)
    differed = []
    broadcast = distributed.broadcast_buffers

    def watched(module):
        stats = torch.cat([b.reshape(-1) for b in module.buffers() if b.is_floating_point()])
        differed.append(any(not torch.equal(s, stats) for s in distributed.gather_objects(stats)))
        return broadcast(module)

    distributed.broadcast_buffers = watched
    training = exp.train(setting_name(args, 0))
    return training["history"], training["checkpoint"], differed


@pytest.mark.parametrize("world", [2, 3])
def test_batchnorm_ranks_validate_the_model_rank_0_saves(tmp_path, world):
    """The epoch's validation loss is the saved checkpoint's, evaluated alone on one process."""
    from data_provider.data_factory import data_provider
    from utils.checkpoint import load_weights

    history, checkpoint, differed = run_on_ranks(_train_patchtst, world, tmp_path, timeout=300)[0]
    assert differed == [True]  # each rank's last step left its own statistics: the case that matters
    args = make_args(*SMALL_PATCHTST, *output_args(tmp_path))
    exp = make_experiment(args)
    load_weights(exp.raw_model, checkpoint)
    alone = exp.vali(data_provider(args, "val")[1])
    assert history[0]["vali_loss"] == pytest.approx(alone, rel=1e-7, abs=0)


def _node_csv(folder, rank, change):
    """This rank's own copy of data.csv, as a node with its own disk holds it; rank 1's differs by `change`."""
    from data_provider.synthetic import make_synthetic

    frame = make_synthetic(rows=1500, channels=3, seed=1)
    if rank == 1 and change == "one value":  # same length: the same window count, silently other numbers
        frame.iloc[100, 1] += 1.0
    elif rank == 1 and change == "rows missing":  # fewer windows: the ranks' collectives would not pair
        frame = frame.iloc[:-40]
    node = folder / f"node{rank}"
    node.mkdir(parents=True, exist_ok=True)
    frame.to_csv(node / "data.csv", index=False)
    return node


def _run_main_on_node(rank, world, folder, change):
    """run.py's main on this rank with its own copy of the data; (exit code, stderr)."""
    import contextlib
    import gc
    import io

    import run
    from utils import distributed

    node = _node_csv(folder, rank, change)
    distributed.cleanup = gc.collect  # free a DDP wrapper; the test harness destroys its own group
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        argv = ["--data", "custom", "--root_path", node, "--data_path", "data.csv", "--train_epochs", 1,
                "--dist_timeout", 30, "--no_plots", *output_args(folder)]
        code = run.main(list(map(str, argv)))
    return code, stderr.getvalue()


@pytest.mark.parametrize("change", ["one value", "rows missing"])
def test_ranks_reading_different_data_stop_naming_them(tmp_path, change):
    import time

    started = time.time()
    results = run_on_ranks(_run_main_on_node, 2, tmp_path, change, timeout=120)
    assert [code for code, _ in results] == [2, 2]
    lines = results[0][1].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the prepared data differs between processes: rank 0 (")
    assert "rank 1 (" in lines[0] and "--data_path data.csv" in lines[0], lines[0]
    assert results[1][1] == ""  # rank 1 says nothing: rank 0 speaks for the job
    assert time.time() - started < 60
    assert not (tmp_path / "results").exists()


def _children(pid):
    """Pids of the live processes whose parent is `pid`."""
    import os

    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def _alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_long_run(tmp_path, launcher, *extra):
    """A run that trains for a long time (2 processes unless `launcher` is plain run.py); (process,
    its output lines as they come, their reader thread) once its first epoch has ended."""
    import subprocess
    import sys
    import threading
    import time

    from helpers import REPO, subprocess_env

    cmd = {"run.py": [sys.executable, "run.py"],
           "run.py --ddp": [sys.executable, "run.py", "--ddp", "--nproc_per_node", "2"],
           "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "run.py"]}[launcher]
    cmd += ["--train_epochs", 10000, "--patience", 10000, "--synthetic_rows", 1500, "--no_plots", *extra,
            *output_args(tmp_path)]
    proc = subprocess.Popen(list(map(str, cmd)), cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.time() + 180
    while not any(line.startswith("epoch 1/") for line in lines):
        assert time.time() < deadline and proc.poll() is None, "".join(lines)
        time.sleep(0.2)
    return proc, lines, reader


@pytest.mark.parametrize("launcher", ["run.py --ddp", "torchrun"])
def test_workers_die_with_a_killed_launcher(tmp_path, launcher):
    import os
    import signal
    import time

    proc, _, _ = _start_long_run(tmp_path, launcher)
    workers = _children(proc.pid)
    assert len(workers) == 2
    try:
        proc.kill()
        killed = time.time()
        while any(map(_alive, workers)) and time.time() - killed < 10:
            time.sleep(0.1)
        assert not any(map(_alive, workers)), f"workers still running {time.time() - killed:.0f} s after the launcher"
        assert time.time() - killed < 5
        time.sleep(1)
        assert not (tmp_path / "results" / "results.jsonl").exists()
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("nproc", [2, 1])
def test_a_user_error_is_not_retried_under_max_restarts(tmp_path, nproc):
    """Every node's agent is told by its local rank 0, also where a node runs one process."""
    import sys
    import time

    from helpers import run_command

    started = time.time()
    proc = run_command([sys.executable, "-m", "utils.launch", "--standalone", "--nproc_per_node", str(nproc),
                        "--max_restarts", "3", "run.py", "--data", "custom", "--root_path", str(tmp_path),
                        "--data_path", "missing.csv", "--no_plots", *map(str, output_args(tmp_path))])
    seconds = time.time() - started
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr
    assert errors == [f"error: data file not found: {tmp_path / 'missing.csv'}; set --root_path and --data_path "
                      "(or use --data synthetic)"], proc.stderr  # one attempt, no launcher summary
    assert "Traceback" not in proc.stderr + proc.stdout
    assert seconds < 60


def test_temp_files_of_a_killed_save_are_removed_on_the_next_start(tmp_path):
    import os
    import time

    args = make_args("--synthetic_rows", 1500, "--train_epochs", 1, "--no_plots", *output_args(tmp_path))
    exp = make_experiment(args)
    folders = [tmp_path / "checkpoints" / "s", tmp_path / "results" / "s"]
    now = time.time()
    for folder in folders:
        folder.mkdir(parents=True)
        for name, age in ((".tmp_killed.pth", 60), (".tmp_live.pth", -60), ("kept.tmp", 60)):
            (folder / name).write_bytes(b"half")
            os.utime(folder / name, (now - age, now - age))
    exp.train("s")
    for folder in folders:
        names = set(os.listdir(folder))
        assert ".tmp_killed.pth" not in names  # left by a run SIGKILLed mid-save
        assert {".tmp_live.pth", "kept.tmp"} <= names  # written after this start / not atomic_write's


@pytest.mark.parametrize("launcher", ["run.py --ddp", "run.py"])
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_stopped_run_ends_with_one_line_saying_how_to_resume(tmp_path, launcher, signal_name):
    import signal
    import time

    signum = getattr(signal, signal_name)
    proc, lines, reader = _start_long_run(tmp_path, launcher)
    workers = _children(proc.pid) if launcher != "run.py" else []
    try:
        proc.send_signal(signum)
        stopped = time.time()
        proc.wait(timeout=30)
        seconds = time.time() - stopped
        reader.join(timeout=10)
    finally:
        proc.kill()
    output = "".join(lines)
    assert proc.returncode == 128 + signum, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == [f"error: stopped by {signal_name}; every finished epoch is saved: run the same command with "
                      "--resume to continue after the last one"], output[-3000:]
    assert "Traceback" not in output
    assert seconds < 10
    assert not any(map(_alive, workers))


def test_a_worker_whose_launcher_died_before_it_started_stops_at_once():
    """The launcher died while the worker was starting: its parent is no longer the pid the launcher recorded."""
    import sys

    from helpers import run_command

    code = "from utils import worker; worker.die_with_launcher(); print('still training')"
    env = {"LOCAL_RANK": "0", "WORLD_SIZE": "2", "TSL_LAUNCHER_PID": "999999999"}
    proc = run_command([sys.executable, "-c", code], timeout=60, extra_env=env)
    assert proc.returncode == 1 and "still training" not in proc.stdout
    assert proc.stderr.strip() == "error: the launcher (pid 999999999) is gone; this worker stops"
    proc = run_command([sys.executable, "-c", code], timeout=60, extra_env=dict(env, TSL_LAUNCHER_PID=""))
    assert proc.returncode == 0 and "still training" in proc.stdout  # external torchrun: its parent is the agent


# ---------------------------------------------------------------- the best weights' save (checkpoint.pth)
def test_best_weights_that_cannot_be_written_stop_every_rank_with_one_line(tmp_path):
    """A folder stands where checkpoint.pth goes: both ranks stop at the first evaluation with the same
    line (it was an IsADirectoryError on rank 0 and rank 1 left in the barrier), nothing half-written."""
    from exp.settings import setting_name
    from helpers import assert_one_error_line, run_cli

    argv = ["--synthetic_rows", 1500, "--num_threads", 1, "--train_epochs", 2]
    args = make_args(*argv)
    args.autoregressive = False  # as resolve_args decides for DLinear
    blocker = tmp_path / "checkpoints" / setting_name(args, 0) / "checkpoint.pth"
    blocker.mkdir(parents=True)
    proc = run_cli(tmp_path, *argv, nproc=2, timeout=120)
    assert_one_error_line(proc, f"error: cannot write the best weights {blocker} (Is a directory); the previous one "
                                "is intact. Free space or fix the folder's permissions (or move away what stands")
    assert blocker.is_dir() and not any(blocker.iterdir())
    assert sorted(p.name for p in blocker.parent.iterdir()) == ["checkpoint.pth"]  # no temp file, no last.pth
    assert not (tmp_path / "results" / "results.jsonl").exists()


def _save_best_twice(rank, world, folder, how):
    """save_best, then rank 0's folder turns read-only (or its disk full) and save_best again with other
    weights: (what every rank raised the second time, the first file's bytes)."""
    import os
    import resource
    import signal

    from utils.checkpoint import save_best
    from utils.errors import UserError

    # "full mid-archive": weights past io's 8 KiB buffer, so the write fails inside torch's zip writer, which
    # then fails again finishing the archive (a RuntimeError over the OSError: it was a traceback, exit 1)
    size = 300 if how == "full mid-archive" else 30
    model, path = torch.nn.Linear(size, size), folder / "checkpoint.pth"
    save_best(model, path)
    first = path.read_bytes()
    with torch.no_grad():
        model.weight.add_(1.0)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    if rank == 0 and how == "read-only":
        os.chmod(folder, 0o555)
    elif rank == 0:  # the write stops part-way: a file may grow to 100 bytes (100 kB mid-archive) only
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then write() fails with EFBIG, not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000 if how == "full mid-archive" else 100, limit[1]))
    try:
        save_best(model, path)
    except UserError as error:
        return str(error), first
    finally:
        os.chmod(folder, 0o755)
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)


def _writes_into_read_only_folders(folder):
    probe = folder / "read-only"
    probe.mkdir(mode=0o555)
    try:
        (probe / "file").touch()
        return True
    except PermissionError:
        return False


@pytest.mark.parametrize("how", ["read-only", "full", "full mid-archive"])
def test_best_weights_rank_0_cannot_write_mid_run_stop_every_rank_keeping_the_previous(tmp_path, how):
    """The folder made read-only (or the disk full) after a first checkpoint.pth: every rank stops with one
    line, the first file intact (it was a PermissionError on rank 0 plus a gloo traceback on rank 1). A disk
    that fills inside torch's zip writer gives the same line (it was the writer's RuntimeError, uncaught)."""
    folder = tmp_path / "setting"
    folder.mkdir()
    if how == "read-only" and _writes_into_read_only_folders(tmp_path):
        pytest.skip("this user writes into read-only folders (root); the full-disk case fails the same save")
    (stopped, first), (stopped_too, _) = run_on_ranks(_save_best_twice, 2, folder, how)
    why = "Permission denied" if how == "read-only" else "File too large"
    line = (f"cannot write the best weights {folder / 'checkpoint.pth'} ({why}); the previous one is intact. Free "
            "space or fix the folder's permissions (or move away what stands at that path), then run again with --resume")
    assert stopped == stopped_too == line
    assert (folder / "checkpoint.pth").read_bytes() == first
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.pth"]  # no temp file left


# ---------------------------------------------------------------- file modes
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)], ids=["umask 022", "umask 077"])
def test_every_file_a_run_or_a_corpus_build_writes_has_the_umasks_mode(tmp_path, monkeypatch, umask, mode):
    """Files are made as open() makes them, 0o666 less the umask: a corpus or results another user must
    read are readable under umask 022 (atomic_write's temp files were mkstemp's 0o600 whatever the umask)."""
    import os

    import run
    from data_provider.corpus import build
    from data_provider.synthetic import make_synthetic

    monkeypatch.setattr(run, "configure_logging", lambda quiet=False: None)  # keep the tsl logger as tests find it
    make_synthetic(rows=600, channels=2, seed=1).to_csv(tmp_path / "series.csv", index=False)
    argv = ["--train_steps", 2, "--log_steps", 1, "--save_steps", 1, "--synthetic_rows", 1500, "--do_predict",
            "--quiet", *output_args(tmp_path)]
    before = os.umask(umask)
    try:
        assert run.main(list(map(str, argv))) == 0
        build(str(tmp_path / "corpus"), [str(tmp_path / "series.csv")], progress=False)
        _export_every_release_folder(tmp_path / "export")
    finally:
        os.umask(before)
    written = [p for folder in ("checkpoints", "results", "corpus", "export") for p in (tmp_path / folder).rglob("*")
               if p.is_file()]
    names = {p.name for p in written}
    assert {"checkpoint.pth", "last.pth", "metrics.json", "window_errors.csv", "steps.csv", "forecast.csv",
            "results.jsonl", "index.json", "model.safetensors", "config.json", "ours.pth"} <= names, names
    assert {str(p): oct(p.stat().st_mode & 0o777) for p in written} == {str(p): oct(mode) for p in written}


def _export_every_release_folder(out):
    """`python -m exp.export export` of each released folder the tests hold, back to its own layout
    (config.json + model.safetensors, which safetensors' save_file made 0o600) and to ours (one .pth)."""
    from pathlib import Path

    from exp.export import main as checkpoint_main

    releases = Path(__file__).resolve().parent.parent / "models" / "foundation"  # each one's tests/fixture
    for folder, layout in (("timer_base", "timer-base"), ("sundial", "sundial"), ("time_moe", "time-moe"),
                           ("moirai2", "moirai2")):
        fixture = releases / folder / "tests" / "fixture"
        assert checkpoint_main(["export", "--to", layout, str(fixture), str(out / layout)]) == 0
    fixture = releases / "timer_base" / "tests" / "fixture"
    assert checkpoint_main(["export", "--to", "ours", str(fixture), str(out / "ours.pth")]) == 0
