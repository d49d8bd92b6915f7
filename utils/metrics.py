"""Forecast metrics from sums, so they can be added up across ranks exactly.

Each rank accumulates `ErrorSums` over its own windows; one all_reduce of the sums
gives the metrics of the whole set, identical to a single-process evaluation.
"""
import math

import torch

from utils import distributed

_FIELDS = ("count", "sq", "abs", "ape", "spe")


class ErrorSums:
    """Running float64 sums of squared, absolute and percentage errors (of float32 errors on the
    scaled data; of float64 ones after a float64 `transform`, e.g. to the original scale).

    With `keep_windows` it also keeps each window's own MSE and MAE, in loader order, so
    metrics over any subset of windows can be computed afterwards (`window_errors`).
    """

    def __init__(self, keep_windows=False, transform=None):
        # applied to the prediction first, onto the scale of the truths given to update (exp.outputs.
        # OriginalScale: the scaled forecasts onto the data file's own float64 values)
        self.transform = transform
        self.sums = dict.fromkeys(_FIELDS, 0.0)
        self._pending = []  # per-batch sums kept as tensors: no host sync inside the loop
        self._windows = [] if keep_windows else None  # per batch: [B, 2] (mse, mae) of each window
        self._all_windows = None  # on rank 0 after all_reduce: every rank's windows, in order
        self._reduced = False

    def update(self, pred, true):
        if self.transform is not None:
            pred = self.transform(pred)
        # float32 on the scaled data (an autocast forecast too); float64 on the original scale, so errors,
        # squares and sums are float64 throughout
        err = pred.to(true.dtype) - true
        rel = err / true
        # Per-window sums in the errors' dtype (float32 on the scaled data: no float64 copy of the
        # errors is made), then float64 across windows: a window's sum does not depend on which
        # batch or rank it landed in.
        window_dims = tuple(range(1, err.dim()))
        per_window = torch.stack([err.square().sum(window_dims), err.abs().sum(window_dims),
                                  rel.abs().sum(window_dims), rel.square().sum(window_dims)])  # [4, B]
        self.sums["count"] += err.numel()
        self._pending.append(per_window.sum(1, dtype=torch.float64))
        if self._windows is not None:
            self._windows.append(per_window[:2].T.double() / err[0].numel())

    def _flush(self):
        if self._pending:
            totals = torch.stack(self._pending).sum(0).tolist()
            self._pending = []
            for key, value in zip(_FIELDS[1:], totals):
                self.sums[key] += value

    def all_reduce(self):
        """Sum over all ranks (every rank gets the global sums; with `keep_windows` rank 0 gets every
        rank's windows, concatenated in rank order: the loader order of a ShardSampler)."""
        self._flush()
        totals = distributed.all_reduce_sum([self.sums[k] for k in _FIELDS])
        self.sums = dict(zip(_FIELDS, totals))
        if self._windows is not None:
            gathered = distributed.gather_on_main(self._local_windows())
            self._all_windows = torch.cat(gathered) if gathered is not None else None
            self._reduced = True
        return self

    def _local_windows(self):
        return torch.cat(self._windows).cpu() if self._windows else torch.zeros(0, 2, dtype=torch.float64)

    def window_errors(self):
        """[windows, 2] float64 tensor: each window's (mse, mae); after all_reduce, every rank's
        windows on rank 0 and None on the others."""
        if self._windows is None:
            raise RuntimeError("ErrorSums(keep_windows=True) is needed for window_errors()")
        return self._all_windows if self._reduced else self._local_windows()

    def metrics(self):
        self._flush()
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


def batch_loss(pred, true, loss):
    """Mean training loss of a batch (one fused op).

    A mean does not depend on the layout, so it is taken where the prediction is contiguous:
    models that forecast [B, C, P] and return the [B, P, C] transpose (DLinear, PatchTST, ...)
    then get a loss and a gradient without strided element-wise kernels (about 50 us per step).
    """
    if not pred.is_contiguous() and pred.dim() >= 2 and pred.transpose(-1, -2).is_contiguous():
        pred, true = pred.transpose(-1, -2), true.transpose(-1, -2)
    if loss == "MSE":
        return torch.nn.functional.mse_loss(pred, true)
    return torch.nn.functional.l1_loss(pred, true)


LOSSES = ("MSE", "MAE")
