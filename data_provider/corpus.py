"""`--data corpus`: univariate series on disk, memory-mapped, for corpora larger than memory.

Built once, streaming one source file at a time:

    python -m data_provider.corpus build OUT_DIR SOURCES...   # globs or folders of .csv .txt(.gz) .npy
                                                               # (.parquet .arrow with pyarrow)

Every channel of every source (and every row of an Arrow/Parquet `target` list column, the layout of
LOTSA and Chronos' data) is a series, split and scaled exactly as `--data univariate` does it, and
written as float32 to binary shards; one JSON index (index.json, written last and atomically) names
each series' shard, offset, length, split borders and scaler statistics. A build that stops is
continued by the same command; a folder without index.json is never read as a corpus.

`--data corpus --root_path OUT_DIR` maps the shards read-only (numpy.memmap): the OS page cache holds
what is read, shared by every process of a machine, so a process's memory does not grow with the
corpus. A window id maps to (series, row) through per-series cumulative window counts, and a batch
is gathered with one fancy-indexing read per shard.
"""
import argparse
import contextlib
import glob
import hashlib
import json
import logging
import os
import sys
import uuid

import numpy as np
import torch
from torch.utils.data import Dataset

from data_provider.files import read_file_once
from data_provider.interface import ForecastData
from data_provider.splits import SPLITS
from data_provider.univariate import SUFFIXES, scaled_series
from utils.errors import UserError, require
from utils.files import atomic_write

CORPUS = "corpus"
INDEX, STATE = "index.json", ".build_state.json"
FORMAT, VERSION = "tsl-corpus", 1
ARROW_SUFFIXES = (".parquet", ".arrow")
POINT = np.dtype("<f4")  # every value, little-endian float32

logger = logging.getLogger("tsl")


# ---------------------------------------------------------------- building
def source_files(sources):
    """The files that SOURCES (globs, folders or files) name, sorted by path as --data univariate
    sorts its glob's matches, so both enumerate the same series in the same order."""
    paths = set()
    for source in sources:
        if os.path.isdir(source):
            matched = glob.glob(os.path.join(source, "**", "*"), recursive=True)
        else:
            matched = glob.glob(source, recursive=True)
        require(matched, f"source {source} matches no file; give folders, files or globs such as 'data/*.csv'")
        paths.update(p for p in matched if os.path.isfile(p))
    readable = SUFFIXES + ARROW_SUFFIXES
    others = sorted(p for p in paths if not p.endswith(readable))
    if others:
        raise UserError(f"a corpus is built from {', '.join(readable)} files, but the sources also name {others[0]} "
                        f"({len(others)} such file(s)); narrow the globs")
    return sorted(paths)


def _arrow_table(path):
    try:
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise UserError(f"{path}: reading .parquet/.arrow files needs pyarrow (pip install pyarrow)") from None
    try:
        if path.endswith(".parquet"):
            return pyarrow.parquet.read_table(path)
        try:
            return pyarrow.ipc.open_file(path).read_all()
        except pyarrow.ArrowInvalid:  # Hugging Face datasets write the streaming format
            return pyarrow.ipc.open_stream(path).read_all()
    except (OSError, pyarrow.ArrowException) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None


def series_of(path, scale=True):
    """(name, float32 values, split ends, mean, std) of every series in one source file."""
    if not path.endswith(ARROW_SUFFIXES):
        table = read_file_once(path)
        return [(f"{path}:{column}", *series) for column, series
                in zip(table.columns, scaled_series(path, table.values, scale))]
    table = _arrow_table(path)
    if "target" in table.column_names:  # one series per row (a list of values, or a list of channels)
        found = []
        for row, target in enumerate(table.column("target").to_pylist()):
            values = np.asarray(target, dtype=np.float64)
            values = values[:, None] if values.ndim == 1 else values.T  # channels first in LOTSA's layout
            require(values.size and np.isfinite(values).all(), f"{path}: row {row}'s target is empty or holds NaN/inf")
            found += [(f"{path}:{row}:{c}", *series) for c, series in enumerate(scaled_series(path, values, scale))]
        return found
    numeric = [name for name, kind in zip(table.column_names, table.schema.types)
               if str(kind).startswith(("float", "double", "int", "uint", "halffloat"))]
    require(numeric, f"{path} has neither a 'target' column nor numeric columns")
    values = np.stack([table.column(name).to_numpy(zero_copy_only=False) for name in numeric], axis=1).astype(np.float64)
    require(len(values) and np.isfinite(values).all(), f"{path}: no rows, or NaN/inf in its numeric columns")
    return [(f"{path}:{name}", *series) for name, series in zip(numeric, scaled_series(path, values, scale))]


def _save_json(path, obj):
    atomic_write(path, lambda f: json.dump(obj, f), binary=False)


def _shard_name(build_id, number):
    return f"{build_id[:12]}-{number:05d}.bin"  # another build's index names other files


def build(out_dir, sources, shard_mb=256, scale=True, progress=True):
    """Build (or continue building) the corpus of `sources` in `out_dir`; returns its index."""
    from tqdm import tqdm

    require(shard_mb > 0, f"--shard_mb must be positive, got {shard_mb}")
    os.makedirs(out_dir, exist_ok=True)
    require(not os.path.exists(os.path.join(out_dir, INDEX)),
            f"{out_dir} already holds a finished corpus ({INDEX}); build into another folder or delete it")
    files = source_files(sources)
    state_path = os.path.join(out_dir, STATE)
    state = {"sources": files, "scale": scale, "build_id": uuid.uuid4().hex, "shard_points": int(shard_mb * 2**20) // POINT.itemsize,
             "done": 0, "series": [], "shards": []}
    if os.path.exists(state_path):
        with open(state_path) as f:
            saved = json.load(f)
        require(saved["sources"] == files and saved["scale"] == scale,
                f"{out_dir} holds an unfinished build of other sources or scaling; give the same sources, or "
                "delete the folder to start over")
        state = saved
        logger.info(f"continuing the build in {out_dir} after {state['done']} of {len(files)} files")
    shards = state["shards"]
    for name in os.listdir(out_dir):  # this build's shards begun after the last recorded file: redone
        if name.startswith(state["build_id"][:12]) and name not in {s["file"] for s in shards}:
            os.remove(os.path.join(out_dir, name))
    for shard in shards:  # the last one may hold points of a file that was not finished
        with open(os.path.join(out_dir, shard["file"]), "r+b") as f:
            f.truncate(shard["points"] * POINT.itemsize)
    for path in tqdm(files[state["done"]:], desc="corpus", unit="file", disable=not progress,
                     initial=state["done"], total=len(files)):
        with contextlib.ExitStack() as open_shards:
            handles = {}  # the shards this source file writes to, each opened once
            for name, values, ends, mean, std in series_of(path, scale):
                if not shards or (shards[-1]["points"] and shards[-1]["points"] + len(values) > state["shard_points"]):
                    shards.append({"file": _shard_name(state["build_id"], len(shards)), "points": 0})
                shard = shards[-1]
                if shard["file"] not in handles:
                    handles[shard["file"]] = open_shards.enter_context(open(os.path.join(out_dir, shard["file"]), "ab"))
                handles[shard["file"]].write(values.astype(POINT, copy=False).tobytes())
                state["series"].append({"name": name, "shard": len(shards) - 1, "offset": shard["points"],
                                        "length": len(values), "ends": list(map(int, ends)), "mean": mean, "std": std})
                shard["points"] += len(values)
            for f in handles.values():  # on disk before the state says this file is done
                f.flush()
                os.fsync(f.fileno())
        state["done"] += 1
        _save_json(state_path, state)
    require(state["series"], f"the sources hold no series: {', '.join(files[:3])}")
    for shard in shards:  # a digest of every shard: the ranks compare it before training
        digest = hashlib.blake2b(digest_size=8)
        with open(os.path.join(out_dir, shard["file"]), "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
        shard["blake2b"] = digest.hexdigest()
    index = {"format": FORMAT, "version": VERSION, "build_id": state["build_id"], "scaled": scale,
             "points": sum(s["points"] for s in shards), "sources": len(files), "shards": shards,
             "series": state["series"]}
    _save_json(os.path.join(out_dir, INDEX), index)  # last: only now is the folder a corpus
    os.remove(state_path)
    return index


# ---------------------------------------------------------------- reading
def read_index(folder):
    path = os.path.join(folder, INDEX)
    if not os.path.isfile(path):
        unfinished = os.path.exists(os.path.join(folder, STATE))
        raise UserError(f"--root_path {folder} holds no corpus ({INDEX} is missing"
                        + ("; its build did not finish: run the same `python -m data_provider.corpus build` again"
                           if unfinished else "; build one with `python -m data_provider.corpus build OUT_DIR SOURCES`")
                        + ")")
    try:
        with open(path) as f:
            index = json.load(f)
        require(index.get("format") == FORMAT and index.get("version") == VERSION, "not this codebase's format")
    except (ValueError, UserError) as exc:
        raise UserError(f"{path} is not a corpus index written by `python -m data_provider.corpus build` ({exc})") from None
    return index


class CorpusData(ForecastData):
    """A built corpus, memory-mapped: the ForecastData of --data corpus."""

    columns = ["value"]  # one channel: enc_in = c_out = 1
    mark_dim = 0
    scaler = None  # one per series
    per_series_scaling = True
    constant_memory_shuffle = True
    dates = None

    def __init__(self, folder):
        self.folder = folder
        index = read_index(folder)
        # the series table is kept as the arrays below, not as the index's dicts (hundreds of bytes each)
        self.index = {k: v for k, v in index.items() if k != "series"}
        self.shards = []
        for shard in index["shards"]:
            path = os.path.join(folder, shard["file"])
            size = os.path.getsize(path) if os.path.isfile(path) else None
            require(size == shard["points"] * POINT.itemsize,
                    f"corpus {folder} is incomplete or mixed: shard {shard['file']} "
                    + ("is missing" if size is None else f"holds {size} bytes, its index says {shard['points'] * 4}")
                    + " (an index from another build, or a shard not copied); copy the whole folder again or rebuild it")
            self.shards.append(np.memmap(path, dtype=POINT, mode="r") if shard["points"] else np.zeros(0, POINT))
        series = index["series"]
        self.shard_of = np.array([s["shard"] for s in series], dtype=np.int64)
        self.offset = np.array([s["offset"] for s in series], dtype=np.int64)
        self.ends = np.array([s["ends"] for s in series], dtype=np.int64).reshape(-1, 3)

    def content(self):
        """The index's series table and every shard's digest: the content, without reading it."""
        return [("build", self.index["build_id"]), ("digests", tuple(s["blake2b"] for s in self.index["shards"])),
                ("shard_of", self.shard_of), ("offset", self.offset), ("ends", self.ends)]

    def nbytes(self):
        return int(self.index["points"]) * POINT.itemsize

    def windows(self, shard, span):
        """A [points - span + 1, span] view of every run of `span` points in a shard (no copy): fancy
        indexing its first axis copies whole windows, row by row."""
        return np.lib.stride_tricks.sliding_window_view(self.shards[shard], span)

    def window_dataset(self, flag, window, with_marks=True):
        return CorpusWindows(self, flag, window, with_marks)

    def forecast_date(self, flag, window, i):
        return None

    def future_input(self, window, freq, embed):
        raise UserError("--do_predict forecasts one data set on its original scale; a corpus scales every series on "
                        "its own, so there is no single original scale to forecast; use --data custom on one file")


class CorpusWindows(Dataset):
    """Every window of one split of a corpus, in the order --data univariate gives them: series by
    series, then by start row. Memory: three integers per series, none per window."""

    def __init__(self, data, flag, window, with_marks=True):
        i = SPLITS.index(flag)
        stop = data.ends[:, i]
        start = np.zeros_like(stop) if i == 0 else np.maximum(data.ends[:, i - 1] - window.x_len, 0)
        windows = stop - start - window.span + 1
        keep = windows > 0  # a series too short for this split adds nothing (as --data univariate)
        if not keep.any():
            raise UserError(
                f"the {flag} split of corpus {data.folder} has at most {int((stop - start).max())} rows per series, "
                f"fewer than the {window.span} one window needs (seq_len {window.x_len} + horizon); shorten "
                "--seq_len/--pred_len or add longer series")
        self.data, self.window, self.split, self.with_marks = data, window, flag, with_marks
        self.first_row = data.offset[keep] + start[keep]  # in its shard
        self.shard = data.shard_of[keep]
        self.ends_before = np.concatenate([[0], np.cumsum(windows[keep])])  # windows of the series before

    def __len__(self):
        return int(self.ends_before[-1])

    @property
    def device(self):
        return torch.device("cpu")

    def to(self, device):
        """The corpus stays memory-mapped in host memory (the page cache): batches are copied per step."""
        return self

    def rows(self, indices):
        """[B, span] float32 of windows `indices` (any integer sequence or tensor)."""
        ids = torch.as_tensor(indices).cpu().numpy().astype(np.int64, copy=False)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self)):
            raise IndexError(f"window ids out of range [0, {len(self)})")
        series = np.searchsorted(self.ends_before, ids, side="right") - 1
        first = self.first_row[series] + (ids - self.ends_before[series])
        out = np.empty((len(ids), self.window.span), dtype=POINT)
        shards = self.shard[series]
        for shard in np.unique(shards):
            chosen = shards == shard
            out[chosen] = self.data.windows(shard, self.window.span)[first[chosen]]  # one read per shard
        return out

    def __getitems__(self, indices):
        w = self.window
        rows = torch.from_numpy(self.rows(indices))[..., None]
        # contiguous, as the in-memory kinds give them (a strided input slows the model's first ops)
        x, y = rows[:, :w.x_len].contiguous(), rows[:, w.y_offset:w.y_offset + w.y_len].contiguous()
        if not self.with_marks:
            return x, y, None, None
        return x, y, x.new_zeros((*x.shape[:2], 0)), y.new_zeros((*y.shape[:2], 0))

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(index)
        return tuple(None if t is None else t[0] for t in self.__getitems__([index]))


def prepare_corpus(args):
    require(args.features != "MS", "--data corpus holds univariate series, so there are no covariates for "
                                   "--features MS; use --features S")
    data = CorpusData(args.root_path)
    require(data.index["scaled"] == bool(args.scale),
            f"corpus {args.root_path} was built {'scaled' if data.index['scaled'] else 'unscaled'}, but --scale is "
            f"{str(bool(args.scale)).lower()}; rebuild it {'with' if args.scale else 'without'} --no_scale, or "
            f"drop --scale {str(bool(args.scale)).lower()}")
    return data


# ---------------------------------------------------------------- the command line
def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m data_provider.corpus", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="stream source files into float32 shards and an index")
    p_build.add_argument("out_dir")
    p_build.add_argument("sources", nargs="+", help="files, folders or globs (quote globs)")
    p_build.add_argument("--shard_mb", type=float, default=256, help="the largest shard (a series is never split)")
    p_build.add_argument("--no_scale", dest="scale", action="store_false",
                         help="keep the values as they are (train with --scale false)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        index = build(args.out_dir, args.sources, args.shard_mb, args.scale)
    except UserError as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"corpus {args.out_dir}: {len(index['series'])} series, {index['points']} points in {len(index['shards'])} "
          f"shard(s) from {index['sources']} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
