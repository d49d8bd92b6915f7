"""GIFT-Eval's own pipeline on small synthetic data sets: the seasonal naive rows its code writes
(tests/golden/gift_eval/official.json), which tests/test_gift_eval.py compares the harness's rows with.

With a checkout of github.com/SalesforceAIResearch/gift-eval (`--gift_eval PATH`), this script writes the data
sets of `synthetic_sets()` as Hugging Face `datasets` saves them, then runs, for each configuration, what
notebooks/naive.ipynb runs: src/gift_eval/data.py's Dataset (prediction length, windows, to_univariate, test
split), the notebook's StatsForecastPredictor (its code cell executed from the checkout) with statsforecast's
SeasonalNaive at the nine levels, and gluonts' evaluate_model with the notebook's 11 metrics. Nothing of
GIFT-Eval's is copied here; it runs in its own environment, outside the repository:

    python -m venv /work/venvs/statsforecast
    /work/venvs/statsforecast/bin/pip install 'statsforecast==2.0.1' 'pandas<3' datasets 'gluonts==0.17.*' \
        python-dotenv toolz

(statsforecast 2.1 refuses the interval level 0 that naive.ipynb asks for the median.)
    /work/venvs/statsforecast/bin/python lab/gift_eval_official.py --gift_eval ../gift-eval [--check]

GIFT-Eval's pipeline computes in float32 (the Arrow data, statsforecast on float32 input), the harness in
float64: the rows agree to 2.9e-7 relative; the test's tolerance is 1e-6.
"""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "golden" / "gift_eval" / "official.json"
LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def synthetic_sets(seed=11):
    """{GIFT-Eval name: (freq, [float32 targets])}: several frequencies, NaN gaps, a multivariate set, an m4 set."""
    rng = np.random.default_rng(seed)

    def wave(n, period, level=10.0):
        return (level + 3 * np.sin(2 * np.pi * np.arange(n) / period) + rng.normal(0, 0.5, n)).astype(np.float32)

    hourly = [wave(1100, 24), wave(800, 24), wave(900, 24, 50.0)]
    hourly[0][100:105] = np.nan
    hourly[1][-10] = np.nan
    hourly[2][-300] = np.nan
    multi = [np.stack([wave(1000, 96, level) for level in (1.0, 5.0, 20.0)]) for _ in range(2)]
    multi[1][1, 500:510] = np.nan
    return {"electricity/H": ("H", hourly), "ett1/15T": ("15T", multi),
            "hospital": ("M", [wave(80, 12), wave(60, 12, 30.0), wave(100, 12)]),
            "m4_weekly": ("W-SUN", [wave(60, 52), wave(100, 52)]),
            "bizitobs_application": ("10S", [np.stack([wave(2000, 360), wave(2000, 360, 3.0)])])}


def save(root, sets):
    import datasets

    for name, (freq, targets) in sets.items():
        multivariate = targets[0].ndim == 2
        values = datasets.Sequence(datasets.Value("float32"))
        features = datasets.Features({"item_id": datasets.Value("string"), "start": datasets.Value("timestamp[s]"),
                                      "freq": datasets.Value("string"),
                                      "target": datasets.Sequence(values) if multivariate else values})
        table = {"item_id": [f"item_{i}" for i in range(len(targets))],
                 "start": [np.datetime64("2020-01-01T00:00:00", "s")] * len(targets), "freq": [freq] * len(targets),
                 "target": [t.tolist() for t in targets]}
        datasets.Dataset.from_dict(table, features=features).save_to_disk(str(Path(root) / name))


def notebook_predictor(checkout):
    """naive.ipynb's StatsForecastPredictor cell, executed from the checkout, with SeasonalNaive."""
    cells = json.loads((Path(checkout) / "notebooks" / "naive.ipynb").read_text())["cells"]
    code = next("".join(c["source"]) for c in cells if "class StatsForecastPredictor" in "".join(c["source"]))
    namespace = {}
    exec(compile(code, "naive.ipynb", "exec"), namespace)
    from statsforecast.models import SeasonalNaive

    return type("SeasonalNaivePredictor", (namespace["StatsForecastPredictor"],), {"ModelType": SeasonalNaive})


def official_rows(checkout, root, names):
    sys.path.insert(0, str(Path(checkout) / "src"))
    os.environ["GIFT_EVAL"] = str(root)
    from gift_eval.data import Dataset
    from gluonts.ev.metrics import MAE, MAPE, MASE, MSE, MSIS, ND, NRMSE, RMSE, SMAPE, MeanWeightedSumQuantileLoss
    from gluonts.model import evaluate_model
    from gluonts.time_feature import get_seasonality

    metrics = [MSE(forecast_type="mean"), MSE(forecast_type=0.5), MAE(), MASE(), MAPE(), SMAPE(), MSIS(), RMSE(),
               NRMSE(), ND(), MeanWeightedSumQuantileLoss(quantile_levels=LEVELS)]
    predictor_class = notebook_predictor(checkout)
    med_long = {"electricity/H", "ett1/15T", "bizitobs_application"}  # as in GIFT-Eval's med_long list
    rows = {}
    for name in names:
        for term in ("short", "medium", "long"):
            if term != "short" and name not in med_long:
                continue
            to_univariate = Dataset(name=name, term=term, to_univariate=False).target_dim > 1
            dataset = Dataset(name=name, term=term, to_univariate=to_univariate)
            season = get_seasonality(dataset.freq)
            predictor = predictor_class(dataset.prediction_length, season_length=season, freq=dataset.freq,
                                        quantile_levels=LEVELS, batch_size=512)
            res = evaluate_model(predictor, test_data=dataset.test_data, metrics=metrics, batch_size=512, axis=None,
                                 mask_invalid_label=True, allow_nan_forecast=False, seasonality=season)
            rows[f"{name}|{term}"] = {"windows": dataset.windows, "prediction_length": dataset.prediction_length,
                                      **{col: float(res[col].iloc[0]) for col in res.columns}}
    return rows


def main():
    from golden_files import write_or_check  # beside this script (run as a file): stdlib and numpy only

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gift_eval", required=True, help="a checkout of SalesforceAIResearch/gift-eval")
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args()
    import datasets
    import gluonts
    import statsforecast

    sets = synthetic_sets()
    with tempfile.TemporaryDirectory() as root:
        save(root, sets)
        rows = official_rows(args.gift_eval, root, list(sets))
    text = json.dumps({"made_by": "lab/gift_eval_official.py", "rows": rows,
                       "versions": {"gluonts": gluonts.__version__, "statsforecast": statsforecast.__version__,
                                    "datasets": datasets.__version__}}, indent=1, sort_keys=True) + "\n"
    write_or_check({OUT: text}, args.check)


if __name__ == "__main__":
    main()
