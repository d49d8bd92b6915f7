"""The figures docs/scaling.md's "Time-300B on 8 x 8 GPUs" arithmetic starts from, measured here.

    python lab/bench_io.py --points 1e8 --many_series 200000 --checkpoint_mb 512

1. Random window reads from a built corpus (memory-mapped shards), batches of --batch random windows
   of --span points, in interleaved rounds of three kinds: warm (every page in the OS cache), cold
   (the shards' pages dropped from the cache with posix_fadvise(DONTNEED) first) with the kernel's
   default read-ahead, and cold with madvise(MADV_RANDOM) on the mappings (no read-ahead). Reported:
   windows/s, bytes read from storage per window (/proc/self/io read_bytes) and mapped-page growth
   per window (RssFile), medians over rounds.
2. The index: a corpus of --many_series short series: index.json bytes per series, the seconds to
   open it and the process memory it takes (RssAnon) per series.
3. Checkpoints: utils.checkpoint.save_atomic (torch.save, fsync, rename) of --checkpoint_mb MB of
   float32 tensors, and torch.load of it: MB/s.

Writes lab/results/bench_io.md (an existing one only with --overwrite) and prints the table.
The corpora are deleted afterwards.
"""
import argparse
import gc
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from lab.bench_corpus import memory_kib, write_sources  # noqa: E402
from data_provider.corpus import CorpusData  # noqa: E402
from data_provider.windows import Window  # noqa: E402
from utils.checkpoint import save_atomic  # noqa: E402
from benchmarks.outputs import add_output_arguments, parse_with_outputs  # noqa: E402
from utils.files import atomic_write  # noqa: E402


def build(sources, out):
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "data_provider.corpus", "build", str(out), str(sources)],
                   cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - started


def storage_read_bytes():
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes"))


def drop_from_cache(data):
    os.sync()  # dirty pages (a fresh build's) stay cached whatever the advice
    for memmapped in data.files:
        if isinstance(memmapped, np.memmap):
            with open(memmapped.filename, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def advise(data, advice):
    for memmapped in data.files:
        if isinstance(memmapped, np.memmap):
            memmapped._mmap.madvise(advice)


def read_round(data, windows, batches, batch, rng):
    """(windows/s, storage bytes per window, RssFile KiB per window) of `batches` random batches."""
    read0, rss0 = storage_read_bytes(), memory_kib()["RssFile"]
    started = time.perf_counter()
    for _ in range(batches):
        windows.__getitems__(torch.from_numpy(rng.integers(0, len(windows), batch)))
    seconds = time.perf_counter() - started
    n = batches * batch
    return n / seconds, (storage_read_bytes() - read0) / n, (memory_kib()["RssFile"] - rss0) / n


def random_reads(folder, points, rounds, batches, batch, span):
    data = CorpusData(str(folder))
    windows = data.window_dataset("train", Window(span, span - 24, 24), with_marks=False)
    rng = np.random.default_rng(0)
    read_round(data, windows, batches, batch, rng)  # touch the code paths once
    results = {"warm": [], "cold, default read-ahead": [], "cold, MADV_RANDOM": []}
    for _ in range(rounds):
        for kind in results:
            # fresh mappings each round: RssFile counts this round's pages only
            data = CorpusData(str(folder))
            windows = data.window_dataset("train", Window(span, span - 24, 24), with_marks=False)
            if kind.startswith("cold"):
                drop_from_cache(data)
            if kind.endswith("MADV_RANDOM"):
                advise(data, mmap.MADV_RANDOM)
            if kind == "warm":  # every page cached: read the shards through once
                for memmapped in data.files:
                    np.asarray(memmapped).sum()
            results[kind].append(read_round(data, windows, batches, batch, rng))
            del data, windows
            gc.collect()
    return {kind: tuple(statistics.median(r[i] for r in runs) for i in range(3)) for kind, runs in results.items()}


def index_cost(folder, series, length):
    sources = folder / "many"
    sources.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    np.save(sources / "many.npy", np.cumsum(rng.standard_normal((length, series), dtype=np.float32), axis=0))
    out = folder / "many_corpus"
    seconds_build = build(sources, out)
    index_bytes = os.path.getsize(out / "index.json")
    gc.collect()
    anon0 = memory_kib()["RssAnon"]
    started = time.perf_counter()
    data = CorpusData(str(out))
    seconds_open = time.perf_counter() - started
    gc.collect()
    anon = memory_kib()["RssAnon"] - anon0
    del data
    return {"series": series, "length": length, "build_s": seconds_build, "index_bytes_per_series": index_bytes / series,
            "open_us_per_series": seconds_open / series * 1e6, "rss_bytes_per_series": anon * 1024 / series}


def checkpoint_rate(folder, megabytes, rounds):
    state = {f"w{i}": torch.randn(megabytes * 2**20 // 4 // 16) for i in range(16)}
    path = folder / "state.pth"
    saves, loads = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        save_atomic(state, str(path))
        saves.append(megabytes / (time.perf_counter() - started))
        os.sync()
        with open(path, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        started = time.perf_counter()
        torch.load(path, map_location="cpu", weights_only=True)
        loads.append(megabytes / (time.perf_counter() - started))
    return statistics.median(saves), statistics.median(loads)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=float, default=1e8)
    parser.add_argument("--many_series", type=int, default=200_000)
    parser.add_argument("--series_length", type=int, default=200)
    parser.add_argument("--checkpoint_mb", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--span", type=int, default=120, help="points per window (seq_len + output tokens)")
    parser.add_argument("--rounds", type=int, default=3)
    add_output_arguments(parser, "bench_io.md", "/tmp/bench_io", REPO / "lab" / "results")
    options, work = parse_with_outputs(parser)
    try:
        write_sources(work / "sources", options.points)
        build_s = build(work / "sources", work / "corpus")
        shutil.rmtree(work / "sources")
        reads = random_reads(work / "corpus", options.points, options.rounds, options.batches, options.batch,
                             options.span)
        shutil.rmtree(work / "corpus")
        index = index_cost(work, options.many_series, options.series_length)
        save_mb_s, load_mb_s = checkpoint_rate(work, options.checkpoint_mb, options.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [
        "# I/O figures for the scaling arithmetic (`lab/bench_io.py`)", "",
        f"This machine (2 cores, its virtual disk), one process. Corpus of {options.points:.0e} points built in "
        f"{build_s:.1f} s. Random windows of {options.span} float32 points ({options.span * 4} bytes), batches of "
        f"{options.batch}, {options.batches} batches a round, medians of {options.rounds} interleaved rounds.", "",
        "| reads | windows/s | storage bytes read per window | mapped KiB per window (RssFile) |", "|---|---|---|---|"]
    for kind, (rate, read, rss) in reads.items():
        lines.append(f"| {kind} | {rate:,.0f} | {read:,.0f} | {rss:.1f} |")
    lines += ["", f"Index: {index['series']:,} series of {index['length']} points (built in {index['build_s']:.1f} s): "
              f"index.json {index['index_bytes_per_series']:.0f} bytes per series; opening it "
              f"{index['open_us_per_series']:.2f} µs and {index['rss_bytes_per_series']:.0f} bytes of process memory "
              "per series.", "",
              f"Checkpoint of {options.checkpoint_mb} MB: save_atomic (torch.save + fsync + rename) {save_mb_s:,.0f} MB/s, "
              f"torch.load from storage {load_mb_s:,.0f} MB/s (medians of {options.rounds}).", ""]
    text = "\n".join(lines)
    atomic_write(options.out, lambda f: f.write(text), binary=False)
    print(text)


if __name__ == "__main__":
    main()
