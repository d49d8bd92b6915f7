"""Cross-check of the M4 summary (utils.m4) against TSLib's own utils/m4_summary.py on the same files.

    python -m lab.m4_crosscheck                 # compare with TSLib (needs --tslib and --python)
    python -m lab.m4_crosscheck --write         # also rewrite tests/golden/m4/ (fixture and figures)

The fixture (tests/golden/m4/) is a small M4-layout folder: M4-info.csv, M4's per-frequency CSVs
(<Frequency>-train.csv, <Frequency>-test.csv, 2 to 5 series each: data_provider.m4.write_synthetic_m4),
submission-Naive2.csv (Naive2 of utils.m4, float32-exact values: TSLib reads the file as float32) and
fixed forecasts in m4_results/<Frequency>_forecast.csv, as the test writes them. expected.json holds the
figures TSLib's m4_summary gives for them; tests/test_m4.py checks ours against those to 1e-9.

TSLib (thuml/Time-Series-Library 4e938a1) runs in its own interpreter (--python, a venv outside the repo):
its M4 code builds np.array of the series, which are ragged, and so needs numpy < 1.24 (numpy 2 refuses a
ragged array; the same failure TSLib users report with newer numpy), and its modules are imported from
the checkout (--tslib), never copied. Its data loader reads TSLib's training.npz / test.npz, so the
fixture's CSVs are converted into that pair in a temporary folder; its download helpers (patoolib,
huggingface_hub) are stubbed, since the files are there. TSLib rounds what evaluate() returns to 3
decimals; the comparison reads the unrounded figures (np.round of its module made the identity for one
call) and also checks the rounded ones.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "golden" / "m4"
TOLERANCE = 1e-9

# Run by --python with only the TSLib checkout on its path: prints TSLib's figures as JSON.
TSLIB_SIDE = r"""
import json, sys, types
import numpy as np
sys.path.insert(0, sys.argv[1])
for name in ("patoolib", "huggingface_hub"):  # download helpers only: the files are present
    stub = types.ModuleType(name)
    stub.hf_hub_download = None
    sys.modules[name] = stub
import utils.m4_summary as m4s
from utils.m4_summary import M4Summary

# TSLib's training.npz / test.npz, pickled here by this numpy (a numpy 2 pickle does not load in numpy 1)
series = json.load(open(sys.argv[3] + "/series.json"))
for name in ("training.npz", "test.npz"):
    objects = np.empty(len(series[name]), dtype=object)
    objects[:] = [np.array(row, dtype=np.float64) for row in series[name]]
    with open(sys.argv[3] + "/" + name, "wb") as f:
        np.save(f, objects, allow_pickle=True)

def run(unrounded):
    summary = M4Summary(sys.argv[2], sys.argv[3])
    if unrounded:
        real = m4s.np
        m4s.np = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if not k.startswith("__")})
        m4s.np.round = lambda x, decimals=0: x
    try:
        smape, owa, mape, mase = summary.evaluate()
    finally:
        if unrounded:
            m4s.np = real
    fig = lambda d: {k: float(v) for k, v in d.items()}
    return {"SMAPE": fig(smape), "MAPE": fig(mape), "MASE": fig(mase), "OWA": fig(owa)}

print(json.dumps({"unrounded": run(True), "rounded": run(False), "numpy": np.__version__}))
"""


# Run by --statsmodels_python: Naive2 of each series from statsmodels' acf and seasonal_decompose (R's acf and
# decompose, computed by another implementation), with the test and rules of M4's R code written here.
NAIVE2_SIDE = r"""
import json, math, sys
import numpy as np
from statsmodels.tsa.seasonal import seasonal_decompose
from statsmodels.tsa.stattools import acf
out = []
for x, ppy, h in json.load(open(sys.argv[1])):
    x = np.array(x)
    n = len(x)
    seasonal = False
    if ppy > 1 and n >= 3 * ppy and ppy <= min(math.floor(10 * math.log10(n)), n - 1):
        r = acf(x, nlags=ppy, adjusted=False, fft=False)[1:]
        seasonal = abs(r[ppy - 1]) > 1.645 / math.sqrt(n) * math.sqrt(1 + 2 * np.sum(r[:ppy - 1] ** 2))
    if not seasonal:
        out.append([float(x[-1])] * h)
        continue
    s = seasonal_decompose(x, model="multiplicative", period=ppy).seasonal
    last_year = s[n - ppy:]
    out.append([float(x[-1] / s[-1] * last_year[j % ppy]) for j in range(h)])
print(json.dumps(out))
"""


def naive2_series():
    """(series, ppy, horizon): the fixture's series of frequency > 1 and seasonal ones of every M4 frequency."""
    from data_provider.m4 import read_m4
    from utils import m4

    _, train, _, sets = read_m4(FIXTURE)
    cases = [(s, sets.frequency[p], m4.HORIZONS[p]) for p in m4.SEASONAL_PATTERNS for s in train[p]
             if sets.frequency[p] > 1]
    rng = np.random.default_rng(1)
    for ppy, n in ((4, 13), (4, 40), (12, 37), (12, 100), (12, 141), (24, 250), (24, 300), (24, 700)):
        t = np.arange(n)
        cases.append((50 + 0.2 * t + 8 * np.sin(2 * np.pi * t / ppy) + rng.normal(size=n), ppy, 2 * ppy))
    return cases


def naive2_check(python):
    """Largest relative difference between utils.m4.naive2 and statsmodels' components, and how many of the
    cases were seasonal."""
    from utils.m4 import naive2, seasonal

    cases = naive2_series()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "series.json"
        path.write_text(json.dumps([[list(map(float, x)), ppy, h] for x, ppy, h in cases]))
        out = subprocess.run([python, "-c", NAIVE2_SIDE, str(path)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"statsmodels' Naive2 failed:\n{out.stderr[-3000:]}")
    theirs = json.loads(out.stdout)
    diff = max(float(np.max(np.abs(naive2(x, h, ppy) / np.array(t) - 1))) for (x, ppy, h), t in zip(cases, theirs))
    return diff, sum(seasonal(np.asarray(x, dtype=np.float64), ppy) for x, ppy, _ in cases), len(cases)


def fixed_forecasts(target, seed):
    """Forecasts near the truth, float32-exact (what a model writes): a seeded relative error per step."""
    rng = np.random.default_rng(seed)
    noisy = target * (1 + 0.08 * rng.standard_normal(target.shape)) + rng.normal(scale=0.5, size=target.shape)
    return np.float32(noisy).astype(np.float64)


def write_fixture(folder=FIXTURE):
    """The fixture folder, from scratch."""
    from data_provider.m4 import read_m4, write_synthetic_m4
    from utils import m4

    if folder.exists():
        shutil.rmtree(folder)
    # unequal counts: Others and Average weigh the frequencies by them
    counts = {"Yearly": 4, "Quarterly": 3, "Monthly": 5, "Weekly": 2, "Daily": 3, "Hourly": 2}
    write_synthetic_m4(folder, per_pattern=counts, seed=42, layout="csv", naive2_file=True)
    _, _, targets, _ = read_m4(folder)
    for i, p in enumerate(m4.SEASONAL_PATTERNS):
        m4.write_forecasts(folder / "m4_results", p, fixed_forecasts(targets[p], seed=i))
    return folder


def ours(folder=FIXTURE):
    """{row: {column: figure}} of utils.m4 on the fixture's files (read as the test run reads them)."""
    from data_provider.m4 import read_m4
    from utils import m4

    ids, _, _, sets = read_m4(folder)
    forecasts = {p: m4.read_forecasts(folder / "m4_results", p) for p in m4.SEASONAL_PATTERNS}
    return m4.m4_summary(forecasts, m4.naive2_forecasts(folder, sets, ids), sets)


def tslib_layout(folder, into):
    """TSLib's files of the fixture: M4-info.csv, submission-Naive2.csv and the forecast files as they are, and
    the series for training.npz / test.npz (object arrays in M4-info's order, pickled on TSLib's side)."""
    from data_provider.m4 import read_m4
    from utils import m4

    _, train, targets, _ = read_m4(folder)
    for name in ("M4-info.csv", m4.NAIVE2_FILE):
        shutil.copy(folder / name, into / name)
    series = {"training.npz": [s.tolist() for p in m4.SEASONAL_PATTERNS for s in train[p]],
              "test.npz": [t.tolist() for p in m4.SEASONAL_PATTERNS for t in targets[p]]}
    (into / "series.json").write_text(json.dumps(series))  # TSLib's interpreter pickles them (TSLIB_SIDE)
    shutil.copytree(folder / "m4_results", into / "m4_results")


def tslib(folder, checkout, python):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tslib_layout(folder, tmp)
        out = subprocess.run([python, "-c", TSLIB_SIDE, str(checkout), f"{tmp}/m4_results/", str(tmp)],
                             capture_output=True, text=True, cwd=tmp)
        if out.returncode:
            raise SystemExit(f"TSLib's m4_summary failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def largest_difference(a, b):
    return max(abs(a[row][col] - b[row][col]) for row in a for col in a[row])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tslib", default="/work/tslib", help="a TSLib checkout (4e938a1)")
    parser.add_argument("--python", default="/work/venvs/tslib_m4/bin/python",
                        help="an interpreter with numpy < 1.24 and pandas for TSLib's M4 code")
    parser.add_argument("--statsmodels_python", default="/work/venvs/statsforecast/bin/python",
                        help="an interpreter with statsmodels, for the Naive2 check (skipped if it does not exist)")
    parser.add_argument("--write", action="store_true", help="rewrite the fixture and expected.json")
    options = parser.parse_args(argv)
    if options.write:
        write_fixture()
    theirs = tslib(FIXTURE, options.tslib, options.python)
    mine = ours()
    diff = largest_difference(theirs["unrounded"], mine)
    rounded_equal = all(round(mine[r][c], 3) == theirs["rounded"][r][c] for r in mine for c in mine[r])
    from utils.m4 import summary_table

    print(summary_table(mine))
    print(f"largest difference from TSLib's m4_summary: {diff:.3g} (tolerance {TOLERANCE}); rounded figures "
          f"{'equal' if rounded_equal else 'DIFFER'} (TSLib's numpy {theirs['numpy']})")
    naive2_ok = True
    if os.path.exists(options.statsmodels_python):
        naive2_diff, seasonal_cases, cases = naive2_check(options.statsmodels_python)
        naive2_ok = naive2_diff <= TOLERANCE
        print(f"Naive2 against statsmodels' acf and seasonal_decompose: largest relative difference {naive2_diff:.3g} "
              f"over {cases} series ({seasonal_cases} of them seasonal)")
    if options.write:
        record = {"tslib_commit": "4e938a1", "tslib_numpy": theirs["numpy"], "figures": theirs["unrounded"],
                  "rounded": theirs["rounded"]}
        (FIXTURE / "expected.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0 if diff <= TOLERANCE and rounded_equal and naive2_ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
