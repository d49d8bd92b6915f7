"""GIFT-Eval's 11 metric columns, from sums each test window contributes on its own.

What gluonts computes (gluonts 0.17, gluonts.ev.metrics / stats / aggregations, through
gluonts.model.evaluate_model(axis=None, mask_invalid_label=True, allow_nan_forecast=False), as GIFT-Eval's
notebooks call it), and how it is reproduced here:
- labels are masked where NaN (np.ma.masked_invalid): a masked step counts in no sum and no count;
- np.ma's division masks a zero denominator: MAPE leaves out y = 0, sMAPE |y| + |f| = 0, MASE and MSIS a
  window whose seasonal error is 0;
- the seasonal error of a window is mean |y_t - y_(t-m)| over its whole history, NaN pairs masked, m the
  seasonality (get_seasonality: utils.metrics.seasonality), 1 where m exceeds the history;
- MSE[mean] and RMSE / NRMSE score the forecast's mean (a QuantileForecast without one: its median), the
  other point metrics the median; MSIS (alpha 0.05) needs the 0.025 and 0.975 quantiles, which gluonts'
  QuantileForecast extrapolates from the nine levels with its exponential tails (ExponentialTailApproximation,
  tol 1e-8); the CRPS column is the mean over the nine levels of sum quantile loss / sum |y|.

Each window's sums are float64 sums over its own steps; a configuration's total is math.fsum over its windows,
which is correctly rounded whatever the order, so the result does not depend on how windows were batched or
shared out across processes (utils.metrics.ProbabilisticSums adds float64 window sums in order instead, and
has neither the NaN mask nor the extrapolated MSIS interval).

The formulas, the sums and the metrics are utils.metrics' (Sum, Metric): the run's objects, under GIFT-Eval's
column names (METRICS); what is GIFT-Eval's own here is the NaN mask, the tail quantiles and fsum. Each
configuration's record also carries SQL (fev's scaled quantile loss over the nine levels, EXTRA), which
all_results.csv, in GIFT-Eval's columns, does not.
"""
import math

import numpy as np

from utils import metrics as metrics_

LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # GIFT-Eval's quantile levels (and the CRPS column's)
MSIS_ALPHA = 0.05  # gluonts' MSIS() default, which GIFT-Eval uses
TAIL_TOL = 1e-8  # ExponentialTailApproximation's tol
# each column's metric (utils.metrics): the same objects the run reports, under GIFT-Eval's names
METRICS = {"MSE[mean]": metrics_.MSE_MEAN, "MSE[0.5]": metrics_.MSE, "MAE[0.5]": metrics_.MAE,
           "MASE[0.5]": metrics_.MASE, "MAPE[0.5]": metrics_.MASKED_MAPE, "sMAPE[0.5]": metrics_.SMAPE,
           "MSIS": metrics_.msis(MSIS_ALPHA), "RMSE[mean]": metrics_.RMSE_MEAN, "NRMSE[mean]": metrics_.NRMSE_MEAN,
           "ND[0.5]": metrics_.ND, "mean_weighted_sum_quantile_loss": metrics_.wql(LEVELS)}
COLUMNS = tuple(METRICS)
EXTRA = {"SQL": metrics_.sql(LEVELS)}  # in each configuration's record, not all_results.csv (GIFT-Eval's columns)
FIELDS = ("count", *(name for name in metrics_.sum_names([*METRICS.values(), *EXTRA.values()]) if name != "count"))
SUMS = metrics_.sums_of(FIELDS[1:], LEVELS)  # what each window adds up ("count" is its labels')


def seasonal_errors(histories, season):
    """[N] float64: each history's mean |y_t - y_(t-m)| over the pairs with no NaN (gluonts' masked
    seasonal_error, utils.metrics.seasonal_naive_error), m 1 where the season exceeds the history; 0 where there
    is no such pair, which leaves the window out of MASE, MSIS and SQL."""
    out = np.zeros(len(histories))
    for i, history in enumerate(histories):
        error = metrics_.seasonal_naive_error(history, 1 if season > len(history) else season)
        out[i] = 0.0 if math.isnan(error) else error
    return out


def tail_quantiles(quantiles):
    """[B, P] each: the 0.025 and 0.975 quantiles gluonts' QuantileForecast extrapolates from the nine levels."""
    q, tol = quantiles, TAIL_TOL
    x0, x1, x_2, x_1 = LEVELS[0], LEVELS[1], LEVELS[-2], LEVELS[-1]
    lo, hi = MSIS_ALPHA / 2, 1.0 - MSIS_ALPHA / 2
    beta_left = (q[:, 1] - q[:, 0]) / np.log((x1 + tol) / (x0 + tol) + tol)
    beta_right = (q[:, -1] - q[:, -2]) / np.log((1 - x_2 + tol) / (1 - x_1 + tol) + tol)
    lower = beta_left * np.log((lo + tol) / (x1 + tol) + tol) + q[:, 1]
    upper = beta_right * np.log((1 - x_2 + tol) / (1 - hi + tol) + tol) + q[:, -2]
    return lower, upper


def window_sums(label, mean, quantiles, scale):
    """[B, len(FIELDS)] float64: each window's sums. label [B, P] (NaN = missing), mean [B, P] (None: the
    median), quantiles [B, 9, P] at LEVELS or None for a point forecast (then mean is the point forecast and
    the quantile sums are NaN), scale [B] seasonal errors."""
    y = np.asarray(label, np.float64)
    ok = np.isfinite(y)
    y0 = np.where(ok, y, 0.0)
    if quantiles is not None:
        q = np.asarray(quantiles, np.float64)
        median = q[:, LEVELS.index(0.5)]
        mean = median if mean is None else np.asarray(mean, np.float64)
    else:
        median = mean = np.asarray(mean, np.float64)
    scale = np.asarray(scale, np.float64)[:, None]
    if quantiles is None:
        e = metrics_.Elements(y0, median, mean=mean, scale=scale)
    else:
        e = metrics_.Elements(y0, median, np.moveaxis(q, 1, -1), np.array(LEVELS), LEVELS, LEVELS, mean=mean,
                              scale=scale, low=(ends := tail_quantiles(q))[0], high=ends[1], alpha=MSIS_ALPHA)
    parts = {"count": ok.sum(1).astype(np.float64)}
    for definition in SUMS:
        if not definition.available(e):  # a point forecast's quantile sums
            parts.update(dict.fromkeys(definition.names, np.full(len(y), np.nan)))
            continue
        values = definition.term(e)
        if definition.family:
            parts.update((name, _total(values[..., i], ok)) for i, name in enumerate(definition.names))
        elif isinstance(values, tuple):  # (values, where): counted only where
            parts[definition.name] = _total(values[0], ok & values[1])
        elif values.dtype == bool:  # a count
            parts[definition.name] = (values & ok).sum(1).astype(np.float64)
        else:
            parts[definition.name] = _total(values, ok)
    return np.stack([parts[name] for name in FIELDS], axis=1)


def _total(values, where):
    """[B]: each window's sum of the values where `where` (a missing label's step counts in no sum)."""
    return np.where(where, values, 0.0).sum(1)


def metrics(rows):
    """GIFT-Eval's 11 columns (and EXTRA's) from the windows' sums [N, len(FIELDS)] (any order): NaN where
    undefined (a point forecast's MSIS, CRPS and SQL; a mean over nothing)."""
    s = {name: math.fsum(rows[:, i]) if len(rows) else 0.0 for i, name in enumerate(FIELDS)}
    return {column: metric(s) for column, metric in {**METRICS, **EXTRA}.items()}
