"""Torch threads on an idle machine and beside busy processes: seconds per DLinear epoch.

    python lab/bench_threads.py                  # the table to results/bench_threads_cpu.md
    python lab/bench_threads.py --rounds 1 --max_batches 40

DLinear, seq_len 336 -> 96, one channel of a synthetic series as long as a year of half-hourly readings
(--synthetic_rows 17520), batch 32: run.py's data path and training epoch (bench_train.measure, each setting
in a fresh process). Settings: `automatic` (--num_threads 0 and the wait policy run.py's first lines choose:
utils.threads), `cores` (--num_threads set to the machine's cores, OpenMP's default wait: PyTorch's own
default, as before), `1 thread`, and `cores, PASSIVE` (OMP_WAIT_POLICY=PASSIVE: OpenMP's threads sleep at
once instead of spinning at a barrier). Cases: `idle`
(nothing of ours beside) and `2 busy` (two processes spinning beside it, one core each, for the whole
measurement). An epoch is timed on its first --max_batches batches and scaled to the whole epoch; the
median over --rounds interleaved rounds of each setting's second epoch (the first warms up).
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ARGV = ["--model", "DLinear", "--data", "synthetic", "--synthetic_rows", "17520", "--features", "S",
        "--seq_len", "336", "--label_len", "48", "--pred_len", "96", "--batch_size", "32", "--use_gpu", "false"]
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
SETTINGS = {  # name: (--num_threads, extra environment)
    "automatic": ("0", {}),
    "cores": (str(CORES), {}),
    "1 thread": ("1", {}),
    "cores, PASSIVE": (str(CORES), {"OMP_WAIT_POLICY": "PASSIVE"}),
}
CHILD = """
import json, sys
sys.path.insert(0, {repo!r})
from utils.threads import quiet_waits_beside_busy_cores
policy = quiet_waits_beside_busy_cores() if {automatic} else None  # as run.py's first lines, before torch
import torch
from benchmarks.bench_train import measure
result = measure("ours", {argv!r}, 2, {max_batches})
print("RESULT " + json.dumps(dict(result, policy=policy, threads=torch.get_num_threads())))
"""
SPIN = "import time\nend = time.time() + 3600\nwhile time.time() < end:\n    pass\n"


@contextlib.contextmanager
def busy_beside(count):
    """`count` processes spinning on a core each, for the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        time.sleep(0.5 if count else 0)  # running before the measured process starts
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def epoch_seconds(setting, max_batches):
    """The setting's second epoch (s), its training windows, and what it ran with ("threads, policy")."""
    threads, extra = SETTINGS[setting]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    code = CHILD.format(repo=str(REPO), automatic=setting == "automatic", argv=[*ARGV, "--num_threads", threads],
                        max_batches=max_batches)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(env, **extra),
                          cwd=REPO, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{setting} failed:\n{done.stderr[-3000:]}")
    result = json.loads(lines[0][len("RESULT "):])
    ran = f"{result['threads']}, {result['policy'] or extra.get('OMP_WAIT_POLICY', 'default')}"
    return result["epoch_seconds"][-1], result["train_windows"], ran


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max_batches", type=int, default=60)
    parser.add_argument("--out", default=str(REPO / "lab" / "results" / "bench_threads_cpu.md"))
    opts = parser.parse_args()
    cases = {"idle": 0, "2 busy": 2}
    seconds = {(case, setting): [] for case in cases for setting in SETTINGS}
    windows, ran = None, {}
    for round_ in range(opts.rounds):
        for case, count in cases.items():
            with busy_beside(count):
                for setting in SETTINGS:
                    taken, windows, ran[case, setting] = epoch_seconds(setting, opts.max_batches)
                    seconds[case, setting].append(taken)
                    print(f"round {round_ + 1}, {case}, {setting} ({ran[case, setting]}): {taken:.2f} s", flush=True)
    with open("/proc/loadavg") as load:
        loadavg = load.read().split()[0]
    rows = [f"| {setting} | " + " | ".join(f"{statistics.median(seconds[case, setting]):.2f} ({ran[case, setting]})"
                                          for case in cases) + " |" for setting in SETTINGS]
    table = "\n".join([
        "# Torch threads beside busy processes: DLinear, seconds per training epoch", "",
        f"`python lab/bench_threads.py --rounds {opts.rounds} --max_batches {opts.max_batches}`: "
        f"{platform.processor() or platform.machine()}, {CORES} cores, {time.strftime('%Y-%m-%d')}, load average "
        f"{loadavg} at the end (a machine shared with other jobs: `idle` is only nothing of ours beside). "
        f"DLinear 336 -> 96 on one channel of 17 520 steps ({windows} training windows, batch 32), each epoch "
        f"timed on its first {opts.max_batches} batches and scaled; median of {opts.rounds} interleaved rounds. "
        "In brackets: the threads and OpenMP wait policy the last round ran with.",
        "", "| setting | idle: s (threads, wait) | 2 busy processes beside: s (threads, wait) |", "|---|---|---|", *rows, ""])
    Path(opts.out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
