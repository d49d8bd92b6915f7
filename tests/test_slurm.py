"""SLURM: scripts/slurm/ddp_forecast.sbatch (one srun task per node, each running torchrun with c10d
rendezvous on the first node), and one srun task per GPU without torchrun, whose SLURM_* variables
utils.worker.slurm_task_variables maps to torchrun's env:// variables.

Without SLURM on the machine, everything runs on loopback: the variables are set as srun sets them,
for two "nodes" that are both 127.0.0.1, and the sbatch script runs with stand-ins for `srun` and
`scontrol` on PATH. A real srun job runs only where srun exists (skipped otherwise, with the reason).
"""
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from helpers import (REPO, _read_if_there, _run_py_child, _wait_like_torchrun, assert_ok, assert_one_error_line,
                     free_port, output_args, records, run_cli, subprocess_env, warm_context)
from utils.worker import adopt_slurm_task, first_slurm_host, slurm_task_variables
from utils.errors import UserError

SBATCH = REPO / "scripts" / "slurm" / "ddp_forecast.sbatch"
ARGS = ["--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--train_epochs", 2,
        "--num_threads", 1, "--dist_timeout", 30]  # one thread each: the same arithmetic in every layout
METRICS = ("vali_loss", "mse", "mae", "rmse", "mape", "mspe")


def srun_task(procid, tasks_per_node, job_id="4242", **extra):
    """The variables srun gives task `procid` of a step with tasks_per_node[i] tasks on node i (block
    distribution: node 0 holds the first tasks), as `srun --nodes=N python ...` would."""
    node, first = 0, 0
    while procid >= first + tasks_per_node[node]:
        first += tasks_per_node[node]
        node += 1
    tasks = sum(tasks_per_node)
    per_node = ",".join(map(str, tasks_per_node))
    if len(set(tasks_per_node)) == 1:
        per_node = f"{tasks_per_node[0]}(x{len(tasks_per_node)})"  # how SLURM writes it
    return dict(dict(SLURM_JOB_ID=job_id, SLURM_STEP_ID="0", SLURM_PROCID=str(procid), SLURM_LOCALID=str(procid - first),
                     SLURM_NODEID=str(node), SLURM_NTASKS=str(tasks), SLURM_STEP_NUM_TASKS=str(tasks),
                     SLURM_NNODES=str(len(tasks_per_node)), SLURM_STEP_TASKS_PER_NODE=per_node,
                     SLURM_TASKS_PER_NODE=per_node, SLURM_JOB_NODELIST="gpu[07-08]",
                     SLURM_STEP_NODELIST="gpu[07-08]"), **extra)


def mapped(procid, tasks_per_node, ddp=True, **extra):
    return slurm_task_variables(srun_task(procid, tasks_per_node, **extra), ddp, first_host=lambda nodes: "gpu07")


# ---------------------------------------------------------------- the mapping, as a function
@pytest.mark.parametrize("procid, tasks_per_node, rank, local_rank, local_world", [
    (0, [1, 1], 0, 0, 1),  # two nodes, one task (GPU) each
    (1, [1, 1], 1, 0, 1),
    (1, [2, 1], 1, 1, 2),  # three tasks on two nodes: 2 + 1
    (2, [2, 1], 2, 0, 1),
    (5, [4, 4], 5, 1, 4),  # two nodes of 4 GPUs
])
def test_srun_tasks_become_torchrun_workers(procid, tasks_per_node, rank, local_rank, local_world):
    variables, warning = mapped(procid, tasks_per_node)
    assert warning is None
    assert variables == dict(RANK=str(rank), WORLD_SIZE=str(sum(tasks_per_node)), LOCAL_RANK=str(local_rank),
                             LOCAL_WORLD_SIZE=str(local_world), MASTER_ADDR="gpu07", MASTER_PORT=str(15000 + 4242))


def test_the_job_wide_variables_serve_when_the_step_ones_are_missing():
    env = srun_task(3, [2, 2])
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        del env[name]
    env["SLURM_NTASKS_PER_NODE"] = "2"
    variables, _ = slurm_task_variables(dict(env, MASTER_ADDR="10.0.0.1", MASTER_PORT="29400"), True)
    assert variables == dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")  # given ones are kept


@pytest.mark.parametrize("torchrun_sets", ["RANK", "WORLD_SIZE", "LOCAL_RANK"])
def test_torchrun_inside_srun_wins(torchrun_sets):
    """The sbatch script runs torchrun as srun's task: its workers see SLURM_PROCID (the node's task) and
    torchrun's RANK; SLURM's must change nothing."""
    assert mapped(1, [1, 1], **{torchrun_sets: "0"}) == ({}, None)


def test_adopting_never_replaces_a_variable(monkeypatch):
    for name, value in srun_task(1, [1, 1]).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.9")
    monkeypatch.setenv("MASTER_PORT", "29999")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        # set, then removed: monkeypatch records the variable and removes what adopt_slurm_task sets at the end
        # (delenv of an absent variable records nothing, and RANK=1 outlived the test into later ones)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert adopt_slurm_task(True) == (True, None)
    assert [os.environ[n] for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")] == [
        "1", "2", "0", "10.0.0.9", "29999"]
    monkeypatch.setenv("RANK", "0")  # as torchrun inside srun would: nothing moves
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert adopt_slurm_task(True) == (False, None) and os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "8"


def test_no_mapping_outside_a_srun_step_of_several_tasks():
    one_task = srun_task(0, [1])
    assert slurm_task_variables(one_task, True) == ({}, None)  # run.py --ddp starts local workers, as anywhere
    assert slurm_task_variables({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, True) == ({}, None)  # salloc's shell
    for batch_step in ({}, {"SLURM_STEP_ID": str(0xFFFFFFFB)}):  # the batch script itself: no task of a step
        env = {k: v for k, v in srun_task(0, [4, 4]).items() if not k.startswith("SLURM_STEP")}
        variables, warning = slurm_task_variables(dict(env, **batch_step), True)
        assert variables == {} and "batch script of a job of 8 tasks" in warning and "srun" in warning
        assert slurm_task_variables(dict(env, **batch_step), False) == ({}, None)


def test_several_tasks_without_ddp_warn():
    variables, warning = mapped(1, [1, 1], ddp=False)
    assert variables == {} and "task 1 of 2" in warning and "--ddp is not given" in warning


def test_master_addr_comes_from_the_first_node_of_the_step(tmp_path, monkeypatch):
    asked = []
    env = srun_task(1, [1, 1], SLURM_STEP_NODELIST="gpu[08-09]")
    variables, _ = slurm_task_variables(env, True, first_host=lambda nodes: asked.append(nodes) or "gpu08")
    assert variables["MASTER_ADDR"] == "gpu08" and asked == ["gpu[08-09]"]  # the step's nodes: task 0 runs there
    # without scontrol: a plain list's first name, else one line saying to set MASTER_ADDR
    monkeypatch.setenv("PATH", str(tmp_path))
    assert first_slurm_host("node3,node4") == "node3"
    assert first_slurm_host("gpu[08-09]") is None
    with pytest.raises(UserError, match=r"^set MASTER_ADDR to the address of the node that runs task 0 .*gpu\[08-09\]"):
        slurm_task_variables(env, True)
    # with scontrol: its expansion
    fake_scontrol = tmp_path / "scontrol"
    fake_scontrol.write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && echo gpu08 && echo gpu09\n')
    fake_scontrol.chmod(0o755)
    assert first_slurm_host("gpu[08-09]") == "gpu08"


@pytest.mark.parametrize("name, value, message", [
    ("SLURM_PROCID", "x", "SLURM_PROCID='x' is not a whole number >= 0"),
    ("SLURM_PROCID", "2", "SLURM_PROCID=2 is not a task of SLURM_STEP_NUM_TASKS=2 (tasks are numbered 0 to 1); "),
    ("SLURM_LOCALID", "-1", "SLURM_LOCALID='-1' is not a whole number >= 0"),
    ("SLURM_LOCALID", "1", "SLURM_LOCALID=1 is not one of the 1 task(s) that SLURM_STEP_TASKS_PER_NODE counts"),
    ("SLURM_STEP_NUM_TASKS", "two", "SLURM_STEP_NUM_TASKS='two' is not a whole number >= 1"),
    ("SLURM_STEP_TASKS_PER_NODE", "1(x", "SLURM_STEP_TASKS_PER_NODE='1(x' is not a list of tasks per node"),
    ("SLURM_JOB_ID", "", "set MASTER_PORT to a free port"),
])
def test_a_value_that_does_not_fit_is_one_line(name, value, message):
    with pytest.raises(UserError) as refused:
        mapped(1, [1, 1], **{name: value})
    text = str(refused.value)
    assert text.startswith(message) and "\n" not in text, text


def test_nproc_per_node_under_a_multi_task_step_is_refused():
    with pytest.raises(UserError, match="--nproc_per_node starts local workers, but srun started this task"):
        slurm_task_variables(srun_task(0, [1, 1]), True, nproc_per_node=4)


# ---------------------------------------------------------------- run.py as srun's tasks, on loopback
def fork_tasks(argv, environments, timeout=120):
    """run.py as start_tasks starts it, stopped as helpers.fork_run_py's processes are (once one fails, the
    others); (return code, stdout, stderr) of all together."""
    with tempfile.TemporaryDirectory() as folder:
        processes, streams = start_tasks(argv, environments, folder)
        failure = _wait_like_torchrun(processes, timeout)
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join()
        out = "".join(_read_if_there(path) for path, _ in streams)
        err = "".join(_read_if_there(path) for _, path in streams)
    return subprocess.CompletedProcess(argv, 0 if failure is None else failure.exitcode, out, err)


def start_tasks(argv, environments, folder):
    """run.py with `argv`, one process per environment (added to the test environment), forked from the warm
    interpreter and started; (the processes, the (stdout, stderr) files of each in `folder`)."""
    context = warm_context()
    streams = [(os.path.join(folder, f"{i}.out"), os.path.join(folder, f"{i}.err")) for i in range(len(environments))]
    argv = list(map(str, argv))
    processes = [context.Process(target=_run_py_child, args=(argv, dict(subprocess_env(), **env), *paths))
                 for env, paths in zip(environments, streams)]
    for process in processes:
        process.start()
    return processes, streams


def srun_on_loopback(argv, tasks_per_node, folder, **extra):
    """run.py as the tasks of `srun` over len(tasks_per_node) "nodes", all 127.0.0.1."""
    port = free_port()
    envs = [srun_task(i, tasks_per_node, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **extra)
            for i in range(sum(tasks_per_node))]
    return fork_tasks([*argv, "--no_plots", *output_args(folder)], envs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A checkpoint trained by one process, and that run's record (its test: the same weights, 1 process)."""
    folder = tmp_path_factory.mktemp("one_process")
    assert_ok(run_cli(folder, *ARGS))
    record, = records(folder)
    return folder / "checkpoints" / record["setting"] / "checkpoint.pth", record


@pytest.mark.parametrize("tasks_per_node", [[1, 1], [2, 1]], ids=["2 nodes x 1 task", "2 nodes, 2 + 1 tasks"])
def test_srun_tasks_evaluate_exactly_like_one_process(trained, tasks_per_node, tmp_path):
    """`srun python run.py --ddp ...`, one task per GPU: the tasks join one process group by SLURM's
    variables alone and score the checkpoint as one process does (3 tasks: uneven shards)."""
    checkpoint, reference = trained
    proc = srun_on_loopback([*ARGS, "--ddp", "--is_training", 0, "--checkpoint", checkpoint], tasks_per_node, tmp_path)
    assert_ok(proc)
    record, = records(tmp_path)
    assert record["world_size"] == sum(tasks_per_node)
    assert record["test_windows"] == reference["test_windows"]
    for key in METRICS:
        assert record[key] == pytest.approx(reference[key], rel=1e-6), key
    assert "warning: this" not in proc.stdout + proc.stderr  # no SLURM warning: a task of a step, with --ddp


def test_torchrun_workers_inside_srun_keep_torchruns_ranks(trained, tmp_path):
    """What the sbatch script starts on 2 nodes x 2 GPUs: each node's srun task (SLURM_PROCID 0 and 1 of
    SLURM_NTASKS=2) runs torchrun, whose 4 workers inherit those SLURM variables beside torchrun's own.
    Taking SLURM's would give two rank 0s of a world of 2; torchrun's world of 4 must stand."""
    checkpoint, reference = trained
    port = free_port()
    envs = [dict(srun_task(rank // 2, [1, 1]), RANK=str(rank), LOCAL_RANK=str(rank % 2), WORLD_SIZE="4",
                 LOCAL_WORLD_SIZE="2", GROUP_RANK=str(rank // 2), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 TORCHELASTIC_RUN_ID="4242", TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0")
            for rank in range(4)]
    proc = fork_tasks([*ARGS, "--ddp", "--is_training", 0, "--checkpoint", checkpoint, "--no_plots",
                       *output_args(tmp_path)], envs)
    assert_ok(proc)
    record, = records(tmp_path)
    assert record["world_size"] == 4
    for key in METRICS:
        assert record[key] == pytest.approx(reference[key], rel=1e-6), key


def test_srun_tasks_without_ddp_warn_and_run_alone(trained, tmp_path):
    checkpoint, reference = trained
    proc = srun_on_loopback([*ARGS, "--is_training", 0, "--checkpoint", checkpoint, "--quiet"], [1, 1], tmp_path)
    assert_ok(proc)
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning: this is task")]
    assert len(warnings) == 2 and "--ddp is not given" in warnings[0]
    assert [r["world_size"] for r in records(tmp_path)] == [1, 1]


@pytest.mark.parametrize("extra, message", [
    (dict(SLURM_LOCALID="x"), "SLURM_LOCALID='x' is not a whole number"),
    (dict(MASTER_ADDR="", PATH="/nonexistent"), "set MASTER_ADDR to the address of the node that runs task 0"),
])
def test_run_py_refuses_srun_variables_that_do_not_fit_in_one_line(tmp_path, extra, message):
    proc = fork_tasks([*ARGS, "--ddp", *output_args(tmp_path)], [srun_task(0, [1, 1], MASTER_PORT="1", **extra)])
    assert_one_error_line(proc, message)


# ---------------------------------------------------------------- MASTER_PORT taken by another program
@contextlib.contextmanager
def a_silent_listener():
    """Another program on a port: it accepts every connection and never says a word. Yields the port."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def serve():
        with contextlib.suppress(OSError):  # the server closed
            while True:
                accepted.append(server.accept()[0])

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        for connection in accepted:
            connection.close()


def srun_tasks_alone(argv, environments, timeout):
    """run.py as srun's tasks without --kill-on-bad-exit (srun's default): no task is stopped when another
    fails. [(exit code or None if still running at `timeout`, seconds it ran, its stderr)] in task order."""
    warm_context()  # the fork server started (its imports take seconds) before the clock does
    with tempfile.TemporaryDirectory() as folder:
        started = time.monotonic()
        processes, streams = start_tasks(argv, environments, folder)
        seconds = [None] * len(processes)
        while None in seconds and time.monotonic() < started + timeout:
            for i, process in enumerate(processes):
                if seconds[i] is None and process.exitcode is not None:
                    seconds[i] = time.monotonic() - started
            time.sleep(0.05)
        codes = [process.exitcode for process in processes]
        for process in processes:
            process.kill()
            process.join()
        return [(code, took or timeout, _read_if_there(err)) for code, took, (_, err) in zip(codes, seconds, streams)]


DIST_TIMEOUT = 5


def test_a_taken_master_port_ends_every_task_with_one_line_naming_it(tmp_path):
    """MASTER_PORT held by a program that accepts connections and never answers: task 0 cannot host the
    process group there (it died with an EADDRINUSE traceback), task 1 reaches that program instead of task 0
    (it waited for as long as the program lived, past --dist_timeout). Each ends within --dist_timeout + 10 s,
    exit code 2, with one line naming the port."""
    with a_silent_listener() as port:
        envs = [srun_task(i, [2], MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)) for i in range(2)]
        ended = srun_tasks_alone([*ARGS, "--dist_timeout", DIST_TIMEOUT, "--ddp", "--no_plots", *output_args(tmp_path)],
                                 envs, timeout=DIST_TIMEOUT + 10)
    shown = "\n".join(f"task {task}: exit {code} after {seconds:.1f} s\n{err[-2000:]}"
                      for task, (code, seconds, err) in enumerate(ended))
    assert all(code == 2 and seconds < DIST_TIMEOUT + 10 for code, seconds, _ in ended), shown
    where = f"MASTER_ADDR:MASTER_PORT=127.0.0.1:{port}"
    for (_, _, err), message in zip(ended, [
            f"error: the port of {where} is taken by another program, so rank 0 cannot host the process group there; "
            "set MASTER_PORT to a free port",
            f"error: no process group formed at {where} within {DIST_TIMEOUT} s: rank 0 never answered there; is "
            "another program listening on that port"]):
        assert err.startswith(message) and err.count("\n") == 1, shown  # its one line, nothing else


def test_rank_0_that_nobody_joins_stops_after_dist_timeout(monkeypatch):
    """The other side of the wait: rank 0 hosting the store, joined by no other rank, stops after --dist_timeout
    with one line naming the port (the other ranks' wait is test_a_taken_master_port_ends_every_task...)."""
    from utils import distributed

    port = free_port()
    for name, value in dict(RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port).items():
        monkeypatch.setenv(name, str(value))
    started = time.monotonic()
    with pytest.raises(distributed.NoGroupError) as refused:
        distributed._store_of_rank_0(1)
    assert time.monotonic() - started < 1 + 5
    line = str(refused.value)
    assert line.startswith(f"no process group formed at MASTER_ADDR:MASTER_PORT=127.0.0.1:{port} within 1 s: 1 of 2 "
                           "processes joined; start every process with the same") and "\n" not in line, line


# ---------------------------------------------------------------- the sbatch script
def test_the_sbatch_script_is_bash_and_asks_for_one_task_per_node():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    text = SBATCH.read_text()
    directives = [line.split()[1] for line in text.splitlines() if line.startswith("#SBATCH")]
    for option in ("--nodes=", "--ntasks-per-node=1", "--gpus-per-node=", "--cpus-per-task="):
        assert any(d.startswith(option) for d in directives), option
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in text
    for part in ("python -m utils.launch", '--nnodes="$SLURM_NNODES"', "--rdzv_backend=c10d",
                 '--rdzv_endpoint="$MASTER_ADDR:$RDZV_PORT"', '--rdzv_id="$SLURM_JOB_ID"', 'run.py --ddp',
                 """ "$@"' bash "$@\""""):  # run.py's arguments, passed through last
        assert part in text, part


FAKE_SRUN = """#!/usr/bin/env bash
# srun, as SLURM starts a step of one task per node: here every "node" is this machine
echo "srun $*" >> "$SLURM_FAKE_LOG"
while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
nodes=${SLURM_NNODES:-1}
pids=()
for (( node = 0; node < nodes; node++ )); do
  SLURM_STEP_ID=0 SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 SLURM_NTASKS=$nodes \\
    SLURM_STEP_NUM_TASKS=$nodes SLURM_STEP_TASKS_PER_NODE="1(x$nodes)" "$@" &
  pids+=($!)
done
code=0
for _ in "${pids[@]}"; do  # --kill-on-bad-exit: the first task to fail ends the step
  wait -n && continue
  status=$?
  if (( code == 0 )); then code=$status; kill -TERM "${pids[@]}" 2>/dev/null; fi
done
exit $code
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
echo "scontrol $*" >> "$SLURM_FAKE_LOG"
[[ "$1 $2" == "show hostnames" ]] && tr ',' '\\n' <<< "$3"
"""


def run_sbatch_on_loopback(folder, args, nodes=2, timeout=120):
    """The sbatch script as the batch step of a job of `nodes` nodes would run it, with srun and
    scontrol stand-ins; (CompletedProcess, what srun and scontrol were asked)."""
    shims = folder / "bin"
    shims.mkdir(parents=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    log = folder / "slurm.log"
    env = dict(subprocess_env(), PATH=f"{shims}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
               SLURM_FAKE_LOG=str(log), SLURM_JOB_ID="4242", SLURM_NNODES=str(nodes), SLURM_JOB_NODELIST="127.0.0.1",
               SLURM_SUBMIT_DIR=str(REPO), SLURM_CPUS_PER_TASK="1", NPROC_PER_NODE="1", RDZV_PORT=str(free_port()),
               RDZV_TIMEOUT="30")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    argv = [*map(str, args), "--no_plots", *map(str, output_args(folder))]
    proc = subprocess.Popen(["bash", str(SBATCH), *argv], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the sbatch script did not end in {timeout} s:\n{out[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, ""), log.read_text()


def test_the_sbatch_script_trains_two_nodes_like_srun_tasks(tmp_path):
    """The script end to end on two loopback "nodes": one srun task per node, each torchrun with one
    worker, meeting at the first node's host. It trains exactly like two srun tasks that map SLURM's
    variables themselves (no torchrun), and the workers' SLURM_PROCID does not displace torchrun's RANK."""
    proc, asked = run_sbatch_on_loopback(tmp_path / "sbatch", ARGS)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "scontrol show hostnames 127.0.0.1" in asked
    srun_line = next(line for line in asked.splitlines() if line.startswith("srun "))
    assert "--ntasks-per-node=1" in srun_line and "--nodes=2" in srun_line
    record, = records(tmp_path / "sbatch")
    assert record["world_size"] == 2

    direct = tmp_path / "direct"
    assert_ok(srun_on_loopback([*ARGS, "--ddp"], [1, 1], direct))
    reference, = records(direct)
    assert reference["world_size"] == 2
    for key in METRICS:
        assert record[key] == pytest.approx(reference[key], rel=1e-6), key
    for ours, theirs in zip(record["history"], reference["history"], strict=True):
        for key in ("train_loss", "vali_loss"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-6), key


def test_the_sbatch_script_refuses_outside_a_job(tmp_path):
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(SBATCH)], cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and proc.stderr.startswith("error: not inside a SLURM job"), proc.stderr


# ---------------------------------------------------------------- a real SLURM, where there is one
@pytest.mark.skipif(shutil.which("srun") is None, reason="srun is not installed on this machine (no SLURM): the "
                    "real single-node job is not run; the loopback tests above set the variables as srun does")
def test_a_real_srun_job_on_one_node(trained):
    """Two tasks of a real single-node srun step, one process each, score the checkpoint like one process.
    MASTER_ADDR and MASTER_PORT are left to the mapping (the step's first node, the job id). The files
    lie in a folder of the repository, which the job's node sees where the cluster shares it."""
    checkpoint, reference = trained
    folder = Path(tempfile.mkdtemp(prefix=".test-slurm-", dir=REPO))
    try:
        shutil.copy(checkpoint, folder / "checkpoint.pth")
        env = {k: v for k, v in subprocess_env().items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
        argv = [*map(str, ARGS), "--ddp", "--is_training", "0", "--checkpoint", str(folder / "checkpoint.pth"),
                "--no_plots", *map(str, output_args(folder))]
        proc = subprocess.run(["srun", "--nodes=1", "--ntasks=2", "--cpus-per-task=1", "--immediate=120", "--time=10",
                               sys.executable, "run.py", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
        if proc.returncode != 0 and "Unable to allocate resources" in proc.stderr:
            pytest.skip(f"SLURM gave no node: {proc.stderr.strip().splitlines()[-1]}")
        assert_ok(proc)
        record, = records(folder)
        assert record["world_size"] == 2
        for key in METRICS:
            assert record[key] == pytest.approx(reference[key], rel=1e-6), key
    finally:
        shutil.rmtree(folder, ignore_errors=True)
