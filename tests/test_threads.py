"""utils.threads (issue 43 item 10): the automatic thread count follows the cores this process may really
use (affinity mask, cgroup quota, processes on the machine), and OpenMP waits without spinning where other
processes keep its cores busy at the start; all mocked here."""
import pytest
import torch

from utils import distributed, threads


def test_the_cgroup_quota_in_cores(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")
    assert threads.cgroup_cores(cpu_max) == 1.5
    cpu_max.write_text("max 100000\n")
    assert threads.cgroup_cores(cpu_max) is None
    assert threads.cgroup_cores(tmp_path / "absent") is None


@pytest.mark.parametrize("default, cpus, quota, processes, want", [
    (2, [0, 1], None, 1, 2),                 # a whole machine: the default
    (16, list(range(16)), None, 4, 4),       # torchrun's 4 processes: 16 // 4
    (64, list(range(64)), 2.5, 1, 2),        # docker --cpus 2.5 on 64 cores: 2, not 64
    (64, list(range(64)), 0.5, 1, 1),        # a quota under one core: still one thread
    (8, [2, 3], None, 1, 2),                 # taskset -c 2,3 (with a default that counted more)
    (2, [0, 1], None, 4, 1),                 # more processes than cores
])
def test_the_thread_rule(default, cpus, quota, processes, want):
    assert threads.automatic_threads(default, cpus, quota, processes) == want


def _stat(cpu0, cpu1):
    """/proc/stat's lines for two CPUs of (busy, idle) jiffies."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    for cpu, (busy, idle) in enumerate((cpu0, cpu1)):
        lines.append(f"cpu{cpu} {busy - 3} 1 1 {idle - 1} 1 1 0 0 0 0")
    return "\n".join(lines + ["intr 1 2 3"]) + "\n"


def test_busy_cores_are_the_others_share_over_the_window(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(_stat((100, 100), (100, 100)))

    def sleep(_):  # meanwhile: cpu0 busy all 5 ticks, cpu1 busy 1 of 5
        stat.write_text(_stat((105, 100), (101, 104)))

    assert threads.busy_cores([0, 1], path=stat, sleep=sleep) == pytest.approx(1.2)
    assert threads.busy_cores([1], path=stat, sleep=lambda _: None) == 0.0  # no ticks: nothing known busy
    assert threads.busy_cores([0], path=tmp_path / "absent") == 0.0


def _mocked(monkeypatch, cpus, quota, default=2):
    monkeypatch.setattr(threads, "affinity", lambda: cpus)
    monkeypatch.setattr(threads, "cgroup_cores", lambda: quota)
    monkeypatch.setattr(threads, "_torch_default", lambda: default)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    chosen = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    return chosen


@pytest.mark.parametrize("cpus, quota, local, want", [
    ([0], None, None, 1),               # one CPU allowed of the machine's two
    ([0, 1], 1.0, None, 1),             # a quota of one core
    ([0, 1], None, None, 2),            # the whole machine: the default
    (list(range(8)), None, "2", 4),     # torchrun's 2 processes on 8 cores
])
def test_setup_takes_the_automatic_count(monkeypatch, cpus, quota, local, want):
    """distributed.setup's --num_threads 0, in one process as under torchrun (LOCAL_WORLD_SIZE)."""
    chosen = _mocked(monkeypatch, cpus, quota, default=max(2, len(cpus)))
    if local:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", local)
    distributed._set_threads(0)
    assert chosen == [want]


def test_an_explicit_count_or_omp_num_threads_is_kept(monkeypatch):
    chosen = _mocked(monkeypatch, [0], None)
    distributed._set_threads(3)
    assert chosen == [3]
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # torch took it when it loaded
    distributed._set_threads(0)
    assert chosen == [3]
    assert threads.choose_threads(0) == (None, "OMP_NUM_THREADS")


@pytest.mark.parametrize("busy, environ, modules, want", [
    (2.0, {}, {}, "PASSIVE"),                            # two busy processes beside: no spinning
    (0.6, {}, {}, "PASSIVE"),                            # a core mostly busy
    (0.2, {}, {}, None),                                 # idle: OpenMP's spinning, faster there
    (1.0, {"LOCAL_WORLD_SIZE": "2"}, {}, None),          # the machine's other torchrun worker, starting
    (2.0, {"LOCAL_WORLD_SIZE": "2"}, {}, "PASSIVE"),     # ... and one more process
    (2.0, {"OMP_WAIT_POLICY": "ACTIVE"}, {}, None),      # the user's choice
    (2.0, {"OMP_NUM_THREADS": "1"}, {}, None),           # one thread waits for nobody
    (2.0, {}, {"torch": object()}, None),                # too late: OpenMP has read it
])
def test_the_wait_policy_beside_busy_cores(busy, environ, modules, want):
    environ = dict(environ)
    before = dict(environ)
    assert threads.quiet_waits_beside_busy_cores(environ, modules, busy=busy) == want
    assert environ == (dict(before, OMP_WAIT_POLICY="PASSIVE") if want else before)


def test_run_sets_the_wait_policy_before_torch_loads(tmp_path):
    """run.py's first lines decide it: in a fresh interpreter with busy_cores saying 2, torch's OpenMP runs
    with OMP_WAIT_POLICY=PASSIVE (as the environment torch sees when it loads)."""
    import subprocess
    import sys

    from tests.helpers import REPO

    code = ("import sys; sys.path.insert(0, {repo!r}); import utils.threads as t; t.busy_cores = lambda cpus: 2.0\n"
            "import run, os, torch; print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    done = subprocess.run([sys.executable, "-c", code.format(repo=str(REPO))], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert done.stdout.split() == ["PASSIVE", "True"], done.stderr[-2000:]


@pytest.mark.parametrize("requested, environ, want", [
    (0, {}, 1),                              # alone or beside others: one thread each
    (0, {"LOCAL_WORLD_SIZE": "4"}, 1),       # not the cores split between the processes
    (0, {"OMP_NUM_THREADS": "1"}, 0),        # torchrun's default for its workers, which torch read at load
    (0, {"OMP_NUM_THREADS": "3"}, 0),        # the user's
    (2, {"OMP_NUM_THREADS": "3"}, 2),        # --num_threads
])
def test_a_count_that_does_not_follow_the_number_of_processes(requested, environ, want):
    assert threads.same_on_any_world_size(requested, environ) == want
