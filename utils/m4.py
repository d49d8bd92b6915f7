"""M4 short-term forecasting: the competition's facts, its metrics, Naive2 and TSLib's summary table.

Sources of the facts (numbers written here, no code taken):
- Makridakis, Spiliotis, Assimakopoulos, "The M4 Competition: 100,000 time series and 61 forecasting
  methods", IJF 36(1), 2020, and the competition's guide: horizons 6 / 8 / 18 / 13 / 14 / 48 for
  Yearly / Quarterly / Monthly / Weekly / Daily / Hourly, sMAPE and MASE as defined there, OWA the mean
  of the two relative to Naive2.
- Naive2 as the organisers' reference code (M4-methods, "Benchmarks and Evaluation.R") defines it: a
  series with frequency > 1 is tested for seasonality (at least 3 years of data, ppy within R's acf lags
  (10 log10 n), and |acf(ppy)| above
  1.645 / sqrt(n) x sqrt(1 + 2 sum_{k<ppy} acf(k)^2), a 90 % test), a seasonal one is divided by the
  seasonal component of R's classical multiplicative decomposition (`decompose`: a centred moving
  average of the frequency, 2 x ppy for an even one, the ratio to it averaged per position in the year
  and normalised to mean 1); the last value of the adjusted series is repeated, and the forecast
  multiplied back by the last year's seasonal indices.
- TSLib (thuml/Time-Series-Library 4e938a1, utils/m4_summary.py, from N-BEATS): the summary's layout,
  columns Yearly / Quarterly / Monthly / Others / Average, where Others is the mean of Weekly, Daily and
  Hourly weighted by their numbers of series and Average the mean of all six so weighted; MASE's scale is
  the in-sample seasonal naive error at M4-info.csv's Frequency; sMAPE counts 0 / 0 as 0; OWA is taken on
  the grouped figures; M4's own Naive2 forecasts (submission-Naive2.csv) are read as float32, as TSLib
  reads them. lab/m4_crosscheck.py checks every figure against TSLib's m4_summary to 1e-9.

Everything here is float64 NumPy on whole frequencies, computed once, on one process (rank 0), from the
forecasts every rank gathered: the summary does not depend on how many processes forecast.
"""
import math
import os

import numpy as np

from utils import metrics
from utils.errors import UserError, require

SEASONAL_PATTERNS = ("Yearly", "Quarterly", "Monthly", "Weekly", "Daily", "Hourly")
HORIZONS = {"Yearly": 6, "Quarterly": 8, "Monthly": 18, "Weekly": 13, "Daily": 14, "Hourly": 48}
FREQUENCIES = {"Yearly": 1, "Quarterly": 4, "Monthly": 12, "Weekly": 1, "Daily": 1, "Hourly": 24}
# TSLib's (N-BEATS' interpretable.gin) training windows: cut points in the last history_size x horizon steps
HISTORY_SIZE = {"Yearly": 1.5, "Quarterly": 1.5, "Monthly": 1.5, "Weekly": 10, "Daily": 10, "Hourly": 10}
OTHERS = ("Weekly", "Daily", "Hourly")
COLUMNS = ("Yearly", "Quarterly", "Monthly", "Others", "Average")
ROWS = ("SMAPE", "MAPE", "MASE", "OWA")
NAIVE2_FILE = "submission-Naive2.csv"


def check_pattern(pattern):
    require(pattern in SEASONAL_PATTERNS, f"unknown --seasonal_patterns '{pattern}'; M4's are "
                                          f"{', '.join(SEASONAL_PATTERNS)}")
    return pattern


# ---------------------------------------------------------------- metrics, as TSLib's m4_summary
# the terms are utils.metrics' (sape, ape, seasonal_naive_error); M4's reductions are its own: sMAPE and MAPE the
# mean over every element (0 / 0 counted as 0), MASE the mean over series of each series' MAE over its scale
def smape_terms(forecast, target):
    """200 |f - y| / (|f| + |y|) per element, 0 where both are 0."""
    return metrics.sape(target, forecast, factor=200)[0]


def mape_terms(forecast, target):
    """100 |f - y| / |y| per element, 100 |f - y| where y is 0 (TSLib divides by 1 there)."""
    return metrics.ape(target, forecast, factor=100)[0]


def mase_scale(insample, frequency):
    """The in-sample seasonal naive mean absolute error at `frequency` (MASE's denominator)."""
    return metrics.seasonal_naive_error(insample, frequency)


def series_mase(forecast, insample, target, frequency):
    """A series' MASE, as M4's scoring defines it: inf where its scale is 0 (a history that repeats itself at the
    lag) and the forecast errs, NaN where it does not; the same figure then for its frequency and OWA
    (exp.outputs names the series in the run's warning line, zero_scale_series)."""
    with np.errstate(divide="ignore", invalid="ignore"):  # the figure says it; numpy's warning would be a 2nd line
        return np.mean(np.abs(np.asarray(forecast, np.float64) - target)) / mase_scale(insample, frequency)


def zero_scale_series(insample, frequency):
    """The positions of the series among `insample` whose MASE scale is 0, so that MASE is undefined for them."""
    return [i for i, series in enumerate(insample) if mase_scale(series, frequency) == 0]


# ---------------------------------------------------------------- Naive2 (M4's reference)
def _acf(x, lag):
    """R's acf at `lag`: the lagged products about the mean over the sum of squares."""
    d = x - x.mean()
    return float(np.dot(d[lag:], d[:-lag]) / np.dot(d, d))


def seasonal(x, ppy):
    """M4's 90 % seasonality test (SeasonalityTest of the reference R code)."""
    # R's acf stops at lag 10 log10(n): a longer season has no acf there (NA), and the test says not seasonal
    if ppy <= 1 or len(x) < 3 * ppy or ppy > min(math.floor(10 * math.log10(len(x))), len(x) - 1):
        return False
    acfs = np.array([_acf(x, k) for k in range(1, ppy + 1)])
    limit = 1.645 / math.sqrt(len(x)) * math.sqrt(1 + 2 * np.sum(acfs[:-1] ** 2))
    return abs(acfs[-1]) > limit


def seasonal_indices(x, ppy):
    """R's decompose(type = "multiplicative")$figure: the mean ratio of x to its centred moving average
    at each position of the year (position i % ppy of the series, which starts a year), mean 1."""
    n = len(x)
    weights = np.full(ppy + 1, 1.0 / ppy) if ppy % 2 == 0 else np.full(ppy, 1.0 / ppy)
    if ppy % 2 == 0:
        weights[0] = weights[-1] = 0.5 / ppy
    half = len(weights) // 2
    trend = np.full(n, np.nan)
    trend[half:n - half] = np.convolve(x, weights[::-1], mode="valid")
    ratio = x / trend
    figure = np.array([np.nanmean(ratio[p::ppy]) for p in range(ppy)])
    return figure / figure.mean()


def naive2(insample, horizon, ppy):
    """Naive2 forecast of one series (float64): seasonally adjusted naive where M4's test finds a season."""
    x = np.asarray(insample, dtype=np.float64)
    if not seasonal(x, ppy):
        return np.full(horizon, x[-1])
    figure = seasonal_indices(x, ppy)
    n = len(x)
    return x[-1] / figure[(n - 1) % ppy] * figure[(n + np.arange(horizon)) % ppy]


# ---------------------------------------------------------------- the summary
class M4Sets:
    """What the summary reads of an M4 folder: each frequency's series count over the whole of M4-info.csv,
    its Frequency (MASE's lag), the training series (in-sample) and the test horizons, in M4-info's order."""

    def __init__(self, counts, frequency, insample, target):
        self.counts, self.frequency, self.insample, self.target = counts, frequency, insample, target


def group_figures(model, naive, sets, pattern):
    """(sMAPE, MAPE, MASE, Naive2's sMAPE, Naive2's MASE) of one frequency: element means for the percentage
    errors, series means for MASE (as TSLib's m4_summary)."""
    target, insample, frequency = sets.target[pattern], sets.insample[pattern], sets.frequency[pattern]
    require(model.shape == target.shape, f"{pattern}: {model.shape[0]} forecasts of {model.shape[1]} steps, "
                                         f"but the test set holds {target.shape[0]} series of {target.shape[1]}")

    def mean_mase(forecast):
        return np.mean([series_mase(f, s, y, frequency) for f, s, y in zip(forecast, insample, target)])
    return (np.mean(smape_terms(model, target)), np.mean(mape_terms(model, target)), mean_mase(model),
            np.mean(smape_terms(naive, target)), mean_mase(naive))


def summarize(scores, counts):
    """{column: figure}: Yearly, Quarterly, Monthly as they are; Others and Average weighted by series counts."""
    summary = {p: scores[p] for p in ("Yearly", "Quarterly", "Monthly")}
    others = sum(counts[p] for p in OTHERS)
    summary["Others"] = sum(scores[p] * counts[p] for p in OTHERS) / others
    summary["Average"] = sum(scores[p] * counts[p] for p in SEASONAL_PATTERNS) / sum(counts.values())
    return summary


def m4_summary(forecasts, naive2_forecasts, sets):
    """{row: {column: figure}} for rows SMAPE, MAPE, MASE, OWA (TSLib's m4_summary, unrounded). `forecasts`
    and `naive2_forecasts`: {pattern: [series, horizon] float64}, every one of the six frequencies."""
    parts = {p: group_figures(forecasts[p], naive2_forecasts[p], sets, p) for p in SEASONAL_PATTERNS}
    rows = {name: summarize({p: parts[p][i] for p in SEASONAL_PATTERNS}, sets.counts)
            for i, name in enumerate(("SMAPE", "MAPE", "MASE", "naive2_smape", "naive2_mase"))}
    rows["OWA"] = {c: (rows["MASE"][c] / rows["naive2_mase"][c] + rows["SMAPE"][c] / rows["naive2_smape"][c]) / 2
                   for c in COLUMNS}
    return {name: rows[name] for name in ROWS}


def summary_table(summary):
    """TSLib's layout as text: one row per metric, the five columns."""
    lines = ["       " + "".join(f"{c:>11}" for c in COLUMNS)]
    lines += [f"{row:<7}" + "".join(f"{summary[row][c]:11.3f}" for c in COLUMNS) for row in ROWS]
    return "\n".join(lines)


# ---------------------------------------------------------------- forecast files (TSLib's m4_results layout)
def forecast_file(folder, pattern):
    return os.path.join(folder, f"{pattern}_forecast.csv")


def write_forecasts(folder, pattern, forecasts):
    """{pattern}_forecast.csv as TSLib writes it: columns V1..V{horizon}, one row per series in M4-info.csv's
    order and no id column (TSLib's m4_summary reads every column as forecasts, so it reads this file as it
    reads its own); written atomically, so a killed run leaves no half file."""
    os.makedirs(folder, exist_ok=True)
    path = forecast_file(folder, pattern)
    header = ",".join(f"V{i + 1}" for i in range(forecasts.shape[1]))
    rows = [",".join(repr(float(v)) for v in row) for row in forecasts]
    with open(path + ".tmp", "w") as f:
        f.write("\n".join([header, *rows]) + "\n")
    os.replace(path + ".tmp", path)
    return path


def read_forecasts(folder, pattern):
    """[series, horizon] float64 of {pattern}_forecast.csv."""
    import pandas as pd

    return pd.read_csv(forecast_file(folder, pattern)).to_numpy(dtype=np.float64)


def missing_forecasts(folder):
    return [p for p in SEASONAL_PATTERNS if not os.path.exists(forecast_file(folder, p))]


def naive2_forecasts(root_path, sets, ids):
    """{pattern: [series, horizon]} for the frequencies of `ids` ({pattern: series ids}): M4's own Naive2 forecasts from submission-Naive2.csv where the folder has it
    (read as float32, as TSLib reads them), else computed here (naive2)."""
    path = None if root_path is None else os.path.join(root_path, NAIVE2_FILE)  # None: no organisers' file
    if path is None or not os.path.exists(path):
        return {p: np.stack([naive2(s, sets.target[p].shape[1], sets.frequency[p]) for s in sets.insample[p]])
                for p in ids}
    import pandas as pd

    frame = pd.read_csv(path)
    values = dict(zip(frame.iloc[:, 0].astype(str), frame.iloc[:, 1:].to_numpy().astype(np.float32)))
    out = {}
    for p in ids:
        missing = [i for i in ids[p] if i not in values]
        if missing:
            raise UserError(f"{path} has no Naive2 forecast for series {missing[0]} ({len(missing)} of {p}); "
                            f"give M4's file whole, or remove it to compute Naive2 here")
        h = sets.target[p].shape[1]
        out[p] = np.stack([values[i][:h] for i in ids[p]]).astype(np.float64)
    return out
