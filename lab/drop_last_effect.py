"""What a test loader with drop_last=True would have reported, from our per-window errors.

Several published tables were scored by test loaders built with `drop_last=True` at the training
batch size (LTSF-Linear's, PatchTST's and TimeMixer's code: cure-lab/LTSF-Linear#58,
yuqinie98/PatchTST#25, kwuking/TimeMixer#100; batch 128 for TimeMixer on ETTh1): the last
`windows % batch_size` test windows, the most recent stretch of the series, were never
scored. Our test scores every window and writes each one's errors to
`<results_dir>/<setting>/window_errors.csv`; this script recomputes MSE / MAE over the windows
such a loader keeps (the first `windows // B * B`) and over the ones it drops, so a gap to a
published figure can be split into "different model" and "different test set".

    python lab/drop_last_effect.py results/ --batch_size 128
    python lab/drop_last_effect.py results/*TimeMixer*/window_errors.csv --batch_size 32 128 --out table.md

Arguments are window_errors.csv files or folders searched for them; the metrics.json beside
each file (if any) names the run (model, data, horizon, seed).
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repository's packages importable
from utils.errors import UserError, require  # noqa: E402
from benchmarks.report import recipe_of, result_files  # noqa: E402

COLUMNS = "window,mse,mae"


def read_errors(path):
    """[windows, 2] array of (mse, mae), in test order (a probabilistic run's file has more columns after them)."""
    with open(path) as f:
        header = f.readline().strip()
    require(header == COLUMNS or header.startswith(COLUMNS + ","),
            f"{path} starts with {header!r}, not {COLUMNS!r}: not a window_errors.csv from run.py")
    table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2, usecols=(0, 1, 2))
    require(len(table) and np.array_equal(table[:, 0], np.arange(len(table))),
            f"{path} has no rows or its windows are not 0, 1, 2, ... in order")
    return table[:, 1:]


def run_label(path):
    """(sort key, label) of the run that wrote `path`, from the metrics.json beside it if any."""
    metrics = path.parent / "metrics.json"
    if not metrics.exists():
        return (str(path.parent),), str(path.parent)
    record = json.loads(metrics.read_text())
    des = recipe_of(record)[3]  # --des, and an explicit --eval_batch_size
    processes = record.get("world_size", 1)
    label = (f"{record['model']} {record['data']} {record['pred_len']} seed {record['seed']}"
             + (f" ({des})" if des and des != "Exp" else "") + (f", {processes} processes" if processes > 1 else ""))
    return (record["model"], record["data"], des, record["pred_len"], record["seed"], processes), label


def effect(errors, batch_size):
    """(kept windows, mse kept, mae kept, mse of the dropped windows or nan)."""
    kept = len(errors) // batch_size * batch_size
    dropped = errors[kept:, 0]
    return kept, errors[:kept, 0].mean(), errors[:kept, 1].mean(), dropped.mean() if len(dropped) else float("nan")


def table(files, batch_sizes):
    lines = ["| run | windows | MSE | MAE | drop_last batch | windows kept | MSE kept | MAE kept "
             "| MSE of the dropped | MSE kept vs all |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for _, label, path in sorted((*run_label(path), path) for path in files):
        errors = read_errors(path)
        mse, mae = errors.mean(0)
        for batch_size in batch_sizes:
            kept, mse_kept, mae_kept, mse_dropped = effect(errors, batch_size)
            lines.append(f"| {label} | {len(errors)} | {mse:.4f} | {mae:.4f} | {batch_size} | {kept} "
                         f"| {mse_kept:.4f} | {mae_kept:.4f} | {mse_dropped:.4f} | {100 * (mse_kept / mse - 1):+.1f}% |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="window_errors.csv files or folders holding them")
    parser.add_argument("--batch_size", type=int, nargs="+", required=True,
                        help="test batch size(s) of the drop_last=True loader to emulate")
    parser.add_argument("--out", default=None, help="also write the markdown table here")
    args = parser.parse_args(argv)
    if any(b < 1 for b in args.batch_size):
        parser.error(f"--batch_size must be positive, got {args.batch_size}")
    try:
        text = table(result_files(args.paths, "window_errors.csv"), args.batch_size)
    except UserError as exc:
        sys.exit(f"error: {exc}")
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
