"""Forecast metrics from sums, so they can be added up across ranks exactly.

Each rank accumulates `ErrorSums` over its own windows; one all_reduce of the sums
gives the metrics of the whole set, identical to a single-process evaluation.
"""
import math

import torch

from utils import distributed

_FIELDS = ("count", "sq", "abs", "ape", "spe")


class ErrorSums:
    """Running float64 sums of squared, absolute and percentage errors."""

    def __init__(self):
        self.sums = dict.fromkeys(_FIELDS, 0.0)

    def update(self, pred, true):
        err = (pred.double() - true.double())
        rel = err / true.double()
        self.sums["count"] += err.numel()
        self.sums["sq"] += err.square().sum().item()
        self.sums["abs"] += err.abs().sum().item()
        self.sums["ape"] += rel.abs().sum().item()
        self.sums["spe"] += rel.square().sum().item()

    def all_reduce(self):
        """Sum over all ranks (every rank gets the global sums)."""
        totals = distributed.all_reduce_sum([self.sums[k] for k in _FIELDS])
        self.sums = dict(zip(_FIELDS, totals))
        return self

    def metrics(self):
        n = self.sums["count"]
        if n == 0:
            return dict.fromkeys(("mse", "mae", "rmse", "mape", "mspe"), float("nan"))
        mse = self.sums["sq"] / n
        return {
            "mse": mse,
            "mae": self.sums["abs"] / n,
            "rmse": math.sqrt(mse),
            "mape": self.sums["ape"] / n,
            "mspe": self.sums["spe"] / n,
        }


def loss_sum(pred, true, loss):
    """Sum (not mean) of the elementwise training loss, for exact global averaging."""
    err = pred - true
    if loss == "MSE":
        return err.square().sum()
    return err.abs().sum()  # MAE


def batch_loss(pred, true, loss):
    return loss_sum(pred, true, loss) / pred.numel()


def global_mean(total, count):
    """Mean over every rank's elements: one all_reduce of (sum, count)."""
    total, count = distributed.all_reduce_sum([total, count])
    return total / count if count else float("nan")


LOSSES = ("MSE", "MAE")
