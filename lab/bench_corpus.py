"""Corpus benchmark: memory and speed of `--data corpus` (memory-mapped shards) against the in-memory
`--data univariate` path, on synthetic corpora of growing size.

    python lab/bench_corpus.py --points 1e7 1e8 1e9 --memory_points 1e7 1e8

For each size: synthetic sources (.npy files of 1e7 points, 10 series each) are written under
--workdir, the corpus is built with `python -m data_provider.corpus build` (timed), then 2-process
DDP training (gloo, a small TimerXL, batch 32) runs --steps optimizer steps on each rank, which
reports its resident memory at step 1 and at the last step (private: RssAnon; mapped file pages:
RssFile, the shared page cache), the seconds from process start to the end of its first step, and
steps/s after the first (medians of --rounds interleaved runs). The in-memory path runs on the same sources at --memory_points sizes.
Sources and corpora are deleted afterwards (--keep keeps them). Writes
lab/results/bench_corpus.md (an existing one only with --overwrite) and prints the table.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from utils.files import atomic_write  # noqa: E402

FILE_POINTS = 10_000_000
SERIES_PER_FILE = 10
MODEL = ["--model", "TimerXL", "--d_model", "32", "--d_ff", "64", "--n_heads", "2", "--e_layers", "1",
         "--seq_len", "96", "--input_token_len", "24", "--output_token_len", "24", "--features", "S",
         "--batch_size", "32", "--num_threads", "1", "--use_gpu", "false"]


def write_sources(folder, points):
    """.npy files of FILE_POINTS points (SERIES_PER_FILE random-walk series each), `points` in all."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(max(1, round(points / FILE_POINTS))):
        rows = min(FILE_POINTS, int(points)) // SERIES_PER_FILE
        walk = np.cumsum(rng.standard_normal((rows, SERIES_PER_FILE), dtype=np.float32), axis=0)
        np.save(folder / f"part{i:04d}.npy", walk)


def memory_kib():
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmHWM"):
                fields[key] = int(value.split()[0])
    return fields


WORKER = r'''
import os, sys, time
started = time.time()
sys.path.insert(0, {repo!r})
from lab.bench_corpus import memory_kib
from data_provider.data_factory import data_provider
from exp.exp_forecast import Exp_Forecast
from exp.settings import resolve_args
from utils import distributed
from utils.arguments import parse_args

args = parse_args({argv!r})
args.ddp = True
resolve_args(args, distributed.env_world_size())
device = distributed.setup(True, False, None, 600, 1)
exp = Exp_Forecast(args, device)
_, loader = data_provider(args, "train")
loader.set_epoch(1)
optimizer = exp.make_optimizer()
exp.model.train()
first = None
for step, batch in enumerate(loader):
    exp.train_step([batch], optimizer)
    if step == 0:
        first, first_done, at_first = time.time() - started, time.time(), memory_kib()
    if step + 1 == {steps}:
        break
rate = step / (time.time() - first_done) if step else float("nan")
at_last = memory_kib()
sys.stdout.write(f"RESULT {{distributed.rank()}} {{first:.2f}} {{rate:.2f}} {{at_first['RssAnon']}} {{at_first['RssFile']}} "
                 f"{{at_last['RssAnon']}} {{at_last['RssFile']}} {{at_last['VmHWM']}} {{len(loader.dataset)}}\n")
sys.stdout.flush()  # one write per line: the two ranks share the pipe
distributed.cleanup()
'''


def train(data_args, steps, work):
    """2-process DDP (torchrun, gloo): per rank (seconds to the first step's end, steps/s, RssAnon and
    RssFile at step 1 and at the last step, peak RSS, training windows)."""
    worker = work / "worker.py"
    worker.write_text(WORKER.format(repo=str(REPO), argv=[*MODEL, *data_args], steps=steps))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(worker)], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    rows = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    if proc.returncode or len(rows) != 2:
        raise SystemExit(f"training failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return [tuple(float(x) for x in row[1:]) for row in sorted(rows)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=float, nargs="+", default=[1e7, 1e8, 1e9])
    parser.add_argument("--memory_points", type=float, nargs="*", default=[1e7, 1e8])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each path; medians reported")
    parser.add_argument("--workdir", default="/tmp/bench_corpus")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--out", default=str(REPO / "lab" / "results" / "bench_corpus.md"))
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    if os.path.exists(args.out) and not args.overwrite:
        raise SystemExit(f"{args.out} exists; pass --overwrite to replace it")
    work = Path(args.workdir)
    rows = []
    for points in sorted(set(args.points) | set(args.memory_points)):
        src, out = work / f"src_{points:.0e}", work / f"corpus_{points:.0e}"
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        write_sources(src, points)
        runs, built = {}, None
        if points in args.points:
            started = time.time()
            subprocess.run([sys.executable, "-m", "data_provider.corpus", "build", str(out), str(src)], cwd=REPO,
                           check=True, capture_output=True)
            built = time.time() - started
        for _ in range(args.rounds):  # interleaved: a busy moment of the machine hits both alike
            if points in args.memory_points:
                runs.setdefault("univariate (in memory)", []).append(
                    train(["--data", "univariate", "--root_path", str(src), "--data_path", "*.npy"], args.steps, work))
            if points in args.points:
                runs.setdefault("corpus (memory-mapped)", []).append(
                    train(["--data", "corpus", "--root_path", str(out)], args.steps, work))
        for kind, results in runs.items():  # per rank and figure, the median over the rounds
            ranks = [tuple(statistics.median(r[rank][i] for r in results) for i in range(8)) for rank in range(2)]
            rows.append((kind, points, built if kind.startswith("corpus") else None, ranks))
            print(rows[-1], flush=True)
        if not args.keep:
            shutil.rmtree(src, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
    lines = ["# Corpus benchmark: `--data corpus` vs `--data univariate`", "",
             f"2-process DDP (gloo, 1 thread each) on this machine, small TimerXL, batch 32, {args.steps} steps per "
             f"rank, medians of {args.rounds} interleaved runs of each path; synthetic random walks in .npy files of 1e7 points. Memory per rank in MiB: RssAnon is the "
             "process's own memory, RssFile the mapped file pages (the OS page cache, shared by both ranks and "
             "evictable); first step: seconds from process start to the end of step 1.", "",
             "| data | points | training windows | build s | first step s (rank 0/1) | steps/s (rank 0/1) | "
             "RssAnon step 1 | RssAnon last step | RssFile last step | peak RSS |", "|---|---|---|---|---|---|---|---|---|---|"]
    for kind, points, built, ranks in rows:
        mib = lambda i: " / ".join(f"{r[i] / 1024:.0f}" for r in ranks)  # noqa: E731
        lines.append(f"| {kind} | {points:.0e} | {int(ranks[0][7]):,} | {'' if built is None else f'{built:.1f}'} | "
                     f"{' / '.join(f'{r[0]:.1f}' for r in ranks)} | {' / '.join(f'{r[1]:.1f}' for r in ranks)} | "
                     f"{mib(2)} | {mib(4)} | {mib(5)} | {mib(6)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    atomic_write(args.out, lambda f: f.write(text), binary=False)


if __name__ == "__main__":
    main()
