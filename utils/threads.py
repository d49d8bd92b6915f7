"""Torch threads and OpenMP's wait policy when --num_threads is 0.

PyTorch's default is one thread per CPU OpenMP sees (its affinity mask), and OpenMP's threads spin at every
barrier, waiting for the others. When a core they count on is busy with another process, each barrier
waits a scheduler slice for the descheduled thread: on 2 cores with two busy processes beside it, a DLinear
epoch took 38.8 s against 0.38 s with one thread and 0.77 s with OMP_WAIT_POLICY=PASSIVE
(lab/results/bench_threads_cpu.json). Two rules, from what this process may really use:

Thread count (distributed.setup; the same on every start on one machine, so a run's numbers, which can
depend on it in the last digits, do not depend on what else runs):

    cores   = min(OpenMP's default, CPUs in the affinity mask (os.sched_getaffinity),
                  the cgroup's CPU quota (cgroup v2 cpu.max: quota / period, rounded down, at least 1))
    threads = max(1, cores // processes on this machine (LOCAL_WORLD_SIZE under torchrun))

Wait policy (run.py's first lines, before torch loads OpenMP, which reads it once): where other processes
keep a core of this process's CPUs busy at the start (half a core or more over BUSY_WINDOW_S in
/proc/stat, this process asleep meanwhile, the machine's other torchrun workers, starting too, not
counted), OMP_WAIT_POLICY=PASSIVE: a waiting thread sleeps at once and gives its core to the neighbours.
An idle machine keeps OpenMP's spinning, the faster there (PASSIVE cost 2.4x on an idle 2-core machine).
The wait policy changes only the speed, never a number. Set by the user, OMP_NUM_THREADS, OMP_WAIT_POLICY
and --num_threads are kept.

A program whose numbers must not depend on the number of processes (the GIFT-Eval harness: its CSV byte for
byte on any world size) cannot take that count: a float32 forward can sum in another order on 2 threads than
on 1 (TimesNet's does), and the count changes with the processes. It takes `same_on_any_world_size`: one
thread per process unless --num_threads or OMP_NUM_THREADS says otherwise, the same in every process for any
number of them (torchrun gives each worker OMP_NUM_THREADS=1 where none is set, so its default agrees).
"""
import functools
import math
import os
import sys
import time

CPU_MAX = "/sys/fs/cgroup/cpu.max"  # cgroup v2: "<quota> <period>" in microseconds, or "max <period>"
PROC_STAT = "/proc/stat"
BUSY_WINDOW_S = 0.05  # long enough for 5 scheduler ticks per CPU at 100 Hz


def cgroup_cores(path=CPU_MAX):
    """The cgroup's CPU quota in cores (a float), or None where there is none (no file, "max")."""
    try:
        quota, period = open(path).read().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def affinity():
    """The CPUs this process may run on (all of them where the platform does not say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return list(range(os.cpu_count() or 1))


def usable_cores(default, cpus, quota):
    """min(OpenMP's default, the CPUs allowed, the quota rounded down), at least 1."""
    cores = min(default, len(cpus))
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


def cpu_times(cpus, path=PROC_STAT):
    """{cpu: (busy jiffies, all jiffies)} for these CPUs from /proc/stat (iowait counts as idle)."""
    times = {}
    for line in open(path):
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            times[int(name[3:])] = (sum(values) - values[3] - values[4], sum(values))
    return times


def busy_cores(cpus, window=BUSY_WINDOW_S, path=PROC_STAT, sleep=time.sleep):
    """How many of `cpus` other processes keep busy: their busy share over `window` seconds, summed (this
    process sleeps meanwhile, so it counts none of it); 0 where /proc/stat cannot be read."""
    try:
        before = cpu_times(cpus, path)
        sleep(window)
        after = cpu_times(cpus, path)
    except OSError:
        return 0.0
    busy = 0.0
    for cpu, (busy_after, all_after) in after.items():
        busy_before, all_before = before.get(cpu, (busy_after, all_after))
        if all_after > all_before:
            busy += (busy_after - busy_before) / (all_after - all_before)
    return busy


def automatic_threads(default, cpus, quota, processes):
    """The thread rule of the module docstring: max(1, usable_cores // processes)."""
    return max(1, usable_cores(default, cpus, quota) // max(1, processes))


def choose_threads(requested, environ=os.environ):
    """The torch threads for --num_threads `requested` (0: automatic), and why, as one phrase; None for the
    count where OMP_NUM_THREADS already decides (torch read it when it loaded)."""
    if requested:
        return requested, "--num_threads"
    if environ.get("OMP_NUM_THREADS"):
        return None, "OMP_NUM_THREADS"
    cpus, quota = affinity(), cgroup_cores()
    processes = int(environ.get("LOCAL_WORLD_SIZE", 1))
    threads = automatic_threads(_torch_default(), cpus, quota, processes)
    return threads, (f"{len(cpus)} CPUs allowed, quota {'none' if quota is None else f'{quota:g}'}, "
                     f"{processes} process(es) on this machine")


def same_on_any_world_size(requested, environ=os.environ):
    """The --num_threads to set up with where results must not depend on the number of processes: `requested`
    (--num_threads) when given, 0 (OMP_NUM_THREADS, which torch read at load) when that is set, else 1: the
    same count in each process whether it runs alone or beside others (module docstring)."""
    if requested or environ.get("OMP_NUM_THREADS"):
        return requested
    return 1


def quiet_waits_beside_busy_cores(environ=os.environ, modules=sys.modules, busy=None):
    """Before torch loads: OMP_WAIT_POLICY=PASSIVE where other processes keep half a core or more of this
    process's CPUs busy (the module docstring's wait policy). Returns the policy set, or None where it
    leaves OpenMP's default: torch loaded already, the variable set, one thread by OMP_NUM_THREADS, or
    nothing busy beside."""
    if "torch" in modules or environ.get("OMP_WAIT_POLICY") or environ.get("OMP_NUM_THREADS") == "1":
        return None
    busy = busy_cores(affinity()) if busy is None else busy
    others = busy - (int(environ.get("LOCAL_WORLD_SIZE", 1)) - 1)  # this machine's other workers, starting
    if others < 0.5:
        return None
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "PASSIVE"


@functools.lru_cache(maxsize=None)
def _torch_default():
    """torch's thread count as this process found it, before anything here set it."""
    import torch

    return torch.get_num_threads()
