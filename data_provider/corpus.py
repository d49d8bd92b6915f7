"""`--data corpus`: univariate series on disk, memory-mapped, for corpora larger than memory.

Two layouts, told apart by what `--root_path` holds (both, or neither, is refused in one line):

1. A corpus built once, streaming one source file at a time (index.json):

    python -m data_provider.corpus build OUT_DIR SOURCES...   # globs or folders of .csv .txt(.gz) .npy
                                                               # (.parquet .arrow with pyarrow)

   Every channel of every source (and every row of an Arrow/Parquet list column, `target` in the layout
   of LOTSA's, Chronos' and GIFT-Eval's data: see _series_column) is a series, split and scaled exactly
   as `--data univariate` does it, and written as float32 to binary shards; one JSON index (index.json,
   written last and atomically) names each series' shard, offset, length, split borders and scaler
   statistics, with a sha256 of those numbers. A build holds a lock on its folder (a second build into it
   is refused); one that stops is continued by the same command; a folder without index.json is never
   read as a corpus, and an index whose series table is not its build's is refused when it is opened.

2. Time-MoE's binary layout (Time-300B), read as it is: no conversion, no copy. A folder holds meta.json
   and data-<i>-of-<n>.bin; `--root_path` is one such folder, or a tree of them (Time-300B's
   <domain>/<data set>/), read in path order. meta.json gives `num_sequences`, `dtype`, `files` (each
   file's number of values) and `scales` (each sequence's `offset` and `length`, and `mean` and `std`
   when the sequence is stored normalised: Time-MoE's reader returns x * std + mean, and so does this
   one). The files hold raw little-endian values, end to end in the order of <i> (data-10 after
   data-9), cut at equal lengths wherever the sequences end, so a sequence may run on into the next
   file. Each sequence is a series: split 70/10/20 as `--data univariate` splits a series, and with
   --scale scaled with the statistics of its own training part (bit for bit what `build` would
   compute). Opening parses meta.json (about 2 s and transiently 0.8 GB per million sequences) and
   keeps a few arrays, about 50 bytes a sequence; a sequence's statistics are computed the first time
   one of its windows is read in a process (one read of its training part), then kept.

`--data corpus` maps the value files read-only (numpy.memmap): the OS page cache holds what is read,
shared by every process of a machine, so a process's memory does not grow with the corpus. A window id
maps to (series, row) through per-series cumulative window counts, and a batch is gathered with one
fancy-indexing read per file (a window that runs over a file boundary is read piecewise). Each read first
checks the size of the file it reads (CorpusData.require_unchanged): a file cut short under a memory map kills
the reader with SIGBUS, so one changed during the run is named in one line instead.
"""
import argparse
import contextlib
import functools
import glob
import hashlib
import json
import logging
import mmap
import operator
import os
import re
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
from utils.files import atomic_write, release_file_lock, take_file_lock

CORPUS = "corpus"
INDEX, STATE, JOURNAL, LOCK = "index.json", ".build_state.json", ".build_series.jsonl", ".build.lock"
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


def _is_list(kind):
    import pyarrow.types as types

    return types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind)


def _is_number(kind):
    import pyarrow.types as types

    return types.is_integer(kind) or types.is_floating(kind)


def _series_column(path, table, column=None):
    """The list column whose rows are the series of an Arrow/Parquet table: `column` (build's --column),
    else 'target' (LOTSA's, Chronos' and GIFT-Eval's name), else the only list column; None for a table
    without list columns, whose numeric columns are then the series. Beside a list column, the other
    columns (ids, start dates, frequencies) describe the rows: they are not series."""
    lists = [name for name, kind in zip(table.column_names, table.schema.types) if _is_list(kind)]
    if column is not None:
        require(column in lists, f"{path} has no list column {column!r} (--column); its list columns: "
                                 f"{', '.join(lists) or 'none'}")
        chosen = column
    elif not lists:
        return None
    elif "target" in lists or len(lists) == 1:
        chosen = "target" if "target" in lists else lists[0]
    else:
        raise UserError(f"{path} has several list columns ({', '.join(lists)}) and none named 'target'; name the "
                        "one that holds the series with --column NAME")
    kind = table.schema.field(chosen).type.value_type
    require(_is_number(kind) or (_is_list(kind) and _is_number(kind.value_type)),
            f"{path}: list column {chosen!r} holds {kind} values, not numbers or lists of numbers; name the list "
            "column that holds the series with --column NAME")
    others = [name for name in table.column_names if name != chosen]
    _say_once(f"Parquet/Arrow sources: each row of list column {chosen!r} is a series (a row holding a list of "
              f"lists: one series per inner list); not series: {', '.join(others) or 'no other column'}")
    return chosen


@functools.lru_cache(maxsize=None)
def _say_once(message):
    logger.info(message)


def _rows(path, name, column):
    """(row number, float64 [time, channels] values) of every row of list column `name`: a list of numbers
    is one channel; a list of lists (LOTSA's multivariate target) is one channel per inner list."""
    import pyarrow.compute as compute

    nested = _is_list(column.type.value_type)
    row = 0
    for chunk in column.chunks:  # flattened per chunk, not as Python objects per value
        counts = compute.list_value_length(chunk).to_numpy(zero_copy_only=False)  # NaN: a null row
        channels = chunk.flatten()
        widths = compute.list_value_length(channels).to_numpy(zero_copy_only=False) if nested else None
        values = (channels.flatten() if nested else channels).to_numpy(zero_copy_only=False).astype(np.float64)
        position = channel = 0
        for count in counts:
            require(count == count, f"{path}: row {row}'s {name!r} is null; drop that row")
            count = int(count)
            if nested:
                width = widths[channel:channel + count]
                require(len(set(width.tolist())) <= 1 and not np.isnan(width).any(),
                        f"{path}: row {row}'s {name!r} holds channels of different lengths ({width.tolist()})")
                size = int(width.sum())
                # channels first, as LOTSA stores them
                yield row, values[position:position + size].reshape(count, size // max(count, 1)).T
                channel += count
            else:
                size = count
                yield row, values[position:position + size, None]
            position += size
            row += 1


def series_of(path, scale=True, column=None):
    """(name, float32 values, split ends, mean, std) of every series in one source file."""
    if not path.endswith(ARROW_SUFFIXES):
        table = read_file_once(path)
        return [(f"{path}:{column}", *series) for column, series
                in zip(table.columns, scaled_series(path, table.values, scale))]
    table = _arrow_table(path)
    chosen = _series_column(path, table, column)
    if chosen is not None:  # one series per row (a list of values, or a list of channels)
        found = []
        for row, values in _rows(path, chosen, table.column(chosen)):
            require(values.size and np.isfinite(values).all(),
                    f"{path}: row {row}'s {chosen!r} is empty or holds NaN/inf (or missing values)")
            found += [(f"{path}:{row}:{c}", *series) for c, series in enumerate(scaled_series(path, values, scale))]
        return found
    numeric = [name for name, kind in zip(table.column_names, table.schema.types) if _is_number(kind)]
    require(numeric, f"{path} has neither a list column of series (such as 'target') nor numeric columns "
                     f"(its columns: {', '.join(table.column_names) or 'none'})")
    values = np.stack([table.column(name).to_numpy(zero_copy_only=False) for name in numeric], axis=1).astype(np.float64)
    require(len(values) and np.isfinite(values).all(), f"{path}: no rows, or NaN/inf in its numeric columns")
    return [(f"{path}:{name}", *series) for name, series in zip(numeric, scaled_series(path, values, scale))]


def _save_json(path, obj):
    atomic_write(path, lambda f: json.dump(obj, f), binary=False)


def _shard_name(build_id, number):
    return f"{build_id[:12]}-{number:05d}.bin"  # another build's index names other files


def build(out_dir, sources, shard_mb=256, scale=True, progress=True, column=None):
    """Build (or continue building) the corpus of `sources` in `out_dir`; returns its index. `column`:
    the list column of .parquet/.arrow sources whose rows are the series (default: 'target', else the
    only list column)."""
    require(shard_mb > 0, f"--shard_mb must be positive, got {shard_mb}")
    os.makedirs(out_dir, exist_ok=True)
    _refuse_a_finished_corpus(out_dir)  # before the lock: a finished corpus may lie in a read-only folder
    with build_lock(out_dir):
        _refuse_a_finished_corpus(out_dir)  # one that another build finished meanwhile
        return _build_locked(out_dir, sources, shard_mb, scale, progress, column)


def _refuse_a_finished_corpus(out_dir):
    require(not os.path.exists(os.path.join(out_dir, INDEX)),
            f"{out_dir} already holds a finished corpus ({INDEX}); build into another folder or delete it")


@contextlib.contextmanager
def build_lock(out_dir):
    """An exclusive flock on OUT_DIR/.build.lock while a build writes the folder (its pid, host and start
    time inside): a second build into the folder stops in one line naming the first. The kernel drops
    the lock when its holder dies, so a killed build never blocks the command that continues it."""
    path = os.path.join(out_dir, LOCK)
    try:
        fd = _take_lock(path)
    except OSError as exc:
        raise UserError(f"cannot lock {path} ({exc.strerror}); build into a folder you can write") from None
    try:
        yield
    finally:
        release_file_lock(path, fd)


def _take_lock(path):
    fd, holder = take_file_lock(path)
    if fd is None:
        raise UserError(f"{os.path.dirname(path)} is being built by another `python -m data_provider.corpus "
                        f"build` ({holder}); wait for it to end, or build into another folder")
    return fd


def _build_locked(out_dir, sources, shard_mb, scale, progress, column):
    from tqdm import tqdm

    files = source_files(sources)
    state_path, journal_path = os.path.join(out_dir, STATE), os.path.join(out_dir, JOURNAL)
    # the state stays small (rewritten after every file); each series' record is appended to the journal,
    # so a build of many files and series writes every record once
    state = {"sources": files, "scale": scale, "column": column, "build_id": uuid.uuid4().hex,
             "shard_points": int(shard_mb * 2**20) // POINT.itemsize, "done": 0, "shards": [], "journal_bytes": 0}
    if os.path.exists(state_path):
        with open(state_path) as f:
            saved = json.load(f)
        require(saved["sources"] == files and saved["scale"] == scale and saved.get("column") == column,
                f"{out_dir} holds an unfinished build of other sources, scaling or --column; give the same "
                "sources and options, or delete the folder to start over")
        require("journal_bytes" in saved, f"{out_dir} holds an unfinished build of an older version of this code; "
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
    with open(journal_path, "ab") as journal:  # likewise the records of an unfinished file
        journal.truncate(state["journal_bytes"])
    for path in tqdm(files[state["done"]:], desc="corpus", unit="file", disable=not progress,
                     initial=state["done"], total=len(files)):
        with contextlib.ExitStack() as open_files:
            handles = {}  # the shards this source file writes to, each opened once
            journal = open_files.enter_context(open(journal_path, "a"))
            for name, values, ends, mean, std in series_of(path, scale, column):
                if not shards or (shards[-1]["points"] and shards[-1]["points"] + len(values) > state["shard_points"]):
                    shards.append({"file": _shard_name(state["build_id"], len(shards)), "points": 0})
                shard = shards[-1]
                if shard["file"] not in handles:
                    handles[shard["file"]] = open_files.enter_context(open(os.path.join(out_dir, shard["file"]), "ab"))
                handles[shard["file"]].write(values.astype(POINT, copy=False).tobytes())
                journal.write(json.dumps({"name": name, "shard": len(shards) - 1, "offset": shard["points"],
                                          "length": len(values), "ends": list(map(int, ends)), "mean": mean,
                                          "std": std}) + "\n")
                shard["points"] += len(values)
            for f in [*handles.values(), journal]:  # on disk before the state says this file is done
                f.flush()
                os.fsync(f.fileno())
            state["journal_bytes"] = journal.tell()
        state["done"] += 1
        _save_json(state_path, state)
    with open(journal_path) as journal:
        state["series"] = [json.loads(line) for line in journal]
    require(state["series"], f"the sources hold no series: {', '.join(files[:3])}")
    for shard in shards:  # a digest of every shard: the ranks compare it before training
        digest = hashlib.blake2b(digest_size=8)
        with open(os.path.join(out_dir, shard["file"]), "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
        shard["blake2b"] = digest.hexdigest()
    index = {"format": FORMAT, "version": VERSION, "build_id": state["build_id"], "scaled": scale,
             "points": sum(s["points"] for s in shards), "sources": len(files), "shards": shards,
             "series_sha256": series_digest(*series_arrays(state["series"])), "series": state["series"]}
    _save_json(os.path.join(out_dir, INDEX), index)  # last: only now is the folder a corpus
    os.remove(state_path)
    os.remove(journal_path)
    return index


# ---------------------------------------------------------------- reading
def read_index(folder):
    path = os.path.join(folder, INDEX)
    if not os.path.isfile(path):
        unfinished = os.path.exists(os.path.join(folder, STATE))
        raise UserError(f"--root_path {folder} holds no corpus ({INDEX} is missing"
                        + ("; its build did not finish: run the same `python -m data_provider.corpus build` again"
                           if unfinished else "; build one with `python -m data_provider.corpus build OUT_DIR SOURCES`"
                           f", or give a folder in Time-MoE's layout, {META} beside data-*-of-*.bin files")
                        + ")")
    try:
        with open(path) as f:
            index = json.load(f)
        require(index.get("format") == FORMAT and index.get("version") == VERSION, "not this codebase's format")
    except (ValueError, UserError) as exc:
        raise UserError(f"{path} is not a corpus index written by `python -m data_provider.corpus build` ({exc})") from None
    return index


def series_arrays(series):
    """The numbers of an index's series table, as arrays: shard, offset, length [n] and the split ends
    [n, 3] (int64), mean and std [n] (float64)."""
    n = len(series)

    def column(key, dtype):
        return np.fromiter(map(operator.itemgetter(key), series), dtype, n)

    ends = np.array(list(map(operator.itemgetter("ends"), series)), dtype=np.int64).reshape(n, 3)
    return (column("shard", np.int64), column("offset", np.int64), column("length", np.int64), ends,
            column("mean", np.float64), column("std", np.float64))


def series_digest(shard, offset, length, ends, mean, std):
    """sha256 of the series table's numbers, as the build wrote them: an edit of index.json that keeps
    the table consistent (a split border moved, a scaler changed) still changes it."""
    digest = hashlib.sha256()
    for array, dtype in ((shard, "<i8"), (offset, "<i8"), (length, "<i8"), (ends, "<i8"), (mean, "<f8"), (std, "<f8")):
        digest.update(np.ascontiguousarray(array, dtype=dtype).tobytes())
    return digest.hexdigest()


def check_series_table(folder, index, shard, offset, length, ends, digest):
    """Refuse a series table that is not the build's: every series within its shard, its split ends rising
    from 0 to its length, the series of each shard end to end from its start to its end (as the build lays
    them out), and the table's digest the build's (an index without one, from before it, is checked
    without). Vectorised: about 0.1 s per million series."""
    shards, names = index["shards"], [s["file"] for s in index["shards"]]
    points = np.array([s["points"] for s in shards], dtype=np.int64)

    def refuse_first(bad, what):
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise UserError(f"corpus {folder}: index.json's series table is damaged or edited: series {i} "
                            f"({index['series'][i].get('name', '?')}) {what(i)}; copy the whole folder again from "
                            "its build, or rebuild the corpus")

    refuse_first((shard < 0) | (shard >= len(shards)),
                 lambda i: f"names shard {shard[i]}, but the index lists {len(shards)} shards")
    refuse_first((ends[:, 0] < 0) | (np.diff(ends, axis=1) < 0).any(axis=1) | (ends[:, 2] != length),
                 lambda i: f"has split ends {ends[i].tolist()}, which do not rise to its length {length[i]}")
    refuse_first(offset + length > points[shard],
                 lambda i: f"runs to point {offset[i] + length[i]} of shard {names[shard[i]]}, which holds "
                           f"{points[shard[i]]}")
    after_last = np.concatenate([[0], offset[:-1] + length[:-1]])  # where the series before each one ends
    same_shard = np.concatenate([[False], shard[1:] == shard[:-1]])
    expected = np.where(same_shard, after_last, 0)
    refuse_first((offset != expected) | (np.diff(shard, prepend=0) < 0),  # a negative offset too
                 lambda i: f"starts at point {offset[i]} of shard {names[shard[i]]}, but the series before it "
                           f"ends at point {expected[i]}")
    filled = np.bincount(shard, weights=length, minlength=len(shards)).astype(np.int64)
    for k in np.flatnonzero(filled != points)[:1]:
        raise UserError(f"corpus {folder}: index.json's series table is damaged or edited: shard {names[k]} holds "
                        f"{points[k]} points, its series {filled[k]}; copy the whole folder again from its build, or "
                        "rebuild the corpus")
    recorded = index.get("series_sha256")
    require(recorded is None or recorded == digest,
            f"corpus {folder}: index.json's series table is not the one its build wrote (its sha256 differs from "
            "series_sha256: split ends, scalers or places were edited); copy the whole folder again from its "
            "build, or rebuild the corpus")


def open_corpus(folder, scale):
    """The ForecastData of --data corpus: a built corpus (index.json) or Time-MoE's layout, read as it is."""
    found = time_moe_folders(folder)
    if found and os.path.isfile(os.path.join(folder, INDEX)):
        where = "" if found[0] == folder else f" (under {found[0]})"
        raise UserError(f"--root_path {folder} holds both a built corpus ({INDEX}) and Time-MoE's {META}{where}; "
                        "give a folder of one layout")
    return TimeMoEData(folder, found, scale) if found else CorpusData(folder)


class CorpusData(ForecastData):
    """A built corpus, memory-mapped: the ForecastData of --data corpus.

    Its value files lie end to end in one global position space (`file_start`): a series starts at
    a global position, and a window that runs over the end of one file into the next (only in
    Time-MoE's layout) is read piecewise."""

    columns = ["value"]  # one channel: enc_in = c_out = 1
    mark_dim = 0
    scaler = None  # one per series
    per_series_scaling = True
    constant_memory_shuffle = True
    dates = None
    series_transform = False  # True: finish() needs each window's series (Time-MoE's layout)
    # never moved to a GPU (CorpusWindows.to): what data_factory.keeps_data_on_device logs
    stays_on_host = "a corpus stays in its memory map"

    def __init__(self, folder):
        self.folder = folder
        index = read_index(folder)
        # the series table is kept as the arrays below, not as the index's dicts (hundreds of bytes each)
        self.index = {k: v for k, v in index.items() if k != "series"}
        self.files, self.paths = [], []
        for shard in index["shards"]:
            path = os.path.join(folder, shard["file"])
            size = os.path.getsize(path) if os.path.isfile(path) else None
            require(size == shard["points"] * POINT.itemsize,
                    f"corpus {folder} is incomplete or mixed: shard {shard['file']} "
                    + ("is missing" if size is None else f"holds {size} bytes, its index says {shard['points'] * 4}")
                    + " (an index from another build, or a shard not copied); copy the whole folder again or rebuild it")
            self.files.append(np.memmap(path, dtype=POINT, mode="r") if shard["points"] else np.zeros(0, POINT))
            self.paths.append(path)
        self.dtype, self.counts = POINT, [shard["points"] for shard in index["shards"]]
        self.file_start = np.concatenate([[0], np.cumsum([s["points"] for s in index["shards"]])]).astype(np.int64)
        try:
            self.shard_of, self.offset, length, self.ends, mean, std = series_arrays(index["series"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"corpus {folder}: index.json's series table is damaged or edited ({type(exc).__name__}: "
                            "an entry without a number for shard, offset, length, mean or std, or 3 split ends); "
                            "copy the whole folder again from its build, or rebuild the corpus") from None
        check_series_table(folder, index, self.shard_of, self.offset, length, self.ends,
                           series_digest(self.shard_of, self.offset, length, self.ends, mean, std))

    def series_start(self):
        """Every series' first value, as a global position (computed, not kept: 8 bytes a series)."""
        return self.file_start[self.shard_of] + self.offset

    def content(self):
        """The index's series table and every shard's digest: the content, without reading it."""
        return [("build", self.index["build_id"]), ("digests", tuple(s["blake2b"] for s in self.index["shards"])),
                ("shard_of", self.shard_of), ("offset", self.offset), ("ends", self.ends)]

    def nbytes(self):
        return int(self.file_start[-1]) * self.dtype.itemsize

    def require_unchanged(self, files=None):
        """Refuse to read on when a value file (of `files`, default all) no longer holds the bytes it held when it
        was opened (a file copied over it, or cut short, during the run): reading a memory map past the file's
        end kills the process with SIGBUS, without a word (or, in a loader worker, a traceback blaming shared
        memory). One fstat per file (the size of the map's file), about 0.5 us: checked before every read."""
        for f in range(len(self.files)) if files is None else files:
            if self.files[f] is None:  # changed before this process mapped it (__setstate__)
                self._require_size(f, os.path.getsize(self.paths[f]))
            mapping = getattr(self.files[f], "_mmap", None)
            if mapping is not None:  # an empty file: nothing mapped, nothing to read
                self._require_size(f, mapping.size())

    def _require_size(self, f, size):
        expected = self.counts[f] * self.dtype.itemsize
        if size != expected:
            raise UserError(f"{self.paths[f]} changed during the run: it holds {size} bytes, {expected} when the "
                            "run opened it (a file copied over it, or cut short?); put the corpus' own file back "
                            "(copy the whole folder again, or rebuild it) and continue with --resume")

    def __getstate__(self):
        """Pickled for a loader worker that is not forked (spawn, forkserver: Python 3.14's default): the value
        files by path, mapped again where unpickled; a memory map pickles as a copy of its whole file."""
        return {**self.__dict__, "files": None}

    def __setstate__(self, state):
        """A file that changed is left unmapped (None): its first read says so (require_unchanged), in the
        worker's loop, whose errors reach the run; raised here, in the worker's start, it would be a traceback."""
        self.__dict__.update(state)
        self.files = [None if count and os.path.getsize(path) != count * self.dtype.itemsize
                      else np.memmap(path, dtype=self.dtype, mode="r") if count else np.zeros(0, self.dtype)
                      for path, count in zip(self.paths, self.counts)]

    def windows(self, file, span):
        """A [points - span + 1, span] view of every run of `span` points in a file (no copy): fancy
        indexing its first axis copies whole windows, row by row."""
        return np.lib.stride_tricks.sliding_window_view(self.files[file], span)

    def points(self, start, stop):
        """The values at global positions [start, stop), across as many files as they lie in."""
        pieces = []
        file = int(np.searchsorted(self.file_start, start, side="right")) - 1
        while start < stop:
            end = min(stop, int(self.file_start[file + 1]))
            self.require_unchanged([file])
            pieces.append(np.array(self.files[file][start - self.file_start[file]:end - self.file_start[file]]))
            start, file = end, file + 1
        return np.concatenate(pieces) if pieces else np.zeros(0, self.dtype)

    def read(self, first, span):
        """[B, span] values (the files' dtype) of the windows starting at global positions `first`: one
        fancy-indexing read per file, and piece by piece for a window that runs into the next file."""
        file = np.searchsorted(self.file_start, first, side="right") - 1
        inside = first + span <= self.file_start[file + 1]
        out = np.empty((len(first), span), dtype=self.dtype)
        for f in np.unique(file[inside]):
            chosen = inside & (file == f)
            self.require_unchanged([f])  # just before the copy, which a cut can still meet
            out[chosen] = self.windows(f, span)[first[chosen] - self.file_start[f]]
        for row in np.flatnonzero(~inside):  # at most span - 1 window starts per file boundary
            out[row] = self.points(int(first[row]), int(first[row]) + span)
        self.release(np.unique(np.concatenate([file, file + (~inside)])))
        return out

    def release(self, files):
        """Drop the pages a batch touched from this process's mappings (madvise DONTNEED): they stay in
        the OS page cache, shared, but no longer count in the process's resident memory, which would
        otherwise grow with every page a run has read (by up to 64 KiB of fault-around per window).
        Costs a minor fault per page on the next touch: about 0.1 ms a batch, measured."""
        for f in files:
            mapping = getattr(self.files[f], "_mmap", None)
            if mapping is not None:
                mapping.madvise(mmap.MADV_DONTNEED)

    def finish(self, values, series):
        """Windows as read -> the float32 windows served: a built corpus is stored as served."""
        return values

    def window_dataset(self, flag, window, with_marks=True):
        return CorpusWindows(self, flag, window, with_marks)

    def forecast_date(self, flag, window, i):
        return None

    def future_input(self, window, freq, embed):
        raise UserError("--do_predict forecasts one data set on its original scale; a corpus scales every series on "
                        "its own, so there is no single original scale to forecast; use --data custom on one file")


# ---------------------------------------------------------------- Time-MoE's layout, read as it is
META = "meta.json"
TIME_MOE_FILE = re.compile(r"data-(\d+)-of-(\d+)\.bin")
TIME_MOE_DTYPES = ("float16", "float32", "float64")


def time_moe_folders(root):
    """The folders of Time-MoE's layout (a meta.json) at `root`: root itself when it holds one (as
    Time-MoE's BinaryDataset reads it), otherwise every folder under it that does, sorted by path
    (Time-300B's tree, domain/data set/, as Time-MoE's TimeMoEDataset walks it)."""
    if os.path.isfile(os.path.join(root, META)):
        return [root]
    found = []
    for here, subfolders, names in os.walk(root):
        subfolders.sort()
        if here != root and META in names:
            found.append(here)
    return found


def _whole_numbers(values, what, meta_path):
    """An int64 array of JSON numbers that must be whole and >= 0."""
    try:
        array = np.fromiter(values, dtype=np.float64)
    except (TypeError, ValueError, KeyError):
        raise UserError(f"{meta_path}: every entry of 'scales' needs a numeric {what}") from None
    bad = np.flatnonzero(~(array >= 0) | (array != np.floor(array)))
    if bad.size:
        raise UserError(f"{meta_path}: sequence {bad[0]}'s {what} is {array[bad[0]]:g}, not a whole number >= 0")
    return array.astype(np.int64)


def read_meta(folder):
    """One folder of Time-MoE's layout, checked: (files as [(path, values)] in Time-MoE's order, dtype,
    offsets, lengths, Time-MoE's own per-sequence mean and std (NaN where a sequence has none), and
    the digest of meta.json)."""
    path = os.path.join(folder, META)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        meta = json.loads(raw)
    except ValueError as exc:
        raise UserError(f"{path} is not Time-MoE's meta.json ({exc})") from None
    keys = ("num_sequences", "dtype", "files", "scales")
    missing = [k for k in keys if not isinstance(meta, dict) or k not in meta]
    require(not missing, f"{path} lacks {', '.join(map(repr, missing))}: Time-MoE's meta.json has {', '.join(keys)}")
    dtype = meta["dtype"]
    require(dtype in TIME_MOE_DTYPES, f"{path}: dtype {dtype!r} is not one this reader knows "
                                      f"({', '.join(TIME_MOE_DTYPES)})")
    dtype = np.dtype(dtype).newbyteorder("<")  # Time-MoE writes with ndarray.tofile on little-endian machines
    require(isinstance(meta["files"], dict) and meta["files"],
            f"{path}: 'files' must map each data-<i>-of-<n>.bin to its number of values")
    numbered = []
    for name, count in meta["files"].items():
        match = TIME_MOE_FILE.fullmatch(name)
        require(match and isinstance(count, int) and count >= 0,
                f"{path}: 'files' entry {name!r}: {count!r} is not data-<i>-of-<n>.bin: <number of values>")
        numbered.append((int(match.group(1)), name, count))
    numbered.sort()  # by <i>, as Time-MoE orders them (not by name: data-10 comes after data-9)
    require(len({i for i, _, _ in numbered}) == len(numbered), f"{path}: two files in 'files' have the same number")
    files = []
    for _, name, count in numbered:
        bin_path = os.path.join(folder, name)
        require(os.path.isfile(bin_path), f"{path} names {name}, which is missing from {folder}; download it again")
        size = os.path.getsize(bin_path)
        require(size == count * dtype.itemsize,
                f"{bin_path} holds {size} bytes, {path} says {count} {dtype.name} values ({count * dtype.itemsize} "
                "bytes); download it again")
        files.append((bin_path, count))
    scales = meta["scales"]
    require(isinstance(scales, list) and len(scales) == meta["num_sequences"],
            f"{path}: 'scales' lists {len(scales) if isinstance(scales, list) else 'no'} sequences, "
            f"'num_sequences' says {meta['num_sequences']}")
    try:  # scales are dicts; one pass per field, no per-sequence Python objects kept
        offsets = _whole_numbers(map(operator.itemgetter("offset"), scales), "offset", path)
        lengths = _whole_numbers(map(operator.itemgetter("length"), scales), "length", path)
    except TypeError:
        raise UserError(f"{path}: every entry of 'scales' must be an object with offset and length") from None
    total = sum(count for _, count in files)
    past = np.flatnonzero(offsets + lengths > total)
    if past.size:
        raise UserError(f"{path}: sequence {past[0]} (offset {offsets[past[0]]}, length {lengths[past[0]]}) ends past "
                        f"the {total} values its .bin files hold")
    mean = std = None
    if any("mean" in s and "std" in s for s in scales):  # stored normalised: Time-MoE returns x * std + mean
        mean, std = (np.fromiter((s[key] if "mean" in s and "std" in s else np.nan for s in scales), np.float64,
                                 len(scales)) for key in ("mean", "std"))
    return files, dtype, offsets, lengths, mean, std, hashlib.blake2b(raw, digest_size=8).hexdigest()


def train_statistics(values):
    """(mean, std) of one series' training values (float64), bit for bit what the build gets from
    sklearn's StandardScaler fitted on them as a column (its two-pass algorithm with its correction
    term, and std 1 for a series its bound calls constant); tests/test_corpus.py holds it to that."""
    if not len(values):
        return 0.0, 1.0  # no training rows: unscaled, as the build leaves such a series
    column = values[:, None]
    n = np.float64(len(values))
    total = np.sum(column, axis=0)
    mean = (0.0 + total) / n
    deviations = column - total / n
    correction = np.sum(deviations, axis=0)
    deviations **= 2
    variance = (np.sum(deviations, axis=0) - correction ** 2 / n) / n
    eps = np.finfo(np.float64).eps
    constant = variance <= n * eps * variance + (n * mean * eps) ** 2
    return float(mean[0]), 1.0 if constant[0] else float(np.sqrt(variance)[0])


class TimeMoEData(CorpusData):
    """Time-MoE's binary layout (Time-300B), memory-mapped as it is: every sequence of meta.json's
    'scales' is a series, split 70/10/20 and (with --scale) scaled with the statistics of its own
    training part, which are computed the first time one of its windows is read."""

    series_transform = True

    def __init__(self, root, folders, scale):
        self.folder, self.scale = root, bool(scale)
        self.files, counts, starts, lengths, means, stds, self.metas, self.file_names = [], [], [], [], [], [], [], []
        self.paths = []
        self.dtype, base = None, 0
        for folder in folders:
            files, dtype, offsets, length, mean, std, digest = read_meta(folder)
            require(self.dtype is None or self.dtype == dtype,
                    f"{os.path.join(folder, META)}: dtype {dtype.name}, but {os.path.join(folders[0], META)} has "
                    f"{self.dtype.name if self.dtype is not None else ''}; give folders of one dtype")
            self.dtype = dtype
            for path, count in files:
                self.files.append(np.memmap(path, dtype=dtype, mode="r") if count else np.zeros(0, dtype))
                self.paths.append(path)
                counts.append(count)
                self.file_names.append((os.path.relpath(path, root), count))
            starts.append(base + offsets)
            lengths.append(length)
            n = len(length)
            means.append(np.full(n, np.nan) if mean is None else mean)
            stds.append(np.full(n, np.nan) if std is None else std)
            self.metas.append(digest)
            base += sum(count for _, count in files)
        self.file_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.counts = counts
        self.start = np.concatenate(starts).astype(np.int64)
        length = np.concatenate(lengths).astype(np.int64)
        n_train, n_test = (length * 0.7).astype(np.int64), (length * 0.2).astype(np.int64)  # splits.split_ends
        self.ends = np.stack([n_train, length - n_test, length], axis=1)
        stored_mean, stored_std = np.concatenate(means), np.concatenate(stds)
        self.stored = None  # Time-MoE's own normalisation, in the files' dtype as its reader computes it
        if not np.isnan(stored_mean).all():
            self.stored = (stored_mean.astype(self.dtype.newbyteorder("=")),
                           stored_std.astype(self.dtype.newbyteorder("=")))
        # this codebase's scaler of each series, from its training part: NaN until first read
        self.mean = np.full(len(length), np.nan) if self.scale else None
        self.std = np.full(len(length), np.nan) if self.scale else None
        self.index = {"layout": "time-moe", "folders": len(folders)}

    def series_start(self):
        return self.start

    def content(self):
        """meta.json's digests, the files' names and sizes and the series table: the content, without
        reading the values."""
        return [("layout", "time-moe"), ("scaled", self.scale), ("metas", tuple(self.metas)),
                ("files", tuple(self.file_names)), ("start", self.start), ("ends", self.ends)]

    def series_values(self, i, stop):
        """Series i's first `stop` values as Time-MoE's reader gives them (x * std + mean when its
        meta.json stores the series normalised), in the files' dtype."""
        values = self.points(int(self.start[i]), int(self.start[i]) + int(stop)).astype(self.dtype.newbyteorder("="))
        return self._unnormalised(values[None], np.array([i]))[0]

    def _unnormalised(self, values, series):
        if self.stored is not None:
            mean, std = self.stored[0][series], self.stored[1][series]
            has = ~np.isnan(mean)
            values[has] = values[has] * std[has, None] + mean[has, None]
        return values

    def statistics(self, series):
        """Mean and std of each series in `series` (unique ids): those not yet computed are computed
        now from the series' training part (read once per process)."""
        for i in series[np.isnan(self.mean[series])]:
            mean, std = train_statistics(self.series_values(i, self.ends[i, 0]).astype(np.float64))
            self.mean[i], self.std[i] = mean, std
        return self.mean[series], self.std[series]

    def finish(self, values, series):
        values = self._unnormalised(values.astype(self.dtype.newbyteorder("="), copy=False), series)
        if not self.scale:
            return values.astype(POINT, copy=False)
        unique, where = np.unique(series, return_inverse=True)
        mean, std = self.statistics(unique)
        # as the build: StandardScaler.transform in float64, then float32
        return ((values.astype(np.float64) - mean[where, None]) / std[where, None]).astype(POINT)


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
                f"the {flag} split of corpus {data.folder} has at most {int((stop - start).max(initial=0))} rows per "
                f"series, fewer than the {window.span} one window needs (seq_len {window.x_len} + horizon); shorten "
                "--seq_len/--pred_len or add longer series")
        self.data, self.window, self.split, self.with_marks = data, window, flag, with_marks
        self.first_row = data.series_start()[keep] + start[keep]  # global position
        self.series = np.flatnonzero(keep) if data.series_transform else None
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
        values = self.data.read(first, self.window.span)
        return self.data.finish(values, None if self.series is None else self.series[series])

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

    def require_unchanged(self):
        """For the loaders: after a loader worker died (data_provider.windows), whether a value file changed."""
        self.data.require_unchanged()


def prepare_corpus(args):
    require(args.features != "MS", "--data corpus holds univariate series, so there are no covariates for "
                                   "--features MS; use --features S")
    data = open_corpus(args.root_path, args.scale)
    if isinstance(data, TimeMoEData):
        return data  # scaled as it is read, as --scale says
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
    p_build.add_argument("--column", default=None,
                         help=".parquet/.arrow sources: the list column whose rows are the series (default: 'target', "
                              "else the only list column)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        index = build(args.out_dir, args.sources, args.shard_mb, args.scale, column=args.column)
    except UserError as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"corpus {args.out_dir}: {len(index['series'])} series, {index['points']} points in {len(index['shards'])} "
          f"shard(s) from {index['sources']} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
