"""Scoring a probabilistic forecast on the test split: each window's quantiles, MASE's per-series scales, and
the metrics' sums (utils.metrics.ProbabilisticSums) on the scaled data and, with --inverse, the original scale.

Exactness under DDP comes from what is keyed by the window, not by the process: a window's samples come from
its own stream (utils.probabilistic.window_keys, by its number in the split), and its MASE scale from its
series' history, computed once here from the data, not from the window's input or on one rank's share.
"""
import logging
import math
import re

import numpy as np
import torch

from data_provider.data_factory import prepared_data, split_numbering, window_for
from utils import distributed
from utils.errors import require
from utils.metrics import ProbabilisticSums, seasonal_error, seasonality, squared_seasonal_error
from utils.probabilistic import window_keys

logger = logging.getLogger("tsl")


def scored_channels(args, data):
    """How many of the data's columns are scored (the last ones): the target alone for MS and --covariate."""
    return 1 if args.features == "MS" or args.covariate else len(data.columns)


def series_scales(args, flag="test", original=False, squared=False):
    """[windows of the split, k] float64: each window's scored channels' MASE scale, the in-sample seasonal naive
    error of its series' history at the seasonality of --freq (`squared`: the mean squared seasonal difference,
    RMSSE's scale); None where the data keeps no history."""
    found = _scales_of_series(args, flag, original, squared)
    return None if found is None else torch.from_numpy(found[0][found[1]])


def _scales_of_series(args, flag, original, squared=False):
    """([S, k] each series' scored channels' scales, each window's series), or None without histories."""
    data = prepared_data(args)
    found = data.series_histories(flag, window_for(args, flag), original=original)
    if found is None:
        return None
    histories, series = found
    k = scored_channels(args, data)
    season = seasonality(args.freq)
    error = squared_seasonal_error if squared else seasonal_error
    per_series = np.stack([error(history[:, -k:], season, _series_name(data, i, args))
                           for i, history in enumerate(histories)])  # [S, k]
    return per_series, series


def zero_scales(args):
    """(names, count): the scored series of the test split (each scored channel of each series with a window)
    whose MASE scale is 0, a history that repeats itself at the season: gluonts' masked division leaves their
    elements out of MASE and MSIS (utils.metrics.ProbabilisticSums), and with all of them out the two are NaN."""
    found = _scales_of_series(args, "test", False)
    if found is None:
        return [], 0
    per_series, series = found
    data, used = prepared_data(args), np.unique(series)
    columns = list(data.columns)[-per_series.shape[1]:]
    several = len(getattr(data, "series", ())) > 1
    names = [(f"series {i + 1}" + (f" ({columns[c]})" if len(columns) > 1 else "")) if several
             else f"column {columns[c]}" for i in used for c in range(len(columns)) if per_series[i, c] == 0]
    return names, len(used) * len(columns)


def some(names, limit=3):
    """'a, b, c and 4 more': a list named in one line."""
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _series_name(data, i, args):
    if len(getattr(data, "series", ())) > 1:
        return f"series {i + 1} of --data {args.data} (before the test split)"
    return f"--data {args.data} (its rows before the test split, at --freq {args.freq})"


def check_mase_history(args):
    """Every series of the test split must hold more than one season of history: one line before anything
    runs (seasonal_error raises it, naming the series' length and the season)."""
    series_scales(args)


class ProbabilisticScoring:
    """Quantile forecasts of the test windows and the sums of every probabilistic metric."""

    def __init__(self, args, dataset, device, transform=None):
        self.args, self.device = args, device
        self.objective = args.objective  # the run's, built once (exp.settings.settle)
        self.median = self.objective.levels.index(0.5)
        self.numbers, _ = split_numbering(dataset)  # keys and scales follow the window's number in the split
        # the scales of the window at each position of the loader's data set, on the device: a batch's are
        # gathered there by its indices, nothing read back
        positions = torch.from_numpy(np.asarray(self.numbers, dtype=np.int64))
        self.scales = _at(series_scales(args), positions, device)
        self.sq_scales = _at(series_scales(args, squared=True), positions, device)  # RMSSE's
        self.sums = ProbabilisticSums(self.objective.levels, keep_windows=True)
        self.original = None
        if transform is not None:
            self.original = ProbabilisticSums(self.objective.levels, transform=transform, keep_windows=True)
            self.original_scales = _at(series_scales(args, original=True), positions, device)
            self.original_sq_scales = _at(series_scales(args, original=True, squared=True), positions, device)
        if self.scales is None:
            logger.info(f"MASE is not computed: --data {args.data} keeps no series history at hand")
        elif distributed.is_main():
            zero, scored = zero_scales(args)
            if 0 < len(zero) < scored:  # all of them: MASE is NaN, and exp.outputs.finite_metrics says why
                logger.warning(f"MASE and MSIS leave out {len(zero)} of the {scored} scored series, whose seasonal "
                               f"error (their scale, at season {seasonality(args.freq)}) is 0: {some(zero)} (a history "
                               "that repeats itself at the season), as gluonts and GIFT-Eval leave them out")
        self._all_windows = None  # after all_reduce, on rank 0: every window's own sums (window_columns)
        self.crossed = torch.zeros((), dtype=torch.int64, device=device)  # elements whose quantiles cross

    def update(self, params, true, indices, original_truth=None, positions=None):
        """Score one batch (`indices`: its windows' positions in the loader's data set, where the data is;
        `positions`: the same on the host, the loader's batch_positions, else read back from `indices`); returns
        the median."""
        keys = None
        if self.objective.samples:  # a window's samples are seeded by its number: a host value
            if positions is None:
                positions = indices.cpu() if torch.is_tensor(indices) else indices
            keys = window_keys(self.args.seed, "test", self.numbers[np.asarray(positions)])
        self.crossed += self.objective.crossed(params)  # before the rule (sorted, or as forecast) is applied
        quantiles = self.objective.quantiles(params, keys)
        where = (indices if torch.is_tensor(indices) else torch.as_tensor(np.asarray(indices, dtype=np.int64)))
        where = where.to(self.device, non_blocking=True)  # no copy where the batch was gathered on the device
        self.sums.update(quantiles, true, *_of(where, self.scales, self.sq_scales))
        if self.original is not None:
            self.original.update(quantiles, original_truth, *_of(where, self.original_scales, self.original_sq_scales))
        return quantiles[..., self.median]

    def all_reduce(self):
        """The global sums on every rank; every rank's window rows on rank 0, in rank order (as ErrorSums')."""
        self.sums.all_reduce()
        self.crossed = int(distributed.all_reduce_sum([float(self.crossed)])[0])
        if self.original is not None:
            self.original.all_reduce()
        local = torch.cat([_kept(self.sums, self.scales)]
                          + ([] if self.original is None else [_kept(self.original, self.original_scales)]), dim=1)
        gathered = distributed.gather_on_main(local)
        self._all_windows = None if gathered is None else torch.cat(gathered)
        return self

    def window_names(self):
        """The columns of window_columns: window_sums' fields, then with --inverse the same with _orig."""
        names = window_fields(self.objective.levels, self.scales is not None)
        if self.original is not None:
            names += [f"{name}_orig" for name in window_fields(self.objective.levels, self.original_scales is not None)]
        return names

    def window_columns(self):
        """(names, [windows, fields] float64 array): each test window's sums, every rank's on rank 0 after
        all_reduce (None on the others); window_errors.csv carries them (subset_metrics reads them back)."""
        if self._all_windows is None:
            return None
        return self.window_names(), self._all_windows.numpy()

    def metrics(self):
        """The probabilistic metrics; `quantiles_crossed`: how many scored elements (a step of a channel of a
        window) had a quantile above the next level's before `quantile_order` (the rule) was applied."""
        metrics = dict(self.sums.metrics(), quantiles_crossed=int(self.crossed), quantile_order=self.objective.order)
        if self.original is not None:
            metrics.update({f"{k}_orig": v for k, v in self.original.metrics().items()
                            if k not in ("wql_levels", "msis_alpha")})  # the same on either scale
        return metrics


def window_fields(levels, scaled):
    """What window_sums keeps of ProbabilisticSums' sums: all but the window counts (a row is one window);
    the scaled metrics' (MASE, MSIS, SQL, RMSSE) only where a scale was given."""
    sums = ProbabilisticSums(levels)
    return sums.window_fields() if scaled else [k for k in sums.window_fields() if k not in sums.scaled_fields()]


def _kept(sums, scales):
    """[windows, window_fields] of a ProbabilisticSums(keep_windows=True): adding rows gives the sums of any
    subset of windows, and its metrics exactly (subset_metrics); the scaled metrics' only where scaled."""
    scaled = sums.scaled_fields()
    keep = [i for i, name in enumerate(sums.window_fields()) if scales is not None or name not in scaled]
    return sums.window_sums()[:, keep]


def _of(where, scales, sq_scales):
    """The scales of the windows at positions `where` (each None where the data keeps no history)."""
    return (None if scales is None else scales[where]), (None if sq_scales is None else sq_scales[where])


def subset_metrics(columns, suffix=""):
    """The probabilistic metrics of a set of windows from their window_errors.csv columns ({name: values};
    `suffix` "_orig" for the original scale's), equal to what a run scoring those windows alone reports: the
    sums are added (math.fsum) and ProbabilisticSums turns them into metrics."""
    levels = sorted(float(m[1]) for m in (re.fullmatch(rf"ql([0-9.e-]+){suffix}", name) for name in columns) if m)
    require(levels, f"no ql<level>{suffix} columns: not a probabilistic run's window_errors.csv")
    sums = ProbabilisticSums(levels)
    windows = len(columns[f"count{suffix}"])
    sums.sums["windows"] = windows
    sums.sums["scaled_windows"] = windows if f"ase{suffix}" in columns else 0
    sums.sums["sq_scaled_windows"] = windows if f"sse{suffix}" in columns else 0  # older files: no RMSSE
    for field in window_fields(levels, f"ase{suffix}" in columns):
        if field + suffix in columns:  # a file written before SQL and RMSSE were scored has no sql, sse
            sums.sums[field] = math.fsum(columns[field + suffix])
    metrics = sums.metrics()
    return {k: v for k, v in metrics.items() if k != "sql" or f"sql{suffix}" in columns}


def _at(scales, positions, device):
    """[len(positions), k] scales of the windows at `positions` (their numbers), on `device`; None stays None."""
    return None if scales is None else scales[positions].to(device)
