"""Forecast metrics, each defined once, and their sums, so they can be added up across ranks exactly.

Three kinds of object, each written once, for torch tensors and NumPy arrays alike:
- an element formula (quantile_loss, sape, ape, interval_score, covered, seasonal_naive_error);
- a `Sum`: a per-window sum by name (a window_errors.csv column) and its term, each element's value from a
  batch's `Elements` (truths, median, quantiles, scales);
- a `Metric`: its name, the sums it reads (by name) and its formula from them.
Each window contributes its own float64 sums; sums add across batches, ranks and windows, and one all_reduce of
them gives the metrics of the whole set, identical to a single-process evaluation. The run's `ErrorSums` (point
forecasts) and `ProbabilisticSums` (quantile forecasts: WQL, sMAPE, MASE, MSIS, coverage, SQL, RMSSE, as gluonts
and fev score them), GIFT-Eval's columns (benchmarks/gift_eval_scores.py) and M4's summary (utils/m4.py: the
formulas and the seasonal error; M4's own means) all read these definitions.

Adding a probabilistic metric: its element formula, its `Sum` in SUMS (if it needs a sum not there) and its
`Metric` in probabilistic_metrics, all here; ProbabilisticSums computes, reduces, keeps per window and reports it,
and a GIFT-Eval column is one entry of gift_eval_scores.METRICS.
"""
import math
import re

import numpy as np
import torch

from utils import distributed
from utils.errors import require


# ---------------------------------------------------------------- element formulas (torch tensors or NumPy arrays)

def _where(condition, a, b):
    return torch.where(condition, a, b) if torch.is_tensor(condition) else np.where(condition, a, b)


def vector_like(values, like, dtype=None):
    """A 1-D tensor of `values` in `like`'s dtype (or `dtype`) on its device, filled there: no blocking
    host-to-device copy, and the same values as torch.tensor(values, dtype=...)."""
    dtype = like.dtype if dtype is None else dtype
    return torch.stack([like.new_full((), float(v) if dtype.is_floating_point else v, dtype=dtype) for v in values])


def _as_float(mask, like):
    """A boolean mask as 0 / 1 in `like`'s dtype (NumPy's arithmetic promotes a bool by itself)."""
    return mask.to(like.dtype) if torch.is_tensor(mask) else mask


def quantile_loss(y, q, tau):
    """2 |(y - q) (1[q >= y] - tau)| of the quantile q at level tau: gluonts' and fev's quantile loss (twice the
    pinball loss), what WQL and SQL add up."""
    return 2 * abs((y - q) * (_as_float(q >= y, q) - tau))


def sape(y, f, factor=2):
    """(factor |y - f| / (|y| + |f|), defined): the symmetric absolute percentage error of each element, and
    where it is defined (|y| + |f| not 0; the term is 0 elsewhere). factor 2: gluonts' sMAPE; 200: M4's, in %."""
    denominator = abs(y) + abs(f)
    defined = denominator != 0
    return factor * abs(y - f) / _where(defined, denominator, 1), defined


def ape(y, f, factor=1):
    """(factor |y - f| / |y| where y is not 0, else factor |y - f|; defined: y not 0): the absolute percentage
    error of each element. gluonts leaves the undefined elements out (factor 1); M4's summary (TSLib's
    m4_summary, factor 100) keeps them as they are."""
    defined = y != 0
    return factor * abs(y - f) / _where(defined, abs(y), 1), defined


def interval_score(y, low, high, alpha):
    """The interval score of [low, high] as the central 1 - alpha interval: its width, plus 2 / alpha times how
    far y falls outside it (MSIS's numerator)."""
    return high - low + (2 / alpha) * (low - y) * (y < low) + (2 / alpha) * (y - high) * (y > high)


def covered(y, low, high):
    """Whether y lies in [low, high] (a coverage's count)."""
    return (low <= y) & (y <= high)


def seasonal_naive_error(history, season, power=1):
    """The mean of |y_t - y_(t-season)| ** power over a [T] or [T, C] history's pairs (per column): the in-sample
    seasonal naive error, power 1 MASE's, MSIS's and SQL's scale, power 2 RMSSE's. Pairs holding a NaN are left
    out of a 1-D history's mean; NaN where no pair is left. Every seasonal error of this codebase is this one."""
    history = np.asarray(history, dtype=np.float64)
    differences = np.abs(history[season:] - history[:len(history) - season])
    if power == 2:
        differences = differences * differences
    if differences.ndim == 1:
        finite = np.isfinite(differences)
        if not finite.all():
            differences = differences[finite]
        if len(differences) == 0:
            return math.nan
    return differences.mean(0)


def ratio(total, count):
    """total / count as NumPy divides floats: NaN for 0 / 0 or a NaN total, inf of total's sign for x / 0."""
    if count == 0:
        return math.nan if total == 0 or math.isnan(total) else math.copysign(math.inf, total)
    return total / count


# ---------------------------------------------------------------- the per-window sums, one object each

class Elements:
    """What one batch of windows gives the sums' terms, as torch tensors (the run: y [B, P, C], quantiles
    [B, P, C, L]) or NumPy arrays (GIFT-Eval: y [B, P], quantiles [B, P, L]): the truths y, the median, the
    forecast's mean (the median if none), the quantiles at `levels` with their levels `tau` (an array in the
    quantiles' dtype), `scale` and `sq_scale` (each window's seasonal errors, broadcasting against y), MSIS's
    interval ends `low`, `high` at `alpha`, and the levels `wql_levels` WQL and SQL average over. What a batch
    lacks is None, and the sums that need it are not computed (Sum.needs)."""

    def __init__(self, y, median, quantiles=None, tau=(), levels=(), wql_levels=(), mean=None, scale=None,
                 sq_scale=None, low=None, high=None, alpha=None, wql_index=None):
        self.y, self.median, self.q, self.tau, self.levels = y, median, quantiles, tau, tuple(levels)
        self.mean = median if mean is None else mean
        # the positions of wql_levels among levels; given as a tensor on the quantiles' device, a pick by them copies
        # nothing from the host
        self.wql_index = [self.levels.index(level) for level in wql_levels] if wql_index is None else wql_index
        self.scale, self.sq_scale, self.low, self.high, self.alpha = scale, sq_scale, low, high, alpha
        self._cache = {}

    def has(self, need):
        return getattr(self, {"quantiles": "q", "interval": "low"}.get(need, need)) is not None

    def once(self, key, make):
        """make(), computed once per batch (terms that several sums share)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    @property
    def abs_err(self):
        """|y - median| of each element."""
        return self.once("abs_err", lambda: abs(self.y - self.median))

    @property
    def quantile_losses(self):
        """[..., L]: each level's quantile loss of each element."""
        y = self.y.unsqueeze(-1) if torch.is_tensor(self.y) else self.y[..., None]
        return self.once("ql", lambda: quantile_loss(y, self.q, self.tau))

    @property
    def scaled(self):
        """Whether each element's series has a seasonal error other than 0 (gluonts leaves the others out)."""
        return self.once("scaled", lambda: self.scale != 0)

    @property
    def scaled_elements(self):
        """`scaled` broadcast to every element (what a count adds up)."""
        return self.once("scaled_elements", lambda: self.scaled.expand(self.y.shape) if torch.is_tensor(self.y)
                          else np.broadcast_to(self.scaled, self.y.shape))

    def per_scale(self, values, scale=None):
        """values / scale where the series is scaled, 0 elsewhere: (values / the safe scale, where)."""
        scale = self.scale if scale is None else scale
        return values / _where(scale != 0, scale, 1), self.scaled_elements


class Sum:
    """One per-window sum: `name` (a window_errors.csv column), `term(e)` (each element's value from the batch's
    Elements: an array, a boolean array to count, or (values, where) for values counted only where `where`), and
    `needs` (what of a batch it reads beyond y and the median: quantiles, scale, sq_scale, interval). A family
    (`names`, a term ending in a dimension of len(names)) is one sum per name, computed at once."""

    def __init__(self, name, term, needs=(), names=None):
        self.name, self.term, self.needs, self.names = name, term, tuple(needs), names or (name,)
        self.family = names is not None

    def available(self, e):
        return all(e.has(need) for need in self.needs)


def quantile_loss_sums(levels):
    """ql<level>: each level's quantile loss, summed (WQL's numerators), one family."""
    return Sum("quantile losses", lambda e: e.quantile_losses, ("quantiles",), names=_quantile_sums(levels))


def coverage_sum(name, low, high):
    """`name`: how many elements lie between the quantiles at levels `low` and `high`."""
    return Sum(name, lambda e: covered(e.y, e.q[..., e.levels.index(low)], e.q[..., e.levels.index(high)]),
               ("quantiles",))


SUMS = {s.name: s for s in (
    Sum("abs_label", lambda e: abs(e.y)),
    Sum("sq", lambda e: e.abs_err ** 2),
    Sum("sq_mean", lambda e: (e.y - e.mean) ** 2),
    Sum("abs", lambda e: e.abs_err),
    Sum("masked_ape", lambda e: e.once("ape", lambda: ape(e.y, e.median))),
    Sum("masked_ape_count", lambda e: e.once("ape", lambda: ape(e.y, e.median))[1]),
    Sum("sape", lambda e: e.once("sape", lambda: sape(e.y, e.median))),
    Sum("sape_count", lambda e: e.once("sape", lambda: sape(e.y, e.median))[1]),
    Sum("ase", lambda e: e.per_scale(e.abs_err), ("scale",)),
    Sum("ase_count", lambda e: e.scaled_elements, ("scale",)),
    Sum("interval_score", lambda e: e.per_scale(interval_score(e.y, e.low, e.high, e.alpha)), ("scale", "interval")),
    Sum("interval_score_count", lambda e: e.scaled_elements, ("scale", "interval")),
    Sum("sql", lambda e: e.per_scale(e.quantile_losses[..., e.wql_index].mean(-1)), ("quantiles", "scale")),
    Sum("sse", lambda e: e.per_scale((e.y - e.median) ** 2, e.sq_scale), ("scale", "sq_scale")),
)}


def _quantile_sums(levels):
    return tuple(f"ql{level}" for level in levels)


# ---------------------------------------------------------------- the metrics, one object each

class Metric:
    """One metric: `name` (its key in the records), `sums` (the per-window sums its figure reads, by name) and
    `formula` (the figure from those sums). Window sums add across batches, ranks and windows, so a metric of
    any set of windows is its formula of their added sums (exact under any split of the windows). `scaled`: it
    divides by a series' seasonal error, so it exists only where every window was given one."""

    def __init__(self, name, sums, formula, scaled=False):
        self.name, self.sums, self.formula, self.scaled = name, tuple(sums), formula, scaled

    def __call__(self, sums):
        return self.formula({name: sums[name] for name in self.sums})  # only the sums it declares

    def __repr__(self):
        return f"Metric({self.name!r}, sums={list(self.sums)})"


def wql(levels):
    """WQL over `levels`: the mean over the levels of sum quantile loss / sum |y| (GIFT-Eval's CRPS column,
    gluonts' mean_weighted_sum_quantile_loss); NaN over no element."""
    return Metric("wql", ("count", "abs_label", *_quantile_sums(levels)), lambda s: float(np.mean(
        [ratio(s[f"ql{level}"], s["abs_label"]) for level in levels])) if s["count"] else math.nan)


def sql(levels):
    """SQL over `levels` (fev's scaled quantile loss): the mean over scaled elements of the quantile loss, averaged
    over the levels, divided by the series' seasonal naive error; elements whose scale is 0 are left out."""
    return Metric("sql", ("sql", "ase_count"), lambda s: ratio(s["sql"], s["ase_count"]), scaled=True)


def msis(alpha):
    """MSIS: the mean interval score of the 1 - alpha interval over the seasonal naive error."""
    return Metric("msis", ("interval_score", "interval_score_count"),
                  lambda s: ratio(s["interval_score"], s["interval_score_count"]), scaled=True)


def coverage(name):
    """The share of elements inside the interval `name` (COVERAGE_INTERVALS)."""
    return Metric(name, (name, "count"), lambda s: ratio(s[name], s["count"]))


# point forecasts (ErrorSums): TSLib's figures, every element counted
MSE = Metric("mse", ("sq", "count"), lambda s: ratio(s["sq"], s["count"]))
MAE = Metric("mae", ("abs", "count"), lambda s: ratio(s["abs"], s["count"]))
RMSE = Metric("rmse", ("sq", "count"), lambda s: math.sqrt(MSE(s)))
MAPE = Metric("mape", ("ape", "count"), lambda s: ratio(s["ape"], s["count"]))  # |e / y|: inf where y is 0
MSPE = Metric("mspe", ("spe", "count"), lambda s: ratio(s["spe"], s["count"]))
POINT_METRICS = (MSE, MAE, RMSE, MAPE, MSPE)

# the median's figures, as gluonts scores them (undefined elements left out)
SMAPE = Metric("smape", ("sape", "sape_count"), lambda s: ratio(s["sape"], s["sape_count"]))
MASE = Metric("mase", ("ase", "ase_count"), lambda s: ratio(s["ase"], s["ase_count"]), scaled=True)
RMSSE = Metric("rmsse", ("sse", "ase_count"), lambda s: math.sqrt(ratio(s["sse"], s["ase_count"])), scaled=True)
MASKED_MAPE = Metric("MAPE", ("masked_ape", "masked_ape_count"),
                     lambda s: ratio(s["masked_ape"], s["masked_ape_count"]))
# the forecast's mean (GIFT-Eval's [mean] columns) and the median's absolute error over the labels' (ND)
MSE_MEAN = Metric("MSE[mean]", ("sq_mean", "count"), lambda s: ratio(s["sq_mean"], s["count"]))
RMSE_MEAN = Metric("RMSE[mean]", ("sq_mean", "count"), lambda s: math.sqrt(MSE_MEAN(s)))
NRMSE_MEAN = Metric("NRMSE[mean]", ("sq_mean", "count", "abs_label"),
                    lambda s: ratio(RMSE_MEAN(s), ratio(s["abs_label"], s["count"])))
ND = Metric("ND", ("abs", "abs_label"), lambda s: ratio(s["abs"], s["abs_label"]))


def probabilistic_metrics(wql_levels, msis_alpha, intervals=()):
    """The run's probabilistic metrics, in the order its records list them: wql, smape, mase, msis, the coverages
    of `intervals`, sql, rmsse."""
    return (wql(wql_levels), SMAPE, MASE, msis(msis_alpha), *(coverage(name) for name in intervals),
            sql(wql_levels), RMSSE)


def sum_names(metrics):
    """Every sum the metrics read, each once, in the order they first appear."""
    return list(dict.fromkeys(name for metric in metrics for name in metric.sums))


def sums_of(names, levels=(), intervals=None):
    """The Sum objects that compute `names` (a family once): SUMS', the quantile losses at `levels`, and the
    coverage counts of `intervals` ({name: (low, high)})."""
    known = {**{name: quantile_loss_sums(levels) for name in _quantile_sums(levels)},
             **{name: coverage_sum(name, *ends) for name, ends in (intervals or {}).items()}, **SUMS}
    return list({id(known[name]): known[name] for name in names}.values())



# ---------------------------------------------------------------- point forecasts

_FIELDS = ("count", "sq", "abs", "ape", "spe")  # the sums of POINT_METRICS


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
        terms = {"sq": err.square(), "abs": err.abs(), "ape": rel.abs(), "spe": rel.square()}
        windows = {name: terms[name].sum(window_dims) for name in _FIELDS[1:]}
        self.sums["count"] += err.numel()
        self._pending.append(torch.stack(list(windows.values())).sum(1, dtype=torch.float64))  # in _FIELDS' order
        if self._windows is not None:
            self._windows.append(torch.stack([windows["sq"], windows["abs"]], 1).double() / err[0].numel())

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
        return {metric.name: metric(self.sums) for metric in POINT_METRICS}  # NaN over no element


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


def m4_loss(pred, true, loss, dim=None):
    """TSLib's M4 training losses (utils/losses.py: smape_loss, mape_loss): the mean over every element of
    200 |f - y| / (|f| + |y|) (the denominator not differentiated, as TSLib's forecast.data) or of |f - y| / |y|,
    a 0 / 0 counted as 0; a NaN target is TSLib's mask 0 (a step past the series' end): 0, still counted.
    `dim`: the mean over that dimension only (dim -1 of [series, horizon]: each series' own loss, the same bits as
    the loss of that series alone)."""
    mask = ~torch.isnan(true)
    true = torch.where(mask, true, 0)
    mean = (lambda t: t.mean()) if dim is None else (lambda t: t.mean(dim))
    if loss == "SMAPE":
        denominator = pred.detach().abs() + true.abs()
        ratio = (pred - true).abs() / torch.where(denominator == 0, 1, denominator)
        return 200 * mean(torch.where(mask & (denominator != 0), ratio, 0))
    ratio = (pred - true) / torch.where(true == 0, 1, true)
    return mean(torch.where(mask & (true != 0), ratio, 0).abs())


LOSSES = ("MSE", "MAE", "SMAPE", "MAPE")  # SMAPE, MAPE: M4 (data_provider.m4)


# ---------------------------------------------------------------- quantile forecasts (gluonts' and GIFT-Eval's rules)

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
    [T, C] history (gluonts.ev.ts_stats.seasonal_error: MASE's, MSIS's and SQL's denominator; power 2: the mean
    squared difference, RMSSE's).

    A history of season rows or fewer is refused, where gluonts would fall back to season 1 (more
    than T) or give NaN (exactly T): a MASE on another season's scale is a silently wrong number."""
    history = np.asarray(history, dtype=np.float64)
    if history.ndim == 1:
        history = history[:, None]
    rows = history.shape[0]
    require(rows > season, f"MASE needs at least season+1 history rows per series: {series} has {rows} "
            f"for season {season}; give a longer history or a --freq with a shorter season")
    require(np.isfinite(history).all(), f"MASE needs a finite history: {series} has NaN or infinite values")
    return seasonal_naive_error(history, season)


def squared_seasonal_error(history, season, series="a series"):
    """[C] float64: each column's mean squared seasonal difference, mean (y_t - y_(t-season))^2 (RMSSE's scale),
    refused as seasonal_error refuses."""
    seasonal_error(history, season, series)  # the same checks, one line each
    history = np.asarray(history, dtype=np.float64)
    return seasonal_naive_error(history if history.ndim == 2 else history[:, None], season, power=2)


GIFT_EVAL_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
MSIS_ALPHA = 0.1  # the default: the 90 % interval, levels 0.05 and 0.95
COVERAGE_INTERVALS = {"coverage_50": (0.25, 0.75), "coverage_80": (0.1, 0.9), "coverage_90": (0.05, 0.95)}
_COUNTERS = ("windows", "scaled_windows", "sq_scaled_windows")  # windows seen, given a scale, given RMSSE's


class ProbabilisticSums:
    """Running float64 sums of the probabilistic metrics of quantile forecasts, reduced like ErrorSums:
    per-window sums in the inputs' dtype, float64 across windows, one all_reduce at the end.

    levels: the forecasts' quantile levels, sorted, in (0, 1), with 0.5 (the median: MASE, sMAPE, RMSSE).
    transform: as ErrorSums', applied to the quantiles with channels last ([L, B, P, C]) before scoring.
    metrics(): wql (GIFT-Eval's mean weighted quantile loss over its nine levels 0.1 ... 0.9 when all
    are given, else over `levels`; wql_levels says which), smape, coverage_50 / 80 / 90 (where both
    ends of the interval are levels), with a scale given, mase, sql (fev's scaled quantile loss, over wql_levels)
    and msis (the 1 - msis_alpha interval, where msis_alpha / 2 and 1 - msis_alpha / 2 are levels; msis_alpha says
    which), and with a squared scale too, rmsse (fev's, of the median). gluonts' rules at a zero denominator:
    elements whose scale is 0 are left out of mase, msis, sql and rmsse (fev leaves such series out),
    elements with y = 0 forecast as 0 out of smape; wql of all-zero truths is NaN (inf when some loss is not 0);
    a mean over no element is NaN. The metrics and the sums they read: probabilistic_metrics.
    """

    def __init__(self, levels, transform=None, keep_windows=False, msis_alpha=MSIS_ALPHA):
        levels = tuple(float(level) for level in levels)
        require(all(0 < level < 1 for level in levels) and list(levels) == sorted(set(levels)) and 0.5 in levels,
                f"quantile levels must be distinct, sorted, in (0, 1) and include 0.5; got {list(levels)}")
        self.levels, self.transform = levels, transform
        self.wql_levels = GIFT_EVAL_LEVELS if set(GIFT_EVAL_LEVELS) <= set(levels) else levels
        self._wql_index = [levels.index(level) for level in self.wql_levels]
        self.msis_alpha = float(msis_alpha)
        lo, hi = self.msis_alpha / 2, 1 - self.msis_alpha / 2
        self._msis_ends = (levels.index(lo), levels.index(hi)) if lo in levels and hi in levels else None
        self._intervals = {name: (levels.index(a), levels.index(b))
                           for name, (a, b) in COVERAGE_INTERVALS.items() if a in levels and b in levels}
        self.metric_objects = probabilistic_metrics(self.wql_levels, self.msis_alpha, self._intervals)
        # every level's quantile loss is kept (window_errors.csv holds them), whichever levels WQL and SQL read
        window_fields = sum_names([Metric("quantile losses", ("count", "abs_label", *_quantile_sums(levels)), None),
                                   *self.metric_objects])
        self._summed = window_fields[1:]  # what update adds up per window, by name ("count" is the elements')
        self._sums = sums_of(self._summed, levels, {name: COVERAGE_INTERVALS[name] for name in self._intervals})
        self._fields = (*_COUNTERS, *window_fields)
        self.sums = dict.fromkeys(self._fields, 0.0)
        self._pending = []  # per batch, a float64 tensor of the sums of _summed: no host sync in the loop
        self._windows = [] if keep_windows else None  # per batch, [B, window_fields]
        self._tau = {}
        self._wql_at = {}  # device -> _wql_index there

    def update(self, quantiles, true, scale=None, sq_scale=None):
        """quantiles [B, P, C, L] sorted along L; true [B, P, C]; scale None or [B, C]: each window's
        channel's seasonal error, the same for every window of a series (its history's, not the window's);
        sq_scale None or [B, C], with a scale: its mean squared seasonal difference (RMSSE's scale)."""
        if quantiles.dim() != 4 or quantiles.shape[:3] != true.shape or quantiles.shape[3] != len(self.levels):
            raise ValueError(f"quantiles {tuple(quantiles.shape)} and truths {tuple(true.shape)} do not match "
                             f"[B, P, C, {len(self.levels)}] and [B, P, C]")
        if self.transform is not None:
            quantiles = self.transform(quantiles.movedim(-1, 0)).movedim(0, -1)
        q = quantiles.to(true.dtype)
        median = q[..., self.levels.index(0.5)]
        windows = true.shape[0]
        tau = self._tau.get((q.dtype, q.device))
        if tau is None:  # made once per dtype and device
            tau = self._tau[(q.dtype, q.device)] = vector_like(self.levels, q)
        if q.device not in self._wql_at:
            self._wql_at[q.device] = vector_like(self._wql_index, q, dtype=torch.long)
        if scale is not None:
            if tuple(scale.shape) != (windows, true.shape[2]):
                raise ValueError(f"scale {tuple(scale.shape)} is not [B, C] = {(windows, true.shape[2])}")
            scale = scale.to(device=true.device, dtype=torch.float64)[:, None, :]  # [B, 1, C]
            if sq_scale is not None:
                sq_scale = sq_scale.to(device=true.device, dtype=torch.float64)[:, None, :]
        elif sq_scale is not None:
            raise ValueError("sq_scale needs scale: RMSSE leaves out the elements whose seasonal error is 0")
        low, high = (None, None) if self._msis_ends is None else (q[..., i] for i in self._msis_ends)
        e = Elements(true, median, q, tau, self.levels, self.wql_levels, scale=scale, sq_scale=sq_scale, low=low,
                     high=high, alpha=self.msis_alpha, wql_index=self._wql_at[q.device])
        parts = {}
        for definition in self._sums:
            if definition.available(e):
                values = definition.term(e)
                if isinstance(values, tuple):  # (values, where): counted only where
                    values = torch.where(values[1], values[0], 0)
                sums = _window_sums(values)
                parts.update(zip(definition.names, sums.unbind(-1) if definition.family else [sums]))
        # each window's sums first, then float64 across windows: a window's part does not depend
        # on which batch or rank it landed in; a sum this batch cannot give (no scale) is 0
        zero = torch.zeros(windows, dtype=torch.float64, device=true.device)
        per_windows = torch.stack([parts.get(name, zero).to(torch.float64) for name in self._summed])  # [_summed, B]
        self._pending.append(per_windows.sum(1))
        if self._windows is not None:  # each window's own sums, its element count first
            counts = per_windows.new_full((1, windows), float(true[0].numel()))
            self._windows.append(torch.cat([counts, per_windows]).T)
        self.sums["windows"] += windows
        self.sums["scaled_windows"] += windows if scale is not None else 0
        self.sums["sq_scaled_windows"] += windows if sq_scale is not None else 0
        self.sums["count"] += true.numel()

    def _flush(self):
        if self._pending:
            totals = torch.stack(self._pending).sum(0).tolist()
            self._pending = []
            for key, value in zip(self._summed, totals):
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
        return list(self._fields[len(_COUNTERS):])

    def scaled_fields(self):
        """The window fields only the scaled metrics (MASE, MSIS, SQL, RMSSE) read: 0 without a scale."""
        scaled = set(sum_names(m for m in self.metric_objects if m.scaled))
        scaled -= set(sum_names(m for m in self.metric_objects if not m.scaled))
        return [name for name in self.window_fields() if name in scaled]

    def metrics(self):
        self._flush()
        s = self.sums
        for counter in _COUNTERS[1:]:
            if s[counter] and s[counter] != s["windows"]:
                raise ValueError(f"a scale was given for {s[counter]:.0f} of {s['windows']:.0f} windows; "
                                 "MASE needs it for all or none")
        given = {"mase": bool(s["scaled_windows"]), "sql": bool(s["scaled_windows"]),
                 "msis": bool(s["scaled_windows"]) and self._msis_ends is not None,
                 "rmsse": bool(s["scaled_windows"] and s["sq_scaled_windows"])}
        named = {"wql": {"wql_levels": list(self.wql_levels)}, "msis": {"msis_alpha": self.msis_alpha}}
        out = {}
        for metric in self.metric_objects:
            if given.get(metric.name, True):
                out[metric.name] = metric(s)
                out.update(named.get(metric.name, {}))
        return out


def _window_sums(x):
    """[B, P, C] -> [B]: each window's sum."""
    return x.sum((1, 2))
