"""The baselines' expected forecasts, computed by statsforecast itself (tests/golden/gift_eval/statsforecast.json).

GIFT-Eval's seasonal naive and naive rows come from statsforecast's SeasonalNaive and Naive with prediction
intervals at the levels that give its nine quantiles (notebooks/naive.ipynb: level 80 gives 0.1 and 0.9, ...,
the mean is 0.5). benchmarks/gift_eval.py writes the same methods without statsforecast (which is not a
dependency here); tests/test_gift_eval.py compares them with these figures. statsforecast runs in its own
environment, outside the repository, and this script imports nothing from it but golden_files.py beside it:

    python -m venv /work/venvs/statsforecast
    /work/venvs/statsforecast/bin/pip install 'statsforecast==2.0.1' 'pandas<3'

(2.0.1, the venv lab/gift_eval_official.py also needs: statsforecast 2.1 refuses the level 0 that GIFT-Eval's
notebook asks for the median; 2.1.1 gives these figures unchanged.)
    /work/venvs/statsforecast/bin/python lab/gift_eval_statsforecast.py           # writes if changed
    /work/venvs/statsforecast/bin/python lab/gift_eval_statsforecast.py --check   # exit 1 if it differs

Histories are float64 (statsforecast computes in its input's dtype; GIFT-Eval's float32 data gives float32
forecasts). Cases: several seasons and horizons longer than a season, a history of exactly one season
(no residual: a zero spread), a season of 1.
"""
import argparse
import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "golden" / "gift_eval" / "statsforecast.json"
LEVELS = (80, 60, 40, 20)  # intervals whose ends are the quantiles 0.1 ... 0.4 and 0.6 ... 0.9
CASES = ((50, 12, 18), (200, 24, 48), (13, 12, 30), (12, 12, 5), (7, 1, 10))  # (history, season, horizon)


def figures(seed=3):
    import statsforecast
    from statsforecast.models import Naive, SeasonalNaive

    rng = np.random.default_rng(seed)
    cases = []
    for rows, season, horizon in CASES:
        y = rng.normal(10, 2, rows).cumsum() / 10 + np.sin(np.arange(rows) * 2 * np.pi / max(season, 2))
        case = {"history": y.tolist(), "season": season, "horizon": horizon}
        for name, model in (("naive", Naive()), ("seasonal_naive", SeasonalNaive(season_length=season))):
            f = model.forecast(y=y, h=horizon, level=list(LEVELS))
            quantiles = [f[f"lo-{lv}"] for lv in LEVELS] + [f["mean"]] + [f[f"hi-{lv}"] for lv in LEVELS[::-1]]
            case[name] = np.stack(quantiles).tolist()  # [9 levels 0.1 ... 0.9, horizon]
        cases.append(case)
    return {"made_by": "lab/gift_eval_statsforecast.py", "cases": cases,
            "versions": {"statsforecast": statsforecast.__version__, "numpy": np.__version__}}


def main():
    from golden_files import write_or_check  # beside this script (run as a file): stdlib and numpy only

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    check = parser.parse_args().check
    write_or_check({OUT: json.dumps(figures(), indent=1) + "\n"}, check)


if __name__ == "__main__":
    main()
