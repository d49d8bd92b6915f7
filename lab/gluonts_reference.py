"""The probabilistic metrics' expected figures, computed by gluonts itself (tests/golden/probabilistic/).

utils.metrics.ProbabilisticSums must give gluonts' figures (gluonts.ev, evaluated through
gluonts.model.evaluate_model as GIFT-Eval evaluates: axis=None, mask_invalid_label=True,
allow_nan_forecast=False) to 1e-9 relative; tests/test_probabilistic_metrics.py compares it with
the figures this script commits. gluonts 0.17 needs pandas < 3 (this project runs pandas 3), so the
script runs in its own virtual environment, outside the repository, and imports nothing from it but
golden_files.py beside it:

    python -m venv /work/venvs/gluonts
    /work/venvs/gluonts/bin/pip install 'gluonts==0.17.*' 'pandas<3' numpy packaging
    /work/venvs/gluonts/bin/python lab/gluonts_reference.py            # writes nothing if unchanged
    /work/venvs/gluonts/bin/python lab/gluonts_reference.py --check    # exit 1 if the files differ

(the committed figures came from gluonts 0.17.0, pandas 2.3.3, numpy 2.4.6; the versions are in
expected.json).

The fixtures (fixtures.npz) are built here from a fixed seed: three series of two channels with
histories of 60, 20 and 13 rows at frequencies h, D and B (seasonality 24, 1 and 5), and 4, 3 and 2
windows of 6 steps each, with quantile forecasts at 13 levels and their truths. Each (window,
channel) is one gluonts item whose past data is its series' history. Awkward cases planted:
a constant history channel (seasonal error 0: gluonts drops its elements from MASE and MSIS),
a truth of 0 forecast as 0 by the median (0 / 0 in sMAPE: dropped), a truth of 0 with a non-zero
median, and truths exactly on a quantile (interval coverage counts both ends).

Interval coverage is not a gluonts metric (gluonts' Coverage(q) is the one-sided share of truths
at or below the q-quantile), so the coverage figures are computed here with plain numpy:
the share of truths y with q_lo <= y <= q_hi.
"""
import argparse
import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "golden" / "probabilistic"
LEVELS = (0.05, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95)
GIFT_EVAL_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
SUBSET_LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)  # without GIFT-Eval's nine: WQL over these
INTERVALS = {"coverage_50": (0.25, 0.75), "coverage_80": (0.1, 0.9), "coverage_90": (0.05, 0.95)}
HORIZON = 6
SERIES = (  # (frequency, history rows, windows)
    ("h", 60, 4),
    ("D", 20, 3),
    ("B", 13, 2),
)
# get_seasonality for the frequencies utils.metrics.seasonality must agree on (pandas' spelling)
FREQS = ("s", "10s", "min", "5min", "15min", "h", "2h", "5h", "D", "7D", "W", "W-SUN", "ME", "MS",
         "B", "QE", "QS", "YE", "ms")


def build_fixtures(seed=38):
    rng = np.random.default_rng(seed)
    histories, quantiles, truths, series_of = [], [], [], []
    for s, (_, rows, windows) in enumerate(SERIES):
        t = np.arange(rows + windows * HORIZON)
        season = (24, 7, 5)[s]
        level = np.array([10.0, 250.0])
        wave = np.sin(2 * np.pi * t / season)[:, None] * np.array([3.0, 40.0])
        values = level + wave + rng.normal(0, 1, (len(t), 2)) * np.array([1.0, 15.0])
        if s == 2:
            values[:, 1] = 7.5  # a constant channel: its seasonal error is 0
        histories.append(values[:rows])
        for w in range(windows):
            truth = values[rows + w * HORIZON: rows + (w + 1) * HORIZON].copy()
            spread = np.abs(truth).mean(0) * 0.05 + 0.5
            median = truth + rng.normal(0, 1, truth.shape) * spread
            z = np.sort(rng.normal(0, 1, truth.shape + (len(LEVELS),)), axis=-1)
            q = median[..., None] + spread[:, None] * (z - z[..., 6:7])  # sorted, level 0.5 = median
            truths.append(truth)
            quantiles.append(q)
            series_of.append(s)
    truths, quantiles = np.stack(truths), np.stack(quantiles)
    # a truth of 0 forecast as 0 by the median, and a truth of 0 forecast as non-zero (series 1)
    w1 = series_of.index(1)
    truths[w1, 2, 0] = 0.0
    quantiles[w1, 2, 0] -= quantiles[w1, 2, 0, 6]
    truths[w1 + 1, 4, 0] = 0.0
    # truths exactly on an interval's ends
    truths[0, 1, 0] = quantiles[0, 1, 0, LEVELS.index(0.1)]
    truths[1, 3, 1] = quantiles[1, 3, 1, LEVELS.index(0.95)]
    return {
        "levels": np.array(LEVELS),
        "freqs": np.array([f for f, _, _ in SERIES]),
        "series": np.array(series_of),
        "quantiles": quantiles,  # [W, P, C, L]
        "truths": truths,  # [W, P, C]
        **{f"history_{s}": h for s, h in enumerate(histories)},  # [T_s, C]
    }


class StoredForecasts:
    """A gluonts predictor that returns the fixture's forecasts, in the order of the items."""

    def __init__(self, forecasts):
        self.forecasts = forecasts

    def predict(self, dataset, **kwargs):
        yield from self.forecasts


def gluonts_figures(fx):
    import pandas as pd
    from gluonts.ev.metrics import (MAE, MASE, MSE, MSIS, SMAPE, MeanWeightedSumQuantileLoss)
    from gluonts.ev.ts_stats import seasonal_error
    from gluonts.model import evaluate_model
    from gluonts.model.forecast import QuantileForecast
    from gluonts.time_feature import get_seasonality

    keys = [str(level) for level in fx["levels"]]
    inputs, labels, forecasts = [], [], []
    for w, s in enumerate(fx["series"]):
        start = pd.Period("2020-01-01", freq=str(fx["freqs"][s]))
        history = fx[f"history_{s}"]
        for c in range(history.shape[1]):
            inputs.append({"target": history[:, c], "start": start, "item_id": f"{w}_{c}"})
            labels.append({"target": fx["truths"][w, :, c], "start": start + len(history)})
            forecasts.append(QuantileForecast(fx["quantiles"][w, :, c, :].T, start_date=start + len(history),
                                              forecast_keys=keys, item_id=f"{w}_{c}"))

    class TestData:  # gluonts.dataset.split.TestData's two fields, as evaluate_model reads them
        input, label = inputs, labels

    def evaluate(metrics):
        frame = evaluate_model(StoredForecasts(forecasts), test_data=TestData, metrics=metrics, axis=None,
                               mask_invalid_label=True, allow_nan_forecast=False)
        return {name: float(frame[name].iloc[0]) for name in frame.columns}

    metrics = evaluate([MeanWeightedSumQuantileLoss(quantile_levels=list(GIFT_EVAL_LEVELS)), MASE(), SMAPE(),
                        MSIS(alpha=0.1), MSE(forecast_type=0.5), MAE(forecast_type=0.5)])
    subset = evaluate([MeanWeightedSumQuantileLoss(quantile_levels=list(SUBSET_LEVELS)), MSIS(alpha=0.1)])
    expected = {
        "wql": metrics["mean_weighted_sum_quantile_loss"],
        "wql_levels": list(GIFT_EVAL_LEVELS),
        "mase": metrics["MASE[0.5]"],
        "smape": metrics["sMAPE[0.5]"],
        "msis": metrics["MSIS"],
        **interval_coverage(fx, LEVELS),
    }
    expected_subset = {
        "wql": subset["mean_weighted_sum_quantile_loss"],
        "wql_levels": list(SUBSET_LEVELS),
        "msis": subset["MSIS"],
        **interval_coverage(fx, SUBSET_LEVELS),
    }
    seasons = [get_seasonality(str(f)) for f in fx["freqs"]]
    errors = [[float(seasonal_error(fx[f"history_{s}"][:, c], season)[0]) for c in range(2)]
              for s, season in enumerate(seasons)]
    import gluonts
    return {
        "made_by": "lab/gluonts_reference.py",
        "versions": {"gluonts": gluonts.__version__, "pandas": pd.__version__, "numpy": np.__version__},
        "metrics": expected,
        "metrics_subset_levels": expected_subset,
        "median_mse": metrics["MSE[0.5]"],
        "median_mae": metrics["MAE[0.5]"],
        "seasonality": seasons,
        "seasonal_error": errors,
        "get_seasonality": {f: get_seasonality(f) for f in FREQS},
    }


def interval_coverage(fx, levels):
    """Share of truths within [q_lo, q_hi], both ends included (plain numpy: not a gluonts metric)."""
    out = {}
    index = {level: i for i, level in enumerate(fx["levels"].tolist())}
    for name, (lo, hi) in INTERVALS.items():
        if lo in levels and hi in levels:
            q, y = fx["quantiles"], fx["truths"]
            inside = (q[..., index[lo]] <= y) & (y <= q[..., index[hi]])
            out[name] = float(inside.mean())
    return out


def main():
    from golden_files import write_or_check  # beside this script (run as a file): stdlib and numpy only

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    check = parser.parse_args().check
    fx = build_fixtures()
    expected = json.dumps(gluonts_figures(fx), indent=1, sort_keys=True) + "\n"
    write_or_check({OUT / "fixtures.npz": fx, OUT / "expected.json": expected}, check, compressed=False)


if __name__ == "__main__":
    main()
