"""Forecast metrics from sums, so they can be added up across ranks exactly.

Each rank accumulates `ErrorSums` (point forecasts) or `ProbabilisticSums` (quantile forecasts:
WQL, MASE, sMAPE, MSIS, coverage, as gluonts scores them) over its own windows; one all_reduce of
the sums gives the metrics of the whole set, identical to a single-process evaluation.
"""
import math
import re

import numpy as np
import torch

from utils import distributed
from utils.errors import require

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
    if loss in ("SMAPE", "MAPE"):
        return m4_loss(pred, true, loss)
    return torch.nn.functional.l1_loss(pred, true)


def m4_loss(pred, true, loss):
    """TSLib's M4 training losses (utils/losses.py: smape_loss, mape_loss): the mean over every element of
    200 |f - y| / (|f| + |y|) (the denominator not differentiated, as TSLib's forecast.data) or of |f - y| / |y|,
    a 0 / 0 counted as 0; a NaN target is TSLib's mask 0 (a step past the series' end): 0, still counted."""
    mask = ~torch.isnan(true)
    true = torch.where(mask, true, 0)
    if loss == "SMAPE":
        denominator = pred.detach().abs() + true.abs()
        ratio = (pred - true).abs() / torch.where(denominator == 0, 1, denominator)
        return 200 * torch.where(mask & (denominator != 0), ratio, 0).mean()
    ratio = (pred - true) / torch.where(true == 0, 1, true)
    return torch.where(mask & (true != 0), ratio, 0).abs().mean()


LOSSES = ("MSE", "MAE", "SMAPE", "MAPE")  # SMAPE, MAPE: M4 (data_provider.m4)


# ---- probabilistic metrics: the definitions of gluonts.ev, as GIFT-Eval evaluates them ----

# gluonts' get_seasonality table (gluonts.time_feature.seasonality): a day of seconds, minutes or
# hours, a year of months or quarters, a week of business days; every other unit 1
_SEASON_OF_UNIT = {"s": 3600, "min": 1440, "h": 24, "D": 1, "W": 1, "ME": 12, "B": 5, "QE": 4}
# TSLib's --freq letters and the names pandas 3 no longer reads (GIFT-Eval's files use them), in
# pandas 3's spelling; 'm' is a month here, as in --freq
_UNIT_ALIASES = {"t": "min", "T": "min", "H": "h", "S": "s", "d": "D", "w": "W", "b": "B", "m": "ME", "M": "ME",
                 "q": "QE", "Q": "QE", "y": "YE", "Y": "YE", "a": "YE", "A": "YE", "L": "ms", "U": "us", "N": "ns"}


def seasonality(freq):
    """The seasonal period GIFT-Eval scores MASE with: gluonts' get_seasonality(freq).

    The unit's period (h 24, min 1440, s 3600, B 5, month 12, quarter 4, else 1) divided by the
    multiple, or 1 where the multiple does not divide it ('15min' 96, '2h' 12, '5h' 1). Takes pandas'
    strings ('h', '15min', 'W-SUN', 'MS', 'QE') and TSLib's --freq letters (t, h, d, b, w, m, q, y).
    """
    offset = _offset(str(freq).strip())
    require(offset is not None and offset.n >= 1,
            f"unknown frequency '{freq}' for the MASE seasonality; use a pandas frequency such as h, 15min, D, W, "
            "MS, B, QE, or one of --freq's letters")
    base = offset.rule_code.split("-")[0]
    if len(base) >= 2 and base.endswith("S"):  # start-of-period units count as their end ones (MS as ME)
        base = base[:-1] + "E"
    period = _SEASON_OF_UNIT.get(base, 1)
    return period // offset.n if period % offset.n == 0 else 1


def _offset(freq):
    """pandas' offset of a frequency string, TSLib's and pandas' older units renamed first; None if unknown."""
    from pandas.tseries.frequencies import to_offset

    match = re.fullmatch(r"(\d*)([A-Za-z]+)(-\w+)?", freq)
    if match is None:
        return None
    multiple, unit, anchor = match.groups()
    try:
        return to_offset(f"{multiple}{_UNIT_ALIASES.get(unit, unit)}{anchor or ''}")
    except ValueError:
        return None


def seasonal_error(history, season, series="a series"):
    """[C] float64: each column's in-sample seasonal naive MAE, mean |y_t - y_(t-season)| over a
    [T, C] history (gluonts.ev.ts_stats.seasonal_error: MASE's and MSIS's denominator).

    A history of season rows or fewer is refused, where gluonts would fall back to season 1 (more
    than T) or give NaN (exactly T): a MASE on another season's scale is a silently wrong number."""
    history = np.asarray(history, dtype=np.float64)
    if history.ndim == 1:
        history = history[:, None]
    rows = history.shape[0]
    require(rows > season, f"MASE needs at least season+1 history rows per series: {series} has {rows} "
            f"for season {season}; give a longer history or a --freq with a shorter season")
    require(np.isfinite(history).all(), f"MASE needs a finite history: {series} has NaN or infinite values")
    return np.abs(history[season:] - history[:-season]).mean(0)


GIFT_EVAL_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
MSIS_ALPHA = 0.1  # the default: the 90 % interval, levels 0.05 and 0.95
COVERAGE_INTERVALS = {"coverage_50": (0.25, 0.75), "coverage_80": (0.1, 0.9), "coverage_90": (0.05, 0.95)}


class ProbabilisticSums:
    """Running float64 sums of the probabilistic metrics of quantile forecasts, reduced like ErrorSums:
    per-window sums in the inputs' dtype, float64 across windows, one all_reduce at the end.

    levels: the forecasts' quantile levels, sorted, in (0, 1), with 0.5 (the median: MASE, sMAPE).
    transform: as ErrorSums', applied to the quantiles with channels last ([L, B, P, C]) before scoring.
    metrics(): wql (GIFT-Eval's mean weighted quantile loss over its nine levels 0.1 ... 0.9 when all
    are given, else over `levels`; wql_levels says which), smape, coverage_50 / 80 / 90 (where both
    ends of the interval are levels), and with a scale given, mase and msis (the 1 - msis_alpha interval, where
    msis_alpha / 2 and 1 - msis_alpha / 2 are levels; msis_alpha says which). gluonts' rules at a zero denominator: elements whose scale is 0 are left out of mase
    and msis, elements with y = 0 forecast as 0 out of smape; wql of all-zero truths is NaN (inf when
    some loss is not 0); a mean over no element is NaN.
    """

    def __init__(self, levels, transform=None, keep_windows=False, msis_alpha=MSIS_ALPHA):
        levels = tuple(float(level) for level in levels)
        require(all(0 < level < 1 for level in levels) and list(levels) == sorted(set(levels)) and 0.5 in levels,
                f"quantile levels must be distinct, sorted, in (0, 1) and include 0.5; got {list(levels)}")
        self.levels, self.transform = levels, transform
        self.wql_levels = GIFT_EVAL_LEVELS if set(GIFT_EVAL_LEVELS) <= set(levels) else levels
        self.msis_alpha = float(msis_alpha)
        lo, hi = self.msis_alpha / 2, 1 - self.msis_alpha / 2
        self._msis_ends = (levels.index(lo), levels.index(hi)) if lo in levels and hi in levels else None
        self._intervals = {name: (levels.index(a), levels.index(b))
                           for name, (a, b) in COVERAGE_INTERVALS.items() if a in levels and b in levels}
        self._fields = (["windows", "scaled_windows", "count", "abs_label", *(f"ql{level}" for level in levels),
                         "sape", "sape_count", "ase", "ase_count", "interval_score", "interval_score_count",
                         *self._intervals])
        self.sums = dict.fromkeys(self._fields, 0.0)
        self._pending = []  # per batch, a float64 tensor of the sums after "count": no host sync in the loop
        self._windows = [] if keep_windows else None  # per batch, [B, fields after "windows", "scaled_windows"]
        self._tau = {}

    def update(self, quantiles, true, scale=None):
        """quantiles [B, P, C, L] sorted along L; true [B, P, C]; scale None or [B, C]: each window's
        channel's seasonal error, the same for every window of a series (its history's, not the window's)."""
        if quantiles.dim() != 4 or quantiles.shape[:3] != true.shape or quantiles.shape[3] != len(self.levels):
            raise ValueError(f"quantiles {tuple(quantiles.shape)} and truths {tuple(true.shape)} do not match "
                             f"[B, P, C, {len(self.levels)}] and [B, P, C]")
        if self.transform is not None:
            quantiles = self.transform(quantiles.movedim(-1, 0)).movedim(0, -1)
        q = quantiles.to(true.dtype)
        median = q[..., self.levels.index(0.5)]
        windows = true.shape[0]
        tau = self._tau.get((q.dtype, q.device))
        if tau is None:  # made once per dtype and device: no host-to-device copy per batch
            tau = self._tau[(q.dtype, q.device)] = torch.tensor(self.levels, dtype=q.dtype, device=q.device)
        y = true.unsqueeze(-1)
        # gluonts' quantile loss: 2 |(y - q) (1[q >= y] - tau)|
        ql = 2 * ((y - q) * ((q >= y).to(q.dtype) - tau)).abs()
        abs_err = (true - median).abs()
        denominator = true.abs() + median.abs()
        smape_ok = denominator != 0
        sape = torch.where(smape_ok, 2 * abs_err / torch.where(smape_ok, denominator, 1), 0)
        parts = [_window_sums(true.abs()), *_window_sums(ql).unbind(-1), _window_sums(sape), _window_sums(smape_ok)]
        if scale is None:
            parts += [torch.zeros(windows, dtype=torch.float64, device=true.device)] * 4
        else:
            if tuple(scale.shape) != (windows, true.shape[2]):
                raise ValueError(f"scale {tuple(scale.shape)} is not [B, C] = {(windows, true.shape[2])}")
            scale = scale.to(device=true.device, dtype=torch.float64)[:, None, :]  # [B, 1, C]
            scaled = (scale != 0).expand(true.shape)
            safe = torch.where(scale != 0, scale, 1)
            parts += [_window_sums(torch.where(scaled, abs_err / safe, 0)), _window_sums(scaled)]
            if self._msis_ends is not None:
                low, high = q[..., self._msis_ends[0]], q[..., self._msis_ends[1]]
                score = (high - low + (2 / self.msis_alpha) * (low - true) * (true < low)
                         + (2 / self.msis_alpha) * (true - high) * (true > high))
                parts += [_window_sums(torch.where(scaled, score / safe, 0)), _window_sums(scaled)]
            else:
                parts += [torch.zeros(windows, dtype=torch.float64, device=true.device)] * 2
        for lo, hi in self._intervals.values():
            parts.append(_window_sums((q[..., lo] <= true) & (true <= q[..., hi])))
        # each window's sums first, then float64 across windows: a window's part does not depend
        # on which batch or rank it landed in
        per_windows = torch.stack([p.to(torch.float64) for p in parts])  # [fields after "count", B]
        self._pending.append(per_windows.sum(1))
        if self._windows is not None:  # each window's own sums, its element count first
            counts = per_windows.new_full((1, windows), float(true[0].numel()))
            self._windows.append(torch.cat([counts, per_windows]).T)
        self.sums["windows"] += windows
        self.sums["scaled_windows"] += windows if scale is not None else 0
        self.sums["count"] += true.numel()

    def _flush(self):
        if self._pending:
            totals = torch.stack(self._pending).sum(0).tolist()
            self._pending = []
            for key, value in zip(self._fields[3:], totals):
                self.sums[key] += value

    def all_reduce(self):
        """Sum over all ranks: every rank gets the global sums (one collective)."""
        self._flush()
        totals = distributed.all_reduce_sum([self.sums[k] for k in self._fields])
        self.sums = dict(zip(self._fields, totals))
        return self

    def window_sums(self):
        """[windows, fields] float64: each window's own sums so far (`keep_windows`), in the order of
        `window_fields`: adding rows gives any subset's sums, hence its metrics exactly."""
        if self._windows is None:
            raise RuntimeError("ProbabilisticSums(keep_windows=True) is needed for window_sums()")
        return torch.cat(self._windows).cpu() if self._windows else torch.zeros(0, len(self.window_fields()),
                                                                               dtype=torch.float64)

    def window_fields(self):
        """The names of window_sums' columns: every sum but the window counts."""
        return self._fields[2:]

    def metrics(self):
        self._flush()
        s = self.sums
        out = {"wql": float(np.mean([_ratio(s[f"ql{level}"], s["abs_label"]) for level in self.wql_levels]))
               if s["count"] else math.nan,
               "wql_levels": list(self.wql_levels),
               "smape": _ratio(s["sape"], s["sape_count"])}
        if s["windows"] and s["scaled_windows"] == s["windows"]:
            out["mase"] = _ratio(s["ase"], s["ase_count"])
            if self._msis_ends is not None:
                out["msis"] = _ratio(s["interval_score"], s["interval_score_count"])
                out["msis_alpha"] = self.msis_alpha
        elif s["scaled_windows"]:
            raise ValueError(f"a scale was given for {s['scaled_windows']:.0f} of {s['windows']:.0f} windows; "
                             "MASE needs it for all or none")
        for name in self._intervals:
            out[name] = _ratio(s[name], s["count"])
        return out


def _window_sums(x):
    """[B, P, C] -> [B]: each window's sum."""
    return x.sum((1, 2))


def _ratio(total, count):
    """total / count as numpy divides floats: NaN for 0 / 0, inf for x / 0 (gluonts' figures there)."""
    if count == 0:
        return math.nan if total == 0 else math.copysign(math.inf, total)
    return total / count
