"""Reading a data file (CSV, raw text, gzipped text, .npy) or the built-in synthetic data into a Table."""
import functools
import gzip
import logging
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from data_provider.synthetic import make_synthetic
from utils import distributed
from utils.errors import UserError, require

logger = logging.getLogger("tsl")


@dataclass
class Table:
    """A data file as read: numeric values, column names, timestamps (or None)."""

    values: np.ndarray  # [T, C] float64
    columns: list
    dates: pd.Series = None


def _read_raw_text(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        first = f.readline()
    sep = "," if "," in first else r"\s+"
    return pd.read_csv(path, header=None, sep=sep)


def _is_number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def _frame_to_table(frame, path):
    require(len(frame) > 0, f"{path} has a header but no data rows; check the file")
    dates = None
    if "date" in frame.columns:
        dates = _parse_dates(frame["date"], path)
        frame = frame.drop(columns=["date"])
    require(frame.shape[1] > 0, f"{path} has no numeric columns, only 'date'; check the file")
    for col in frame.columns:
        if not pd.api.types.is_numeric_dtype(frame[col]):
            bad = frame[col][pd.to_numeric(frame[col], errors="coerce").isna() & frame[col].notna()]
            raise UserError(
                f"{path}: column '{col}' is not numeric (e.g. {bad.iloc[0]!r} in row {bad.index[0] + 1}); "
                "clean the file or drop the column"
            )
    values = frame.to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        counts = bad.sum(axis=0)
        cols = ", ".join(f"'{c}' ({n})" for c, n in zip(frame.columns, counts) if n)
        raise UserError(f"{path}: NaN or infinite values in column(s) {cols}; fill or drop them before training")
    return Table(values=values, columns=[str(c) for c in frame.columns], dates=dates)


def _first_unparsable(column):
    """The first value pandas cannot read, and its row (pandas explains over several lines without
    the row), or None when no single value is to blame (mixed time zones fail even when coerced)."""
    try:
        failed = pd.to_datetime(column, errors="coerce").isna() & column.notna()
    except (ValueError, TypeError, OverflowError):
        return None
    return f"{column[failed].iloc[0]!r} in row {failed.idxmax() + 1}" if failed.any() else None


def _parse_dates(column, path):
    """Timestamps in increasing order. Rows are the model's steps, so a row out of order is
    refused (sorting could hide a mangled file); a repeated timestamp is allowed, with one warning."""
    try:
        dates = pd.to_datetime(column)
    except (ValueError, TypeError, OverflowError) as exc:
        where = _first_unparsable(column) or str(exc).splitlines()[0]
        raise UserError(f"{path}: the 'date' column cannot be parsed as timestamps ({where}); "
                        "fix the column or remove it") from None
    missing = dates.isna()
    require(not missing.any(), f"{path}: the 'date' column is empty in row {missing.idxmax() + 1} "
                               f"({missing.sum()} row(s) in all); fill in the dates or remove the column")
    stamps = dates.to_numpy()
    backwards = np.flatnonzero(stamps[1:] < stamps[:-1])
    if len(backwards):
        row = backwards[0] + 1  # 0-based index of the first row earlier than the row before it
        raise UserError(f"{path}: dates are not increasing: row {row + 1} ({dates.iloc[row]}) comes after row {row} "
                        f"({dates.iloc[row - 1]}); sort the file by its 'date' column")
    repeats = np.flatnonzero(stamps[1:] == stamps[:-1])
    if len(repeats) and distributed.env_rank() == 0:  # every rank reads the file: warn once
        row = repeats[0] + 1
        logger.warning(f"{path}: {len(repeats)} row(s) repeat the timestamp before them, the first row "
                       f"{row + 1} ({dates.iloc[row]}); each row still counts as one step, so drop or merge them "
                       "if they are not")
    return dates


@functools.lru_cache(maxsize=8)
def _read_file(path, mtime):
    """Read a data file once per process (train/val/test share it)."""
    del mtime  # only part of the cache key, so an edited file is re-read
    try:
        if path.endswith(".npy"):
            array = np.load(path)
            array = array[:, None] if array.ndim == 1 else array
            require(array.ndim == 2, f"{path}: expected a [time, channels] array, got shape {array.shape}")
            return _frame_to_table(pd.DataFrame(array, columns=[str(i) for i in range(array.shape[1])]), path)
        if path.endswith((".txt", ".txt.gz")):
            frame = _read_raw_text(path)
        else:
            frame = pd.read_csv(path)
            if all(_is_number(c) for c in frame.columns):  # a CSV without a header row
                frame = pd.read_csv(path, header=None)
        frame.columns = [str(c) for c in frame.columns]
    except pd.errors.EmptyDataError:
        raise UserError(f"{path} is empty; point --root_path/--data_path at a file with data") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    return _frame_to_table(frame, path)


def read_table(args):
    """The Table that --data (synthetic or a file under --root_path) names."""
    if args.data == "synthetic":
        frame = make_synthetic(rows=args.synthetic_rows, channels=args.synthetic_channels, seed=args.synthetic_seed)
        return _frame_to_table(frame, "synthetic data")
    path = os.path.join(args.root_path, args.data_path)
    require(os.path.isfile(path), f"data file not found: {path}; set --root_path and --data_path (or use --data synthetic)")
    return read_file(path)


def read_file(path):
    """The Table of one file, read once per process while the file is unchanged."""
    return _read_file(path, os.path.getmtime(path))


def read_file_once(path):
    """The Table of one file, not kept: for reading many files one after another (a corpus build)."""
    return _read_file.__wrapped__(path, None)

