"""`--data univariate`: pre-training data in the manner of OpenLTM's channel-independent sets (UTSD).

Every channel of every file that `--data_path` (a glob under `--root_path`, `**` recurses)
matches is a series of its own. Each series is split in time (70 / 10 / 20 %, or the ETT
borders for a file named ETTh1, ETTh2, ETTm1 or ETTm2), scaled with a StandardScaler fitted
on its own training rows, and cut into windows separately: no window runs from one series
into the next. Windows have one channel and no time features (files differ in frequency).

A split's series lie end to end in one tensor, next to the index of every valid window
start, so a batch is still one gather per tensor (data_provider.windows.WindowSelection).
"""
import glob
import os

import numpy as np

from data_provider.files import read_file
from data_provider.interface import ForecastData
from data_provider.openltm_data import OPENLTM_DATA, ends_of_file
from data_provider.splits import SPLITS, split_ends, split_start
from data_provider.windows import WindowDataset, WindowSelection
from utils.errors import UserError, require

UNIVARIATE = "univariate"
SUFFIXES = (".csv", ".txt", ".txt.gz", ".npy")  # what data_provider.files reads


def matching_files(root_path, pattern, data="univariate"):
    """The data files under `root_path` that the glob `pattern` names, sorted."""
    paths = sorted(p for p in glob.glob(os.path.join(root_path, pattern), recursive=True) if os.path.isfile(p))
    if data != UNIVARIATE:  # OpenLTM's names: the files are --data_path, or all of one type under --root_path
        require(paths, f"--data {data} reads '{pattern}' under --root_path {root_path}, which matches no file")
    require(paths, f"--data_path '{pattern}' matches no file under {root_path}; with --data univariate it is a "
                   "glob relative to --root_path, e.g. '*.csv' or '**/*.npy'")
    others = [p for p in paths if not p.endswith(SUFFIXES)]
    if others:
        raise UserError(f"--data univariate reads {', '.join(SUFFIXES)} files, but --data_path '{pattern}' also "
                        f"matches {others[0]} ({len(others)} such file(s)); narrow the glob, e.g. '*.csv'")
    return paths


def _file_ends(path, rows):
    stem = os.path.basename(path).split(".")[0]  # ETTh1.csv -> ETTh1, as OpenLTM decides
    try:
        return split_ends(stem, rows)
    except UserError:
        raise UserError(f"{path} is named like an ETT file, so it gets the ETT borders, but it has only {rows} "
                        "rows; rename it to get the 70/10/20 split") from None


class UnivariateData(ForecastData):
    """Every series of a corpus, scaled, with its own train/val/test borders."""

    columns = ["value"]  # one channel: enc_in = c_out = 1
    mark_dim = 0  # no time features: files differ in frequency
    scaler = None  # one per series, none for the whole corpus
    per_series_scaling = True
    constant_memory_shuffle = True
    dates = None

    def __init__(self, series, ends):
        self.series = series  # list of float32 [T_i] arrays
        self.ends = ends  # row where train, val, test end, per series

    def content(self):
        return [*(("series", series) for series in self.series), ("ends", tuple(map(tuple, self.ends)))]

    def nbytes(self):
        """What the splits take on a GPU: the float32 values and, beside them, the int64 start of every window
        (WindowSelection.indices), at most one a row in each split: 12 bytes a row, 3x the values alone."""
        return sum(len(values) for values in self.series) * (4 + 8)

    def window_dataset(self, flag, window, with_marks=True):
        """Every window of split `flag` of every series, as one data set."""
        i = SPLITS.index(flag)
        pieces, starts, offset, longest = [], [], 0, 0
        for values, ends in zip(self.series, self.ends):
            # val and test start x_len rows early: their first window has a full history
            piece = values[split_start(ends, flag, window.x_len):ends[i]]
            longest = max(longest, len(piece))
            n = len(piece) - window.span + 1
            if n > 0:  # a series too short for this split adds nothing (UTSD skips such files too)
                pieces.append(piece)
                starts.append(np.arange(offset, offset + n))
                offset += len(piece)
        if not pieces:
            raise UserError(
                f"the {flag} split of univariate has at most {longest} rows per series, fewer than the {window.span} "
                f"one window needs (seq_len {window.x_len} + horizon); shorten --seq_len/--pred_len or add longer series")
        values = np.concatenate(pieces)[:, None]
        every_position = WindowDataset(values, np.zeros((len(values), 0), dtype=np.float32), window, flag,
                                       with_marks=with_marks)
        return WindowSelection(every_position, np.concatenate(starts))

    def series_histories(self, flag, window, original=False):
        """Each series with a window in the split: its rows before the split's first forecast step (scaled:
        a corpus has no one original scale)."""
        if original:
            return None
        i = SPLITS.index(flag)
        histories, series = [], []
        for values, ends in zip(self.series, self.ends):
            start = split_start(ends, flag, window.x_len)
            n = ends[i] - start - window.span + 1
            if n > 0:  # as window_dataset: a series too short for the split has no window
                series.append(np.full(n, len(histories), dtype=np.int64))
                histories.append(np.asarray(values[:start + window.x_len], dtype=np.float64)[:, None])
        return histories, np.concatenate(series) if series else np.zeros(0, dtype=np.int64)

    def forecast_date(self, flag, window, i):
        return None  # undated: files differ in frequency

    def future_input(self, window, freq, embed):
        raise UserError("--do_predict forecasts one data set on its original scale; --data univariate scales every "
                        "series on its own, so there is no single original scale (nor a single series) to forecast; "
                        "use --data custom on one file")


def scaled_series(path, values, scale=True, ends=None):
    """Each channel of one file's [T, C] values as a series of its own: a list of (float32 values,
    split ends, mean, std), scaled with the file's training rows' statistics (StandardScaler treats
    columns independently, so each series gets its own); mean 0 and std 1 when not scaled. `ends`:
    where the splits end (default: ETT borders for a file named like an ETT file, else 70/10/20)."""
    ends = ends or _file_ends(path, len(values))
    mean, std = np.zeros(values.shape[1]), np.ones(values.shape[1])
    if scale and ends[0] > 0:
        # imported here: sklearn.preprocessing costs about a second, paid only by a process that reads data
        from sklearn.preprocessing import StandardScaler

        scaler = StandardScaler().fit(values[:ends[0]])
        values, mean, std = scaler.transform(values), scaler.mean_, scaler.scale_
    return [(np.ascontiguousarray(values[:, c], dtype=np.float32), ends, float(mean[c]), float(std[c]))
            for c in range(values.shape[1])]


def prepare_univariate(args):
    """Read every matched file; split and scale each of its channels as a series of its own. OpenLTM's
    univariate data sets (data_provider/openltm_data.py) name their files and split them their way."""
    require(args.features != "MS", f"--data {args.data} makes every channel a series of its own, so there are no "
                                   "covariates for --features MS; use --features S")
    openltm = OPENLTM_DATA.get(args.data)
    pattern = openltm.files if openltm and openltm.files else args.data_path
    series, ends = [], []
    for path in matching_files(args.root_path, pattern, args.data):
        values = read_file(path, getattr(args, "date_format", None), dates_used=False).values
        file_ends = None
        if openltm:
            values = values[:, :max(int(values.shape[1] * openltm.column_share), 1)]
            file_ends = ends_of_file(openltm, path, len(values))
        for values, file_ends, _, _ in scaled_series(path, values, args.scale, file_ends):
            series.append(values)
            ends.append(file_ends)
    return UnivariateData(series, ends)
