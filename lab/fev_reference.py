"""SQL's and RMSSE's expected figures, computed by fev itself (tests/golden/probabilistic/fev.json).

utils.metrics' SQL (fev's scaled quantile loss) and RMSSE must give fev's figures; tests/test_probabilistic_metrics.py
compares ProbabilisticSums with the figures this script commits. fev brings datasets and its own dependencies, so
it runs in a virtual environment of its own, outside the repository, and imports nothing from it:

    python -m venv /tmp/fevenv --system-site-packages
    /tmp/fevenv/bin/pip install 'fev==0.10.0'
    /tmp/fevenv/bin/python lab/fev_reference.py            # writes fev.json
    /tmp/fevenv/bin/python lab/fev_reference.py --check    # exit 1 if the file differs

The inputs are the committed gluonts fixtures (fixtures.npz, lab/gluonts_reference.py): three series of two
channels, each with its own history and seasonality, 4, 3 and 2 windows of 6 steps, quantiles at 13 levels. Each
(window, channel) is one fev item (univariate: fev's D = 1) whose past is its series' history channel; fev takes
one seasonality a call, so each series' windows are scored on their own (one figure per series), SQL over
GIFT-Eval's nine levels, RMSSE of the median. The planted constant history channel (seasonal error 0) is left
out by fev (its scaled errors are inf / NaN) as by utils.metrics.
"""
import argparse
import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "golden" / "probabilistic"
GIFT_EVAL_LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
SEASONALITY = {"h": 24, "D": 1, "B": 5}  # gluonts' get_seasonality of the fixtures' frequencies


def figures():
    from fev.metrics import RMSSE, SQL

    fx = np.load(OUT / "fixtures.npz")
    levels = fx["levels"].tolist()
    wanted = [levels.index(q) for q in GIFT_EVAL_LEVELS]
    out = {}
    for s, freq in enumerate(fx["freqs"].tolist()):
        windows = np.flatnonzero(fx["series"] == s)
        history = fx[f"history_{s}"]  # [T, C]
        channels = history.shape[1]
        # items: (window, channel), window-major; [N, H, 1] truths and medians, [N, H, 1, Q] quantiles
        y_true = np.concatenate([fx["truths"][w][:, c][None, :, None] for w in windows for c in range(channels)])
        q_pred = np.concatenate([fx["quantiles"][w][:, c][None, :, None, :] for w in windows for c in range(channels)])
        y_past = np.concatenate([history[:, c] for _ in windows for c in range(channels)])[:, None]
        lengths = np.full(len(windows) * channels, len(history))
        common = dict(y_true=y_true, y_pred=q_pred[..., levels.index(0.5)], y_past=y_past, y_past_lengths=lengths,
                      seasonality=SEASONALITY[freq])
        out[f"series_{s}"] = {
            "sql": SQL().compute(**common, q_pred=q_pred[..., wanted], quantile_levels=GIFT_EVAL_LEVELS),
            "rmsse": RMSSE().compute(**common, q_pred=q_pred, quantile_levels=levels)}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if fev.json differs from fev's figures now")
    options = parser.parse_args()
    text = json.dumps({"made_by": "lab/fev_reference.py", "versions": {"fev": version("fev"), "numpy": np.__version__},
                       "levels": GIFT_EVAL_LEVELS, "figures": figures()}, indent=1, sort_keys=True) + "\n"
    path = OUT / "fev.json"
    if options.check:
        same = path.exists() and path.read_text() == text
        print("fev.json " + ("matches fev" if same else "differs from fev's figures"))
        sys.exit(0 if same else 1)
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
