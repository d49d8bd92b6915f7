"""GIFT-Eval's figures for fixed forecasts, computed by gluonts itself (tests/golden/gift_eval/).

tests/test_gift_eval.py runs benchmarks.gift_eval on the same series and forecasts and compares its
all_results.csv with these figures to 1e-9 relative. This script reproduces what GIFT-Eval's notebooks do
(src/gift_eval/data.py's Dataset.test_data: gluonts' split at -prediction_length * windows, then
generate_instances(prediction_length, windows, distance=prediction_length); a multivariate set scored as its
variates, item then variate; evaluate_model(axis=None, mask_invalid_label=True, allow_nan_forecast=False,
seasonality=get_seasonality(freq)) with the notebooks' 11 metrics), with the prediction lengths and window
counts written in (12 for monthly short, 48 / 480 hourly short / medium; the harness derives them from its
rules and the test checks they agree). gluonts 0.17 needs pandas < 3, so it runs in its own environment and
imports nothing from the repository but golden_files.py beside it (stdlib and numpy):

    /work/venvs/gluonts/bin/python lab/gift_eval_reference.py           # writes nothing if unchanged
    /work/venvs/gluonts/bin/python lab/gift_eval_reference.py --check   # exit 1 if the files differ

The series are float32 as GIFT-Eval's Arrow files hold them, the forecasts float32; both are handed to gluonts
as float64 (the same values), since gluonts computes in its inputs' dtype and the harness in float64.
Awkward cases planted: NaN gaps in histories and in scored windows (masked), a constant series (seasonal error
0: left out of MASE and MSIS), truths of 0 (left out of MAPE; one forecast as 0 by the median, left out of
sMAPE), a NaN pair around a season (its seasonal difference masked).
"""
import argparse
import json
import math
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "golden" / "gift_eval"
LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# configuration -> (data set, freq, term, prediction length, windows)
CONFIGS = {"hospital/M/short": ("hospital", "M", "short", 12, 4),
           "ett1/H/short": ("ett1/H", "H", "short", 48, 2),
           "ett1/H/medium": ("ett1/H", "H", "medium", 480, 1)}


def build_series(seed=42):
    """{data set: list of float32 targets ([T] or [C, T])}."""
    rng = np.random.default_rng(seed)

    def wave(n, period, level):
        t = np.arange(n)
        return (level + 0.3 * level * np.sin(2 * np.pi * t / period) + rng.normal(0, 0.1 * level, n)).astype(np.float32)

    hospital = [wave(n, 12, level) for n, level in ((400, 50.0), (450, 8.0), (520, 300.0), (600, 20.0))]
    hospital.append(np.full(430, 7.0, np.float32))  # constant: seasonal error 0
    hospital[0][50:53] = np.nan  # gap in the history
    hospital[1][-30:-27] = np.nan  # gap in a scored window
    hospital[2][-5] = 0.0  # a truth of 0
    hospital[3][-14] = 0.0  # a truth of 0 the median will forecast as 0
    hospital[3][[100, 112]] = np.nan  # a NaN on both ends of a seasonal pair
    ett = [np.stack([wave(600, 24, level) for level in (1.0, 10.0, 100.0)]) for _ in range(2)]
    ett[1][2, -40:-35] = np.nan
    ett[0][0, 10] = np.nan
    return {"hospital": hospital, "ett1/H": ett}


def univariate(targets):
    return [row for t in targets for row in (t if t.ndim == 2 else [t])]


def instances(series, horizon, windows):
    """[(series, start)] in gluonts' order, from gluonts' own split (what GIFT-Eval's test_data is)."""
    import pandas as pd
    from gluonts.dataset.split import split

    entries = [{"target": s.astype(np.float64), "start": pd.Period("2000-01", freq="M"), "item_id": str(i)}
               for i, s in enumerate(series)]
    _, template = split(entries, offset=-horizon * windows)
    test = template.generate_instances(prediction_length=horizon, windows=windows, distance=horizon)
    return [(int(x["item_id"]), len(x["target"])) for x in test.input], test


def forecasts_for(rng, labels):
    """Random quantile forecasts around the truth (sorted levels, the median at 0.5) and a mean."""
    y = np.nan_to_num(labels.astype(np.float64), nan=1.0)
    spread = np.abs(y).mean() * 0.1 + 0.1
    median = y + rng.normal(0, 1, y.shape) * spread
    z = np.sort(rng.normal(0, 1, (len(LEVELS),) + y.shape), axis=0)
    quantiles = median[None] + spread * (z - z[4:5])
    mean = median + rng.normal(0, 0.2, y.shape) * spread
    return mean.astype(np.float32), quantiles.astype(np.float32)


def gluonts_figures(series_by_set, rng):
    from gluonts.ev.metrics import (MAE, MAPE, MASE, MSE, MSIS, ND, NRMSE, RMSE, SMAPE,
                                    MeanWeightedSumQuantileLoss)
    from gluonts.model import evaluate_model
    from gluonts.model.forecast import QuantileForecast
    from gluonts.time_feature import get_seasonality

    metrics = [MSE(forecast_type="mean"), MSE(forecast_type=0.5), MAE(), MASE(), MAPE(), SMAPE(), MSIS(), RMSE(),
               NRMSE(), ND(), MeanWeightedSumQuantileLoss(quantile_levels=list(LEVELS))]
    expected, arrays = {}, {}
    for c, (name, freq, _, horizon, windows) in CONFIGS.items():
        series = univariate(series_by_set[name])
        order, test = instances(series, horizon, windows)
        labels = np.stack([series[s][t:t + horizon] for s, t in order])
        mean, quantiles = forecasts_for(rng, labels)
        keys = ["mean", *map(str, LEVELS)]
        start = __import__("pandas").Period("2000-01", freq="M")
        predictions = [QuantileForecast(np.concatenate([mean[i][None], quantiles[:, i]]).astype(np.float64),
                                        start_date=start, forecast_keys=keys, item_id=str(s))
                       for i, (s, _) in enumerate(order)]

        class Predictor:
            def predict(self, dataset, **kwargs):
                yield from predictions

        frame = evaluate_model(Predictor(), test_data=test, metrics=metrics, batch_size=512, axis=None,
                               mask_invalid_label=True, allow_nan_forecast=False, seasonality=get_seasonality(freq))
        expected[c] = {"figures": {col: float(frame[col].iloc[0]) for col in frame.columns},
                       "instances": order, "seasonality": get_seasonality(freq)}
        key = c.replace("/", "__")
        arrays[f"{key}__mean"], arrays[f"{key}__quantiles"] = mean, quantiles
    return expected, arrays


def main():
    from golden_files import write_or_check  # beside this script (run as a file): stdlib and numpy only

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    check = parser.parse_args().check
    import gluonts
    import pandas as pd

    series_by_set = build_series()
    expected, arrays = gluonts_figures(series_by_set, np.random.default_rng(7))
    for name, targets in series_by_set.items():
        for i, t in enumerate(targets):
            arrays[f"series__{name.replace('/', '__')}__{i}"] = t
    text = json.dumps({"made_by": "lab/gift_eval_reference.py", "configurations": expected,
                       "versions": {"gluonts": gluonts.__version__, "pandas": pd.__version__,
                                    "numpy": np.__version__}}, indent=1, sort_keys=True) + "\n"
    write_or_check({OUT / "fixtures.npz": arrays, OUT / "expected.json": text}, check)
    for c, e in expected.items():
        print(c, {k: round(v, 6) if math.isfinite(v) else v for k, v in e["figures"].items()})


if __name__ == "__main__":
    main()
