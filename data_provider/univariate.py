"""`--data univariate`: pre-training data in the manner of OpenLTM's channel-independent sets (UTSD).

Every channel of every file that `--data_path` (a glob under `--root_path`, `**` recurses)
matches is a series of its own. Each series is split in time (70 / 10 / 20 %, or the ETT
borders for a file named ETTh1, ETTh2, ETTm1 or ETTm2), scaled with a StandardScaler fitted
on its own training rows, and cut into windows separately: no window runs from one series
into the next. Windows have one channel and no time features (files differ in frequency).

A split's series lie end to end in one tensor, next to the index of every valid window
start, so a batch is still one gather per tensor (data_provider.selection.WindowSelection).
"""
import glob
import os

import numpy as np

from data_provider.data_loader import SPLITS, WindowDataset, _read_file, split_ends
from data_provider.scaler import StandardScaler
from data_provider.selection import WindowSelection
from utils.errors import UserError, require

UNIVARIATE = "univariate"
SUFFIXES = (".csv", ".txt", ".txt.gz", ".npy")  # what data_loader's readers understand


def matching_files(root_path, pattern):
    """The data files under `root_path` that the glob `pattern` names, sorted."""
    paths = sorted(p for p in glob.glob(os.path.join(root_path, pattern), recursive=True) if os.path.isfile(p))
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


class UnivariateData:
    """Every series of a corpus, scaled, with its own train/val/test borders."""

    columns = ["value"]  # one channel: enc_in = c_out = 1

    def __init__(self, series, ends, names):
        self.series = series  # list of float32 [T_i] arrays
        self.ends = ends  # row where train, val, test end, per series
        self.names = names  # "file:column", per series
        self.marks = np.zeros((0, 0), dtype=np.float32)  # no time features

    def window_dataset(self, flag, window):
        """Every window of split `flag` of every series, as one data set."""
        i = SPLITS.index(flag)
        pieces, starts, offset, longest = [], [], 0, 0
        for values, ends in zip(self.series, self.ends):
            # val and test start x_len rows early: their first window has a full history
            piece = values[(0 if i == 0 else max(ends[i - 1] - window.x_len, 0)):ends[i]]
            longest = max(longest, len(piece))
            n = len(piece) - window.span + 1
            if n > 0:  # a series too short for this split adds nothing (UTSD skips such files too)
                pieces.append(piece)
                starts.append(np.arange(offset, offset + n))
                offset += len(piece)
        if not pieces:
            raise UserError(
                f"no series of --data univariate has a {flag} split as long as one window ({window.span} rows: "
                f"seq_len {window.x_len} + horizon); the longest has {longest}; shorten --seq_len/--pred_len "
                "or add longer series")
        values = np.concatenate(pieces)[:, None]
        every_position = WindowDataset(values, np.zeros((len(values), 0), dtype=np.float32), window, flag)
        return WindowSelection(every_position, np.concatenate(starts))


def prepare_univariate(args):
    """Read every matched file; split and scale each of its channels as a series of its own."""
    require(args.features != "MS", "--data univariate makes every channel a series of its own, so there are no "
                                   "covariates for --features MS; use --features S")
    series, ends, names = [], [], []
    for path in matching_files(args.root_path, args.data_path):
        table = _read_file(path, os.path.getmtime(path))
        values, file_ends = table.values, _file_ends(path, len(table.values))
        if args.scale and file_ends[0] > 0:
            # StandardScaler treats columns independently: each series gets its own training statistics
            values = StandardScaler().fit(values[:file_ends[0]]).transform(values)
        for c, column in enumerate(table.columns):
            series.append(np.ascontiguousarray(values[:, c], dtype=np.float32))
            ends.append(file_ends)
            names.append(f"{os.path.relpath(path, args.root_path)}:{column}")
    return UnivariateData(series, ends, names)
