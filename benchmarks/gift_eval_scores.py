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
"""
import math

import numpy as np

LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # GIFT-Eval's quantile levels (and the CRPS column's)
MSIS_ALPHA = 0.05  # gluonts' MSIS() default, which GIFT-Eval uses
TAIL_TOL = 1e-8  # ExponentialTailApproximation's tol
FIELDS = ("count", "se_mean", "se_median", "ae", "abs_label", "ape", "ape_count", "sape", "sape_count",
          "ase", "ase_count", "interval_score", "interval_count", *(f"ql{q}" for q in LEVELS))
COLUMNS = ("MSE[mean]", "MSE[0.5]", "MAE[0.5]", "MASE[0.5]", "MAPE[0.5]", "sMAPE[0.5]", "MSIS", "RMSE[mean]",
           "NRMSE[mean]", "ND[0.5]", "mean_weighted_sum_quantile_loss")


def seasonal_errors(histories, season):
    """[N] float64: each history's mean |y_t - y_(t-m)| over the pairs with no NaN (gluonts' masked
    seasonal_error); 0 where there is no such pair, which leaves the window out of MASE and MSIS."""
    out = np.zeros(len(histories))
    for i, history in enumerate(histories):
        history = np.asarray(history, np.float64)
        m = 1 if season > len(history) else season
        diffs = np.abs(history[m:] - history[:len(history) - m])
        diffs = diffs[np.isfinite(diffs)]
        out[i] = diffs.mean() if len(diffs) else 0.0
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

    def total(values, where=ok):
        return np.where(where, values, 0.0).sum(1)

    def count(where):
        return (where & ok).sum(1).astype(np.float64)

    err = np.abs(y0 - median)
    scale = np.asarray(scale, np.float64)[:, None]
    scaled = (scale != 0) & ok
    safe = np.where(scale != 0, scale, 1.0)
    sape_ok = (np.abs(y0) + np.abs(median)) != 0
    ape_ok = y0 != 0
    parts = [ok.sum(1).astype(np.float64), total((y0 - mean) ** 2), total(err ** 2), total(err), total(np.abs(y0)),
             total(err / np.where(ape_ok, np.abs(y0), 1.0), ok & ape_ok), count(ape_ok),
             total(2 * err / np.where(sape_ok, np.abs(y0) + np.abs(median), 1.0), ok & sape_ok), count(sape_ok),
             total(err / safe, scaled), count(scale != 0)]
    if quantiles is None:
        parts += [np.full(len(y), np.nan)] * (2 + len(LEVELS))
    else:
        lower, upper = tail_quantiles(q)
        a = MSIS_ALPHA
        score = (upper - lower + 2.0 / a * (lower - y0) * (y0 < lower) + 2.0 / a * (y0 - upper) * (y0 > upper))
        parts += [total(score / safe, scaled), count(scale != 0)]
        for i, tau in enumerate(LEVELS):
            parts.append(total(2 * np.abs((y0 - q[:, i]) * ((q[:, i] >= y0) - tau))))
    return np.stack(parts, axis=1)


def metrics(rows):
    """GIFT-Eval's 11 columns from the windows' sums [N, len(FIELDS)] (any order): NaN where undefined
    (a point forecast's MSIS and CRPS; a mean over nothing)."""
    s = {name: math.fsum(rows[:, i]) if len(rows) else 0.0 for i, name in enumerate(FIELDS)}

    def ratio(a, b):
        return a / b if b else (math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a))

    mse_mean = ratio(s["se_mean"], s["count"])
    wql = [ratio(s[f"ql{q}"], s["abs_label"]) for q in LEVELS]
    return {"MSE[mean]": mse_mean, "MSE[0.5]": ratio(s["se_median"], s["count"]),
            "MAE[0.5]": ratio(s["ae"], s["count"]), "MASE[0.5]": ratio(s["ase"], s["ase_count"]),
            "MAPE[0.5]": ratio(s["ape"], s["ape_count"]), "sMAPE[0.5]": ratio(s["sape"], s["sape_count"]),
            "MSIS": ratio(s["interval_score"], s["interval_count"]), "RMSE[mean]": math.sqrt(mse_mean),
            "NRMSE[mean]": ratio(math.sqrt(mse_mean), ratio(s["abs_label"], s["count"])),
            "ND[0.5]": ratio(s["ae"], s["abs_label"]),
            "mean_weighted_sum_quantile_loss": float(np.mean(np.array(wql)))}
