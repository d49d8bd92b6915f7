"""Scoring a probabilistic forecast on the test split: each window's quantiles, MASE's per-series scales, and
the metrics' sums (utils.metrics.ProbabilisticSums) on the scaled data and, with --inverse, the original scale.

Exactness under DDP comes from what is keyed by the window, not by the process: a window's samples come from
its own stream (utils.probabilistic.window_keys, by its number in the split), and its MASE scale from its
series' history, computed once here from the data, not from the window's input or on one rank's share.
"""
import logging

import numpy as np
import torch

from data_provider.data_factory import prepared_data, split_numbering, window_for
from utils.metrics import ProbabilisticSums, seasonal_error, seasonality
from utils.probabilistic import objective_for, window_keys

logger = logging.getLogger("tsl")


def scored_channels(args, data):
    """How many of the data's columns are scored (the last ones): the target alone for MS and --covariate."""
    return 1 if args.features == "MS" or args.covariate else len(data.columns)


def series_scales(args, flag="test", original=False):
    """[windows of the split, k] float64: each window's scored channels' MASE scale, the in-sample seasonal naive
    error of its series' history at the seasonality of --freq; None where the data keeps no history."""
    data = prepared_data(args)
    found = data.series_histories(flag, window_for(args, flag), original=original)
    if found is None:
        return None
    histories, series = found
    k = scored_channels(args, data)
    season = seasonality(args.freq)
    per_series = np.stack([seasonal_error(history[:, -k:], season, _series_name(data, i, args))
                           for i, history in enumerate(histories)])  # [S, k]
    return torch.from_numpy(per_series[series])


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
        self.objective = objective_for(args)
        self.median = self.objective.levels.index(0.5)
        self.numbers, _ = split_numbering(dataset)  # keys and scales follow the window's number in the split
        self.scales = _on(series_scales(args), device)
        self.sums = ProbabilisticSums(self.objective.levels)
        self.original = None
        if transform is not None:
            self.original = ProbabilisticSums(self.objective.levels, transform=transform)
            self.original_scales = _on(series_scales(args, original=True), device)
        if self.scales is None:
            logger.info(f"MASE is not computed: --data {args.data} keeps no series history at hand")

    def update(self, params, true, indices, original_truth=None):
        """Score one batch (`indices`: its windows' positions in the loader's data set); returns the median."""
        numbers = self.numbers[np.asarray(indices.cpu() if torch.is_tensor(indices) else indices)]
        keys = window_keys(self.args.seed, "test", numbers) if self.objective.samples else None
        quantiles = self.objective.quantiles(params, keys)
        where = torch.as_tensor(numbers, device=self.device)
        self.sums.update(quantiles, true, None if self.scales is None else self.scales[where])
        if self.original is not None:
            scales = None if self.original_scales is None else self.original_scales[where]
            self.original.update(quantiles, original_truth, scales)
        return quantiles[..., self.median]

    def all_reduce(self):
        self.sums.all_reduce()
        if self.original is not None:
            self.original.all_reduce()
        return self

    def metrics(self):
        metrics = dict(self.sums.metrics())
        if self.original is not None:
            metrics.update({f"{k}_orig": v for k, v in self.original.metrics().items() if k != "wql_levels"})
        return metrics


def _on(tensor, device):
    return None if tensor is None else tensor.to(device)
