"""The fev cross-check behind tests/golden/fev_bench/expected.json: a tiny benchmark in fev's layout, scored by
fev itself and by benchmarks.fev_bench, and our summaries file read by fev.analysis.leaderboard.

fev 0.10.0 needs datasets and huggingface_hub < 2 (this environment has 2.x), so it lives in a side environment
that sees this one's packages:

    python -m venv --system-site-packages /work/venvs/fev && /work/venvs/fev/bin/pip install fev==0.10.0
    /work/venvs/fev/bin/python -m benchmarks.fev_bench_reference tests/golden/fev_bench/expected.json

It writes the tiny benchmark (write_benchmark), runs `benchmarks.fev_bench` with seasonal_naive and mean, feeds
fev.Task.evaluation_summary the same forecasts (the harness's baselines, as fev's adapters would receive them),
and stores fev's metrics per task and model, and fev.analysis.leaderboard's table of our summaries.csv.
"""
import json
import sys
from pathlib import Path

import numpy as np

LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
METRICS = {"eval_metric": "SQL", "extra_metrics": ["MASE", "WAPE", "WQL"], "quantile_levels": LEVELS}


def _write(path, columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def write_benchmark(root):
    """Four tasks over small synthetic data in fev's layout; returns the tasks.yaml path. A univariate task with
    NaN gaps, a series too short for one window and rolling windows of step 3; a multivariate one with known,
    past and static covariates; one of generate_univariate_targets_from in the mirror layout with a context limit."""
    import pyarrow as pa

    root = Path(root)
    rng = np.random.default_rng(7)

    def wave(n, period, level=10.0):
        # float32 values (fev-bench's data are float32; fev's reader rounds some float64 files to it)
        y = level + 3 * np.sin(2 * np.pi * np.arange(n) / period) + rng.normal(0, 0.5, n)
        return y.astype(np.float32).astype(np.float64)

    def stamps(n, freq, start="2021-01-01"):
        return pa.array([np.arange(np.datetime64(start, freq), np.datetime64(start, freq) + n).astype(
            "datetime64[s]")], pa.list_(pa.timestamp("s")))[0].values

    hourly = [wave(120, 24), wave(90, 24), wave(20, 24), wave(100, 24, 50)]
    hourly[0][30:33] = np.nan
    hourly[3][-2] = np.nan
    _write(root / "hourly.parquet", {
        "id": ["h0", "h1", "h2", "h3"],
        "timestamp": [np.arange(np.datetime64("2021-01-01T00"), np.datetime64("2021-01-01T00") + len(y))
                      .astype("datetime64[s]").tolist() for y in hourly],
        "target": [y.tolist() for y in hourly]})
    months = [60, 48, 72]
    _write(root / "monthly.parquet", {
        "item": ["m_b", "m_a", "m_c"],
        "date": [np.arange(np.datetime64("2015-01"), np.datetime64("2015-01") + n).astype("datetime64[s]").tolist()
                 for n in months],
        "sales": [wave(n, 12, 20).tolist() for n in months],
        "returns": [wave(n, 12, 5).tolist() for n in months],
        "price": [wave(n, 6, 3).tolist() for n in months],
        "footfall": [wave(n, 12, 100).tolist() for n in months],
        "region": ["north", "south", "north"]})
    _write(root / "daily_cfg" / "part-0.parquet", {
        "id": ["d1", "d0"],
        "timestamp": [np.arange(np.datetime64("2022-01-01"), np.datetime64("2022-01-01") + 70)
                      .astype("datetime64[s]").tolist() for _ in range(2)],
        "u": [wave(70, 7).tolist(), wave(70, 7, 3).tolist()],
        "v": [wave(70, 7, 8).tolist(), np.zeros(70).tolist()]})
    tasks = [
        {"dataset_path": "hourly.parquet", "task_name": "tiny_hourly", "horizon": 6, "num_windows": 3,
         "window_step_size": 3, "seasonality": 24, "min_context_length": 24, **METRICS},
        {"dataset_path": "monthly.parquet", "task_name": "tiny_monthly", "horizon": 4, "num_windows": 2,
         "seasonality": 12, "id_column": "item", "timestamp_column": "date", "target": ["sales", "returns"],
         "known_dynamic_columns": ["price"], "past_dynamic_columns": ["footfall"], "static_columns": ["region"],
         **METRICS},
        {"dataset_path": "hourly.parquet", "task_name": "tiny_dated", "horizon": 6, "num_windows": 2,
         "initial_cutoff": "2021-01-04T12:00:00", "window_step_size": "5h", "seasonality": 24, **METRICS},
        {"dataset_path": "tiny/daily", "dataset_config": "daily_cfg", "horizon": 5, "num_windows": 2,
         "seasonality": 7, "max_context_length": 20, "generate_univariate_targets_from": ["u", "v"], **METRICS},
    ]
    import yaml

    (root / "tasks.yaml").write_text(yaml.safe_dump({"tasks": tasks}, sort_keys=False))
    return root / "tasks.yaml"


def fev_summaries(root, model):
    """fev.Task.evaluation_summary of `model` (a harness baseline) on each task, fev loading the data itself."""
    import os

    import fev

    from benchmarks import fev_bench_tasks, gift_eval

    os.environ["FEV_DATASETS_PREFIX"] = str(root)
    out = []
    for definition in fev_bench_tasks.read_benchmark(root / "tasks.yaml"):
        d = dict(definition)
        if d["dataset_config"] is None:
            d["dataset_path"] = str(root / d["dataset_path"])
        task = fev.Task(**d)
        predictions = []
        for window in task.iter_windows():
            past, _ = window.get_input_data()
            per_column = {}
            for column in task.target_columns:
                # the stored values (the numpy view of `past` would round them to float32)
                histories = [np.asarray(h, np.float64) for h in past.data.table.column(column).to_pylist()]
                point, q = gift_eval.baseline_forecasts(gift_eval.BASELINES[model], histories, task.horizon,
                                                        task.seasonality)
                rows = [{"predictions": q[i, 4].tolist(), **{str(lv): q[i, j].tolist() for j, lv in enumerate(LEVELS)}}
                        for i in range(len(histories))]
                per_column[column] = rows
            predictions.append(per_column)
        s = task.evaluation_summary(predictions, model_name=model)
        out.append({"task_name": d["task_name"], "model": model, **{m: s[m] for m in ("SQL", "MASE", "WAPE", "WQL")},
                    "test_error": s["test_error"], "num_forecasts": s["num_forecasts"]})
    return out


def main(target):
    import tempfile

    import fev

    from benchmarks import fev_bench

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        tasks_file = write_benchmark(root)
        fev_bench.run(fev_bench.parse_args(["--model", "mean", "--tasks", str(tasks_file), "--data_root", str(root),
                                            "--out", str(Path(tmp) / "out")]))
        summaries = Path(tmp) / "out" / "summaries.csv"
        board = fev.analysis.leaderboard(str(summaries))
        expected = {"fev_version": fev.__version__,
                    "fev": fev_summaries(root, "seasonal_naive") + fev_summaries(root, "mean"),
                    "summaries_csv": summaries.read_text(),
                    "leaderboard": {model: {k: float(v) for k, v in row.items() if k in ("win_rate", "skill_score")}
                                    for model, row in board.iterrows()},
                    "ranking": list(board.index)}
    Path(target).write_text(json.dumps(expected, indent=1) + "\n")
    print(board.to_string())


if __name__ == "__main__":
    main(sys.argv[1])
