"""Reading a data set once, splitting it, scaling it, and cutting windows from it.

A split lives as one contiguous tensor; a window is a slice of it, and a batch of
windows is gathered in one indexing operation (`__getitems__`), so the DataLoader does
no per-window Python work and no collation.
"""
import functools
import gzip
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from data_provider.scaler import StandardScaler
from data_provider.synthetic import make_synthetic
from data_provider.timefeatures import time_features
from utils.errors import UserError, require

SPLITS = ("train", "val", "test")

# Fixed borders of the ETT benchmark (12/4/4 months); minute data has 4 rows per hour.
_ETT_MONTH_HOURS = 30 * 24
_ETT_ROWS_PER_HOUR = {"ETTh1": 1, "ETTh2": 1, "ETTm1": 4, "ETTm2": 4}
DATASETS = tuple(_ETT_ROWS_PER_HOUR) + ("custom", "synthetic")


@dataclass
class Table:
    """A data file as read: numeric values, column names, timestamps (or None)."""

    values: np.ndarray  # [T, C] float64
    columns: list
    dates: pd.Series = None


# ---------------------------------------------------------------- reading files
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
    dates = None
    if "date" in frame.columns:
        try:
            dates = pd.to_datetime(frame["date"])
        except (ValueError, TypeError) as exc:
            raise UserError(f"{path}: the 'date' column cannot be parsed as timestamps ({exc}); fix the column or remove it") from None
        frame = frame.drop(columns=["date"])
    require(frame.shape[1] > 0 and len(frame) > 0, f"{path} has no numeric data rows; check the file")
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
    if args.data == "synthetic":
        frame = make_synthetic(rows=args.synthetic_rows, channels=args.synthetic_channels, seed=args.synthetic_seed)
        return _frame_to_table(frame, "synthetic data")
    path = os.path.join(args.root_path, args.data_path)
    require(os.path.isfile(path), f"data file not found: {path}; set --root_path and --data_path (or use --data synthetic)")
    return _read_file(path, os.path.getmtime(path))


# ---------------------------------------------------------------- splitting
def split_ends(data, total_rows):
    """Row where each of train, val, test ends."""
    if data in _ETT_ROWS_PER_HOUR:
        unit = _ETT_MONTH_HOURS * _ETT_ROWS_PER_HOUR[data]
        ends = [12 * unit, 16 * unit, 20 * unit]
        require(total_rows >= ends[-1], f"{data} needs at least {ends[-1]} rows, the file has {total_rows}; use --data custom for other files")
        return ends
    n_train = int(total_rows * 0.7)
    n_test = int(total_rows * 0.2)
    return [n_train, total_rows - n_test, total_rows]


@dataclass
class Window:
    """Where a window's input and target lie, relative to the window's first row."""

    x_len: int
    y_offset: int
    y_len: int

    @property
    def span(self):
        return max(self.x_len, self.y_offset + self.y_len)


@dataclass
class PreparedData:
    """All three splits of one data set, scaled with the training rows' statistics."""

    values: np.ndarray  # [T, C] float32, scaled, target last
    marks: np.ndarray  # [T, F] float32 time features (F = 0 without dates)
    columns: list
    scaler: StandardScaler
    dates: pd.Series
    ends: list  # row where train, val, test end

    def split_rows(self, split, history):
        """(start, stop) rows of a split. Val and test start `history` rows before their
        border so their first window has a full input (the benchmark convention)."""
        i = SPLITS.index(split)
        start = 0 if i == 0 else max(self.ends[i - 1] - history, 0)
        return start, self.ends[i]


def select_columns(table, features, target):
    """Columns in model order: target alone (S) or every column with the target last (M, MS)."""
    columns = table.columns
    if target is None:
        target = "OT" if "OT" in columns else columns[-1]
    require(target in columns, f"--target '{target}' is not a column of the data; columns are: {', '.join(columns)}")
    require(features in ("M", "S", "MS"), f"unknown --features '{features}'; use M, S or MS")
    if features == "S":
        order = [target]
    else:
        require(features != "MS" or len(columns) > 1, "--features MS needs covariates, but the data has a single column; use --features S")
        order = [c for c in columns if c != target] + [target]
    index = [columns.index(c) for c in order]
    return table.values[:, index], order


def prepare(args):
    """Read, select columns, fit the scaler on the training rows only, add time features."""
    table = read_table(args)
    values, columns = select_columns(table, args.features, args.target)
    ends = split_ends(args.data, len(values))
    scaler = StandardScaler()
    if args.scale:
        scaler.fit(values[: ends[0]])
        values = scaler.transform(values)
    if table.dates is not None:
        marks = time_features(table.dates, args.freq, args.embed)
    else:
        marks = np.zeros((len(values), 0), dtype=np.float32)
    return PreparedData(values.astype(np.float32), marks, columns, scaler, table.dates, ends)


# ---------------------------------------------------------------- windows
class WindowDataset(Dataset):
    """Every window of one split: item i is (x, y, x_mark, y_mark) starting at row i."""

    def __init__(self, values, marks, window, split, with_marks=True):
        self.window = window
        self.split = split
        self.with_marks = with_marks  # False: batches carry None for the marks (a model that reads none)
        self.n_windows = len(values) - window.span + 1
        self._store(torch.from_numpy(np.ascontiguousarray(values)), torch.from_numpy(np.ascontiguousarray(marks)))

    def _store(self, data, marks):
        self.data, self.marks = data, marks
        # [n_windows, length, C] views of the series (no copy) for the input and the target
        # part of every window: a batch is one gather per tensor, contiguous as gathered.
        w, n = self.window, len(self)

        def windows(series, offset, length):
            return series[offset:].unfold(0, length, 1).transpose(1, 2)[:n] if n else None

        self._parts = (windows(data, 0, w.x_len), windows(data, w.y_offset, w.y_len))
        self._parts += ((windows(marks, 0, w.x_len), windows(marks, w.y_offset, w.y_len)) if self.with_marks
                        else (None, None))

    def __len__(self):
        return max(self.n_windows, 0)

    def to(self, device):
        """Keep the split on `device` (a GPU): batches are then gathered there."""
        self._store(self.data.to(device), self.marks.to(device))
        return self

    def __getitems__(self, indices):
        """A whole batch in one gather: [B, x_len, C], [B, y_len, C] and their marks."""
        starts = torch.as_tensor(indices, dtype=torch.long, device=self.data.device)
        return tuple(None if part is None else part[starts] for part in self._parts)

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(index)
        return tuple(None if t is None else t[0] for t in self.__getitems__([index]))
