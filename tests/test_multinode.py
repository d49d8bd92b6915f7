"""Two machines, emulated on one: two runs of scripts/ddp_forecast.sh ("nodes", one worker
each, separate folders as if on separate disks) meet through c10d rendezvous on 127.0.0.1.

They must train exactly like one node with two processes. c10d numbers the nodes itself
(NODE_RANK only says which node hosts the rendezvous store), so either node may hold global
rank 0; the comparison holds either way because every worker shards the data by its global
rank alone, and the test looks for rank 0's files on both nodes.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, free_port, records, run_on_ranks, subprocess_env

ARGS = ["--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--train_epochs", 2,
        "--num_threads", 1, "--dist_timeout", 30]  # one thread each: the same arithmetic in every layout
METRICS = ("vali_loss", "mse", "mae", "rmse", "mape", "mspe")


def without_log_switches(env):
    """`env` without the switches that ask for torch's (and torchrun's) logs, which one-line failures leave shown."""
    return {k: v for k, v in env.items() if k not in ("TORCH_CPP_LOG_LEVEL", "TORCH_DISTRIBUTED_DEBUG", "LOGLEVEL")}


def _start(folder, env, args):
    """One node: the script with its own output folders; output goes to folder/log."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [*map(str, args), "--checkpoints", str(folder / "checkpoints"), "--results_dir", str(folder / "results")]
    log = open(folder / "log", "w")
    proc = subprocess.Popen(["bash", "scripts/ddp_forecast.sh", *argv], cwd=REPO,
                            env=without_log_switches(dict(subprocess_env(), **env)),
                            stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log.close()
    return proc


def run_nodes(folders, envs, args, timeout=120, grace=20):
    """Start every node at once and wait for all; [(exit code, output)] in node order.

    Never hangs: once one node fails the others get `grace` seconds to fail too, and
    whatever still runs at the deadline is killed with its workers (its own session)."""
    procs = [_start(folder, env, args) for folder, env in zip(folders, envs)]
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                deadline = min(deadline, time.time() + grace)
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [(p.returncode, (folder / "log").read_text()) for p, folder in zip(procs, folders)]


def node_env(node_rank, port, nnodes=2, nproc=1, **extra):
    env = dict(NNODES=str(nnodes), NODE_RANK=str(node_rank), NPROC_PER_NODE=str(nproc), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), RDZV_ID=f"test-{port}", RDZV_TIMEOUT="60")
    return dict(env, **extra)


def _assert_all_ok(results):
    for node, (code, output) in enumerate(results):
        assert code == 0, f"node {node} exit {code}:\n{output[-3000:]}"


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Folders of node 0 and node 1 after a two-node training run."""
    root = tmp_path_factory.mktemp("two_nodes")
    port = free_port()
    folders = [root / "node0", root / "node1"]
    _assert_all_ok(run_nodes(folders, [node_env(0, port), node_env(1, port)], ARGS))
    return folders


def test_two_nodes_train_like_one_node_with_two_processes(two_nodes, tmp_path):
    folders = two_nodes
    single = tmp_path / "single"
    _assert_all_ok(run_nodes([single], [node_env(0, free_port(), nnodes=1, nproc=2)], ARGS))
    reference = records(single)
    assert len(reference) == 1 and reference[0]["world_size"] == 2

    # rank 0 lives on one node (either), and only it writes: one record, one checkpoint
    with_results = [f for f in folders if (f / "results" / "results.jsonl").exists()]
    assert len(with_results) == 1
    main_node = with_results[0]
    other = folders[1 - folders.index(main_node)]
    assert not (other / "results").exists() and not (other / "checkpoints").exists()
    record = records(main_node)
    assert len(record) == 1
    record, reference = record[0], reference[0]
    assert record["world_size"] == 2
    for key in METRICS:
        assert record[key] == pytest.approx(reference[key], rel=1e-6), key
    assert [h["epoch"] for h in record["history"]] == [1, 2]
    for ours, theirs in zip(record["history"], reference["history"]):
        for key in ("train_loss", "vali_loss", "test_loss"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-6), key
    assert list((main_node / "checkpoints").glob("*/checkpoint.pth"))


def test_resume_refuses_when_nodes_see_different_training_states(two_nodes, tmp_path):
    """Only rank 0's node holds last.pth: resuming must stop every node with one message."""
    folders = [tmp_path / f.name for f in two_nodes]  # copies: the other test reads the originals
    for original, copy in zip(two_nodes, folders):
        shutil.copytree(original, copy)
    port = free_port()
    results = run_nodes(folders, [node_env(0, port), node_env(1, port)], [*ARGS, "--train_epochs", 3, "--resume"],
                        timeout=90)
    assert all(code != 0 for code, _ in results), [output[-2000:] for _, output in results]
    messages = [line for _, output in results for line in output.splitlines() if line.startswith("error: the nodes")]
    assert len(messages) == 1, [output[-2000:] for _, output in results]
    assert "every node shares" in messages[0]


def _one_node_fails(tmp_path, env, limit):
    started = time.time()
    (code, output), = run_nodes([tmp_path / "node"], [env], ARGS, timeout=limit + 30)
    elapsed = time.time() - started
    assert code != 0 and elapsed < limit, f"exit {code} after {elapsed:.1f}s:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    return output.strip().splitlines()[-1]


def test_a_missing_node_ends_the_wait_with_one_line(tmp_path):
    last = _one_node_fails(tmp_path, node_env(0, free_port(), RDZV_TIMEOUT="2"), limit=25)
    assert last.startswith("error: not all 2 node(s) joined rendezvous"), last
    assert "NNODES, RDZV_ID, MASTER_ADDR:MASTER_PORT" in last


def test_an_unreachable_rendezvous_fails_with_one_line(tmp_path):
    """Nobody listens at MASTER_ADDR:MASTER_PORT (node 0 not started, or gone after giving up): the launcher's
    line alone (c10d logged each failed try with 14 to 28 C++ stack frames before it)."""
    last = _one_node_fails(tmp_path, node_env(1, free_port(), RDZV_TIMEOUT="1"), limit=25)  # nobody listens there
    assert last.startswith("error: cannot reach or host the store of rendezvous"), last
    assert "MASTER_ADDR" in last
    assert (tmp_path / "node" / "log").read_text().strip() == last




def test_a_worker_that_finds_nothing_at_master_port_fails_with_one_line(tmp_path):
    """A worker started alone (as srun or a hand-written launch starts it) whose rank 0 is not there, or gave up
    before it came: after --dist_timeout, its one line alone, exit 2 (c10d logged its failed tries with 14 to 28
    C++ stack frames before it)."""
    port = free_port()
    env = without_log_switches(dict(subprocess_env(), RANK="1", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1",
                                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    started = time.time()
    proc = subprocess.run([sys.executable, "run.py", *map(str, ARGS), "--dist_timeout", "2", "--ddp", "--no_plots",
                           "--checkpoints", str(tmp_path / "checkpoints"), "--results_dir", str(tmp_path / "results")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.time() - started
    assert proc.returncode == 2 and elapsed < 2 + 20, f"exit {proc.returncode} after {elapsed:.0f} s\n{proc.stderr}"
    assert proc.stdout == "" and proc.stderr.startswith(
        f"error: no process group formed at MASTER_ADDR:MASTER_PORT=127.0.0.1:{port} within 2 s: rank 0 never answered "
        "there;") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("nnodes, node_rank, message", [
    ("2", "2", "error: NODE_RANK=2 does not fit NNODES=2"),
    ("2", "-1", "error: NODE_RANK=-1 does not fit NNODES=2"),
    ("two", "0", "error: NNODES must be a positive number"),
])
def test_a_node_rank_outside_nnodes_is_refused_at_once(tmp_path, nnodes, node_rank, message):
    env = dict(node_env(0, free_port()), NNODES=nnodes, NODE_RANK=node_rank)
    last = _one_node_fails(tmp_path, env, limit=5)
    assert last.startswith(message), last


def test_c10d_lines_are_hidden_and_a_thread_given_up_logs_nothing_after(tmp_path):
    """utils.distributed.c10d_lines_hidden: c10d's log lines and the stack frames under them are dropped, any other
    line is written out after; once given up, a thread that logs later (the join of a store that never answers)
    reaches nobody, while Python's stderr still reaches the terminal."""
    child = """
import os, sys, threading, time
from utils.distributed import c10d_lines_hidden
with c10d_lines_hidden() as give_up:
    os.write(2, b"[W1207 14:20:13.113545931 TCPStore.cpp:340] [c10d] TCP client failed - retrying\\n"
                b"Exception raised from throwTimeoutError at socket.cpp:1030 (most recent call first):\\n"
                b"frame #0: c10::Error::Error() + 0x9d\\n<omitting python frames>\\nframe #16: + 0x3d07bb\\n\\n")
    os.write(2, b"a line of another kind\\n")
    late = threading.Thread(target=lambda: (time.sleep(0.5), os.write(2, b"[E1207 socket.cpp:1028] [c10d] late\\n")))
    late.start()
    give_up()
print("error: the one line", file=sys.stderr)
late.join()
"""
    proc = subprocess.run([sys.executable, "-c", child], cwd=REPO, env=without_log_switches(subprocess_env()),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "a line of another kind\nerror: the one line\n", proc.stderr


def _rank_sees_only_its_own_disk(rank, world, folder):
    import torch

    from utils import distributed
    from utils.checkpoint import load_weights
    from utils.errors import UserError

    disk = os.path.join(folder, f"rank{rank}")  # another node's files are out of reach
    if rank == 0:
        os.makedirs(disk)
        torch.save(torch.nn.Linear(3, 2).state_dict(), os.path.join(disk, "best.pth"))
    distributed.barrier()
    torch.manual_seed(100 + rank)
    model = torch.nn.Linear(3, 2)
    distributed.load_on_main(model, load_weights, os.path.join(disk, "best.pth"))
    outcome = {"weights": [model.weight.tolist(), model.bias.tolist()]}
    for name, call in (("bad file", lambda: distributed.load_on_main(model, load_weights, os.path.join(disk, "no.pth"))),
                       ("differs", lambda: distributed.require_same(rank == 0, "the nodes disagree")),
                       ("agrees", lambda: distributed.require_same("same", "never raised"))):
        try:
            call()
            outcome[name] = None
        except UserError as problem:
            outcome[name] = str(problem)
    return outcome


def test_weights_reach_every_rank_from_rank_0s_disk_alone(tmp_path):
    """load_on_main reads on rank 0 and broadcasts; its errors and require_same's stop every rank."""
    outcomes = run_on_ranks(_rank_sees_only_its_own_disk, 3, str(tmp_path))
    assert all(o["weights"] == outcomes[0]["weights"] for o in outcomes)
    assert all(o["bad file"].startswith("checkpoint not found") and "rank0" in o["bad file"] for o in outcomes)
    assert all(o["differs"] == "the nodes disagree" and o["agrees"] is None for o in outcomes)
