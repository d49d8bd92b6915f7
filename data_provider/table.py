"""The table data (--data ETTh1..ETTm2, custom, synthetic): one multivariate series with its
columns in model order, split at fixed borders, scaled with the training rows' statistics."""
import logging
import os

import numpy as np
import pandas as pd

from data_provider.files import read_table
from data_provider.interface import ForecastData
from data_provider.openltm_data import OPENLTM_DATA, ends_of_file
from data_provider.splits import ETT_DATASETS, SPLITS, split_ends, split_start
from data_provider.timefeatures import freq_offset, future_dates, time_features
from data_provider.windows import WindowDataset
from utils.errors import UserError, require

DATASETS = ETT_DATASETS + ("custom", "synthetic")

logger = logging.getLogger("tsl")


class TableData(ForecastData):
    """All three splits of one data set, scaled with the training rows' statistics."""

    per_series_scaling = False

    def __init__(self, name, values, marks, columns, scaler, dates, ends, original=None):
        self.name = name  # --data, for messages
        self.values = values  # [T, C] float32, scaled, target last
        # [T, k] float64: the file's own values of the last k (scored) columns, kept for --inverse's
        # truths (float32 scaled values are 1e-8 off at an offset of 1e8); None without --inverse
        self.original = original
        self.marks = marks  # [T, F] float32 time features (F = 0 without dates)
        self.columns = columns
        self.scaler = scaler  # None with --scale false
        self.dates = dates
        self.ends = ends  # row where train, val, test end

    def content(self):
        return [("values", self.values), ("marks", self.marks), ("ends", tuple(self.ends))]

    @property
    def mark_dim(self):
        return self.marks.shape[1]

    def split_rows(self, split, history):
        """(start, stop) rows of a split; val and test start `history` rows early."""
        return split_start(self.ends, split, history), self.ends[SPLITS.index(split)]

    def window_dataset(self, flag, window, with_marks=True):
        start, stop = self.split_rows(flag, window.x_len)
        original = None if self.original is None else self.original[start:stop]
        dataset = WindowDataset(self.values[start:stop], self.marks[start:stop], window, flag, with_marks=with_marks,
                                original=original)
        if len(dataset) == 0:
            raise UserError(
                f"the {flag} split of {self.name} has {stop - start} rows, fewer than the {window.span} "
                f"one window needs (seq_len {window.x_len} + horizon); shorten --seq_len/--pred_len or use a longer series")
        return dataset

    def series_histories(self, flag, window, original=False):
        """One series (the table), its rows before the split's first forecast step."""
        start, stop = self.split_rows(flag, window.x_len)
        values = self.original if original else self.values
        if values is None:
            return None
        n = max(stop - start - window.span + 1, 0)  # the split's windows, as window_dataset cuts them
        return [np.asarray(values[:start + window.x_len], dtype=np.float64)], np.zeros(n, dtype=np.int64)

    def forecast_date(self, flag, window, i):
        if self.dates is None:
            return None
        return self.dates.iloc[self.split_rows(flag, window.x_len)[0] + i + window.x_len]

    def future_input(self, window, freq, embed):
        horizon = window.y_offset + window.y_len - window.x_len  # rows past the end: pred_len / test_pred_len
        require(len(self.values) >= window.x_len,
                f"--do_predict needs the last {window.x_len} rows as input; the data has {len(self.values)}")
        if self.dates is not None:
            last = self.dates.iloc[-1]
            index = future_dates(last, freq, horizon).rename("date")
            if len(self.dates) > 1 and self.dates.iloc[-2] != last - freq_offset(freq):
                logger.warning(f"the data's last two dates are {self.dates.iloc[-2]} and {last}, which is not "
                               f"one --freq {freq} step; forecast.csv continues at --freq {freq} anyway")
            future_marks, last_row = time_features(index, freq, embed), f"{last}"
        else:
            index = pd.RangeIndex(1, horizon + 1, name="step")
            future_marks, last_row = np.zeros((horizon, self.mark_dim), dtype=np.float32), f"row {len(self.values)}"
        # The last input rows, then the future (values unknown: zeros, as TSLib's decoder input).
        values = np.concatenate([self.values[-window.x_len:], np.zeros((horizon, self.values.shape[1]), np.float32)])
        marks = np.concatenate([self.marks[-window.x_len:], future_marks.astype(np.float32)])
        return WindowDataset(values, marks, window, "future"), index, last_row


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


def prepare_table(args):
    """Read, select columns, fit the scaler on the training rows only, add time features."""
    table = read_table(args)
    values, columns = select_columns(table, args.features, args.target)
    openltm = OPENLTM_DATA.get(args.data)  # OpenLTM's MultivariateDatasetBenchmark splits by the file's name
    ends = ends_of_file(openltm, args.data_path, len(values)) if openltm else split_ends(args.data, len(values))
    original = None
    if getattr(args, "inverse", False):  # scored against the file's own values: the target's (a copy) with MS
        original = values[:, -1:].copy() if args.features == "MS" else values
    scaler = None
    if args.scale:
        # imported here: sklearn.preprocessing costs about a second, paid only by a process that reads data
        from sklearn.preprocessing import StandardScaler

        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, in one line
            scaler = StandardScaler().fit(values[: ends[0]])
        _require_scalable(scaler, values, columns, args)
        values = scaler.transform(values)
    if table.dates is not None:
        marks = time_features(table.dates, args.freq, args.embed)
    else:
        marks = np.zeros((len(values), 0), dtype=np.float32)
    return TableData(args.data, values.astype(np.float32), marks, columns, scaler, table.dates, ends, original)


def _require_scalable(scaler, values, columns, args):
    """A column whose squared deviations pass float64's 1.8e308 (values of about 1e154 and more) has an
    infinite variance: StandardScaler would leave it unscaled, and training would diverge."""
    too_large = [f"'{c}' (largest |value| {np.abs(values[:, i]).max():.3g})"
                 for i, c in enumerate(columns) if not (np.isfinite(scaler.mean_[i]) and np.isfinite(scaler.var_[i]))]
    require(not too_large,
            f"{os.path.join(args.root_path, args.data_path)}: column(s) {', '.join(too_large)} hold values too large "
            "to scale in float64 (their squares overflow past 1.8e308); rescale the column, e.g. divide it by a "
            "power of ten")
