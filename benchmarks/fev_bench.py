"""fev-bench in one command: forecast every task of a fev benchmark file, score it as fev does, and write the
summaries file fev.analysis.leaderboard reads as it is.

    python -m benchmarks.fev_bench --model seasonal_naive --tasks tasks.yaml --data_root DIR [--out DIR]
        [--batch_size 512] [--dataset NAME=PATH --horizon H [--num_windows W] [--seasonality M]]
    python -m benchmarks.fev_bench --model RELEASE --pretrain_model_path FOLDER --covariates --tasks ...
    python -m utils.launch --nproc_per_node 3 -m benchmarks.fev_bench --ddp ...   # the same file, byte for byte
    [--use_gpu false] [--gpu N] [--num_threads N]   # as benchmarks.gift_eval's

Then, with fev installed:  fev.analysis.leaderboard("OUT/summaries.csv")  (the model's rows and the harness's
seasonal_naive rows, fev's baseline, one per task).

The tasks (horizon, windows, step, context limits, multivariate targets, covariate columns) and their data are
benchmarks/fev_bench_tasks.py's; the metrics are fev's SQL, MASE, WAPE and WQL at the task's quantile levels,
from the window sums of benchmarks/gift_eval_scores.py (utils.metrics' definitions): each (window, target
column) scored over its series, averaged over the target columns, then over the windows; test_error is the
task's eval_metric. A model forecasts every target column of a series as its own univariate series from its
past (NaNs filled as GIFT-Eval's baselines fill them); with --covariates, a release whose folder has a
covariates.py (Chronos-2's) forecasts a series' target columns together and is given its known and past
covariates (models/foundation/<release>/covariates.py); the static ones only with --static_covariates constant
(fev's own Chronos-2 run gives none, the default). The point
forecast fev scores (its `predictions`) is the median.

Exact on any number of processes: a task's (series, target column, window) forecasts are cut into batches of
--batch_size, each rank forecasts its contiguous share of the batches, rank 0 adds every window's sums with
math.fsum. Each task's result is written atomically to OUT/tasks/ as soon as it is scored, naming the data it
was computed on (sha256 of its files); a run started again skips the tasks already there whose definition and
data are unchanged. summaries.csv holds no timings (inference_time_s is left empty) so that it is the same on
every rerun; each task's file keeps its seconds.
"""
import argparse
import csv
import io
import json
import math
import time
from pathlib import Path

import numpy as np

from benchmarks import fev_bench_tasks as tasks
from benchmarks import gift_eval
from benchmarks import gift_eval_scores as scores
from utils import distributed
from utils.arguments import add_device_arguments
from utils.errors import UserError, require
from utils.files import atomic_write

FEV_VERSION = "0.10.0"  # the fev whose task and metric definitions these are (leaderboard checks >= 0.6.0)
SUMMARY_COLUMNS = ["model_name", *tasks.TASK_FIELDS, "test_error", "training_time_s", "inference_time_s",
                   "num_forecasts", "dataset_fingerprint", "trained_on_this_dataset", "fev_version",
                   *tasks.METRICS, "data_sha256"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help=f"one of {', '.join(gift_eval.BASELINES)}, or any --model of "
                   "run.py with its weights (--pretrain_model_path / --checkpoint) and shape arguments")
    p.add_argument("--model_name", default=None, help="the summaries' model_name (default: --model)")
    p.add_argument("--tasks", default=None, help="a YAML file with a `tasks:` list of fev.Task definitions")
    p.add_argument("--data_root", default=None, help="the tasks' data: <data_root>/<dataset_config>/*.parquet, "
                   "or a task's dataset_path relative to it")
    p.add_argument("--dataset", action="append", default=[], metavar="NAME=PATH",
                   help="your own data set, scored as the task NAME (repeatable): PATH a .parquet / .arrow file "
                   "in fev's layout, with --horizon, --num_windows and --seasonality (default: its frequency's)")
    p.add_argument("--horizon", type=int, default=None)
    p.add_argument("--num_windows", type=int, default=1)
    p.add_argument("--seasonality", type=int, default=None)
    p.add_argument("--covariates", action="store_true", help="a release that takes covariates (its folder's "
                   "covariates.py: Chronos-2's): give it each task's target columns together and its known and past "
                   "covariates")
    p.add_argument("--static_covariates", choices=("constant", "none"), default=None, help="with --covariates: "
                   "none (the default, fev's own Chronos-2 protocol), or each static covariate as a known covariate "
                   "constant over the past and the horizon (Chronos-2 has no static input, and standardises a "
                   "constant row away: docs/benchmarks.md)")
    p.add_argument("--out", default=None, help="output folder (default results/fev_bench/<model name>)")
    p.add_argument("--batch_size", type=int, default=512, help="forecasts made at once")
    p.add_argument("--ddp", action="store_true", help="under torchrun: share the forecasts across the processes")
    add_device_arguments(p)
    p.add_argument("--num_threads", type=int, default=0, help="torch threads per process (default: 1, or "
                   "OMP_NUM_THREADS; never the cores split between processes, so the file does not depend on their number)")
    args, run_argv = p.parse_known_args(argv)
    require(args.model not in gift_eval.BASELINES or not run_argv,
            f"--model {args.model} is a baseline here and takes none of {' '.join(run_argv)}")
    args.run_argv = run_argv
    args.device = None
    require(args.batch_size >= 1, f"--batch_size must be at least 1, got {args.batch_size}")
    require(args.tasks or args.dataset, "give --tasks FILE (fev's task definitions) and/or --dataset NAME=PATH")
    require(args.num_windows >= 1, f"--num_windows must be at least 1, got {args.num_windows}")
    require(args.horizon is None or args.horizon >= 1, f"--horizon must be at least 1, got {args.horizon}")
    require(args.seasonality is None or args.seasonality >= 1, f"--seasonality must be at least 1, got {args.seasonality}")
    require(not args.covariates or args.model not in gift_eval.BASELINES, f"--covariates: the baseline "
            f"{args.model} takes none; give a release that does (Chronos-2)")
    require(args.covariates or args.static_covariates is None,
            "--static_covariates goes with --covariates (a model without them is given no covariates)")
    args.static_covariates = args.static_covariates or "none"  # fev's protocol; Chronos-2 cannot read them (docs)
    args.model_name = args.model_name or args.model
    require(args.model_name != "seasonal_naive" or args.model == "seasonal_naive", "--model_name seasonal_naive "
            "is the harness's baseline's name (its rows are written beside the model's); name the model otherwise")
    args.out = Path(args.out or Path("results") / "fev_bench" / args.model_name)
    return args


def plan(args):
    """Every task's definition and data digest, checked before anything is written."""
    defined = tasks.read_benchmark(args.tasks) if args.tasks else []
    for entry in args.dataset:
        season = args.seasonality
        own = tasks.own_task(entry, args.horizon, args.num_windows, season or 1)
        if season is None:  # the season of the data's frequency
            data = tasks.load(own, tasks.data_files(own, None))
            own["seasonality"] = tasks.season_of(data["timestamps"][0])
        defined.append(own)
    names = [t["task_name"] for t in defined]
    twice = sorted({n for n in names if names.count(n) > 1})
    require(not twice, f"task name {', '.join(twice)} is given twice; name each task once (task_name or NAME=)")
    for t in defined:
        levels = t["quantile_levels"]
        require(not levels or levels == list(scores.LEVELS), f"{t['task_name']}: quantile_levels {levels}; this "
                f"harness scores fev-bench's {list(scores.LEVELS)} (or none)")
        quantile_metric = [m for m in (t["eval_metric"], *t["extra_metrics"]) if m in ("SQL", "WQL")]
        require(levels or not quantile_metric, f"{t['task_name']}: {quantile_metric[0]} needs quantile_levels")
    facts = []
    for t in defined:
        files = tasks.data_files(t, args.data_root)
        facts.append({"task": t, "files": [str(f) for f in files], "data_sha256": tasks.digest(files)})
    return facts


def evaluate(t, data, args):
    """This rank's forecasts' sums [N, FIELDS] with each row's (window, target column), model and seasonal naive."""
    if args.covariates:
        return evaluate_with_covariates(t, data, args)
    horizon, season = t["horizon"], t["seasonality"]
    work = [(s, d, k, cut) for s, k, cut in tasks.windows(t, data) for d in range(len(data["target_columns"]))]
    batches = [work[b:b + args.batch_size] for b in range(0, len(work), args.batch_size)]
    start, stop = distributed.shard_range(len(batches))
    rows, reference, keys, point_only = [], [], [], False
    config = {"horizon": horizon, "season": season}
    for batch in batches[start:stop]:
        first = [max(0, cut - t["max_context_length"]) if t["max_context_length"] else 0 for _, _, _, cut in batch]
        histories = [data["targets"][s][d][a:cut] for (s, d, _, cut), a in zip(batch, first)]
        labels = np.stack([data["targets"][s][d][cut:cut + horizon] for s, d, _, cut in batch])
        scale = np.array([_scale(h, season) for h in histories])
        filled = [gift_eval.impute(h) for h in histories]
        point, quantiles, _ = gift_eval.forecast_batch(args, filled, config, [(s, cut) for s, _, _, cut in batch])
        point_only = quantiles is None
        # fev scores its `predictions`, here the median, for MASE and WAPE
        rows.append(scores.window_sums(labels, None if quantiles is not None else point, quantiles, scale))
        if args.model != "seasonal_naive":
            point, quantiles = gift_eval.baseline_forecasts(gift_eval.seasonal_naive, filled, horizon, season)
            reference.append(scores.window_sums(labels, None, quantiles, scale))
        keys.extend((k, d) for _, d, k, _ in batch)
    width = len(scores.FIELDS)
    stack = lambda parts: np.concatenate(parts) if parts else np.zeros((0, width))  # noqa: E731
    return stack(rows), stack(reference), np.array(keys, dtype=np.int64).reshape(-1, 2), point_only, len(work)


def evaluate_with_covariates(t, data, args):
    """evaluate's sums where each forecast is a series' window, all its target columns and covariates at once."""
    covariates = covariate_module(args.model)
    horizon, season, columns = t["horizon"], t["seasonality"], data["target_columns"]
    work = tasks.windows(t, data)
    batches = [work[b:b + args.batch_size] for b in range(0, len(work), args.batch_size)]
    start, stop = distributed.shard_range(len(batches))
    if getattr(args, "covariate_forecaster", None) is None:
        args.covariate_forecaster = covariates.CovariateForecaster(args.run_argv, args.device, scores.LEVELS)
    rows, reference, keys = [], [], []
    for batch in batches[start:stop]:
        first = [max(0, cut - t["max_context_length"]) if t["max_context_length"] else 0 for _, _, cut in batch]
        static = args.static_covariates == "constant"
        inputs = [covariates.window_inputs(data, s, a, cut, horizon, columns, static)
                  for (s, _, cut), a in zip(batch, first)]
        quantiles = args.covariate_forecaster.forecast(inputs, horizon)  # [B, D, 9, H]
        for d in range(len(columns)):
            histories = [data["targets"][s][d][a:cut] for (s, _, cut), a in zip(batch, first)]
            labels = np.stack([data["targets"][s][d][cut:cut + horizon] for s, _, cut in batch])
            scale = np.array([_scale(h, season) for h in histories])
            rows.append(scores.window_sums(labels, None, quantiles[:, d], scale))
            filled = [gift_eval.impute(h) for h in histories]
            _, naive = gift_eval.baseline_forecasts(gift_eval.seasonal_naive, filled, horizon, season)
            reference.append(scores.window_sums(labels, None, naive, scale))
            keys.extend((k, d) for _, k, _ in batch)
    width = len(scores.FIELDS)
    stack = lambda parts: np.concatenate(parts) if parts else np.zeros((0, width))  # noqa: E731
    return (stack(rows), stack(reference), np.array(keys, dtype=np.int64).reshape(-1, 2), False,
            len(work) * len(columns))


def covariate_module(model):
    """The covariates.py of the model's release folder (models/foundation/<release>/), or one line."""
    import importlib

    from models import get_model_class

    package = get_model_class(model).__module__.rpartition(".")[0]
    try:
        return importlib.import_module(f"{package}.covariates")
    except ModuleNotFoundError as missing:
        if missing.name != f"{package}.covariates":
            raise
        raise UserError(f"--covariates: --model {model} takes no covariates here (a release does where its folder "
                        "has covariates.py: Chronos-2's)") from None


def _scale(history, season):
    """fev's seasonal error of a past: mean |y_t - y_(t-m)| over its pairs without NaN; a past of at most m steps,
    or with no such pair, has none (0 here), which leaves the series out of MASE and SQL in that window."""
    from utils.metrics import seasonal_naive_error

    if len(history) <= season:
        return 0.0
    error = seasonal_naive_error(history, season)
    return 0.0 if math.isnan(error) else error


def task_metrics(rows, keys, n_windows, n_columns):
    """fev's SQL, MASE, WAPE, WQL: per (window, target column) from its series' sums, the mean over the target
    columns, then over the windows (NaN where a window or column has nothing to score)."""
    per_window = []
    for k in range(n_windows):
        per_column = []
        for d in range(n_columns):
            chosen = rows[(keys[:, 0] == k) & (keys[:, 1] == d)]
            m = scores.metrics(chosen)
            per_column.append({"SQL": m["SQL"], "MASE": m["MASE[0.5]"], "WAPE": m["ND[0.5]"],
                               "WQL": m["mean_weighted_sum_quantile_loss"]})
        per_window.append({name: _mean([c[name] for c in per_column]) for name in tasks.METRICS})
    return {name: _mean([w[name] for w in per_window]) for name in tasks.METRICS}


def _mean(values):
    return math.fsum(values) / len(values) if values and all(math.isfinite(v) for v in values) else math.nan


def run(args):
    facts = plan(args)
    folder = args.out / "tasks"
    identity = {"model": args.model_name, "method": args.model, "arguments": args.run_argv}
    paths = [folder / f"{i:03d}__{tasks.safe_name(f['task']['task_name'])}.json" for i, f in enumerate(facts)]
    distributed.raise_on_every_rank(lambda: gift_eval.another_runs(paths, identity))
    finished = distributed.broadcast_object([computed_on(path, fact, given(args)) if distributed.is_main() else None
                                             for fact, path in zip(facts, paths)])
    bar, say = gift_eval.item_progress(len(facts), sum(finished), "task")
    for i, (fact, path) in enumerate(zip(facts, paths)):
        if finished[i]:
            continue
        began = time.perf_counter()
        t = fact["task"]
        data = tasks.load(t, [Path(f) for f in fact["files"]])
        rows, reference, keys, point_only, n_forecasts = evaluate(t, data, args)
        gathered = distributed.gather_on_main((rows, reference, keys, point_only))
        if distributed.is_main():
            all_rows = np.concatenate([g[0] for g in gathered])
            all_keys = np.concatenate([g[2] for g in gathered])
            ref_rows = np.concatenate([g[1] for g in gathered]) if args.model != "seasonal_naive" else all_rows
            assert len(all_rows) == n_forecasts  # every forecast scored exactly once
            shape = (all_keys, t["num_windows"], len(data["target_columns"]))
            result = {"identity": identity, "task": t, "data_sha256": fact["data_sha256"],
                      "num_forecasts": n_forecasts, "point_only": any(g[3] for g in gathered),
                      **given(args),
                      "metrics": task_metrics(all_rows, *shape), "seasonal_naive": task_metrics(ref_rows, *shape),
                      "seconds": round(time.perf_counter() - began, 3)}
            atomic_write(path, lambda f: f.write(json.dumps(result, indent=1)), binary=False)
            m = result["metrics"]
            say(f"[{i + 1}/{len(facts)}] {t['task_name']}: {n_forecasts} forecasts, "
                + ", ".join(f"{k} {m[k]:.4f}" for k in tasks.METRICS) + f", {result['seconds']:.1f}s")
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    if distributed.is_main():
        results = [json.loads(path.read_text()) for path in paths]
        atomic_write(args.out / "summaries.csv", lambda f: f.write(summaries_csv(results, args)), binary=False)
        print(relative_table(results))


def given(args):
    """Which covariates the model is given: part of a stored result, so a run with others scores it again."""
    return {"covariates_given_to_the_model": bool(args.covariates),
            "static_covariates_given_to_the_model": bool(args.covariates) and args.static_covariates == "constant"}


def computed_on(path, fact, covariates):
    """Whether the stored result at `path` is of this task's definition and data as they are now, the model given
    the same covariates."""
    if not path.exists():
        return False
    stored = json.loads(path.read_text())
    if stored.get("task") == fact["task"] and stored.get("data_sha256") == fact["data_sha256"]:
        if all(stored.get(k) == v for k, v in covariates.items()):
            return True
        print(f"{fact['task']['task_name']}: its stored result gave the model other covariates; scoring it again",
              flush=True)
        return False
    print(f"{fact['task']['task_name']}: its stored result was computed on another definition or other data "
          f"(sha256 {str(stored.get('data_sha256'))[:12]}, now {fact['data_sha256'][:12]}); scoring it again",
          flush=True)
    return False


def _cell(value):
    """A summary cell as fev's own CSV summaries hold it: lists and None as Python writes them, floats by repr."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


def summaries_csv(results, args):
    """One row per task for the model, and one for the harness's seasonal_naive (fev's baseline_model) unless
    the model is it: the columns of fev's Task.evaluation_summary. No timings, so the file is a rerun's too."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SUMMARY_COLUMNS)
    models = [(args.model_name, "metrics")]
    if args.model_name != "seasonal_naive":
        models.append(("seasonal_naive", "seasonal_naive"))
    for name, field in models:
        for r in results:
            t, m = r["task"], r[field]
            row = {"model_name": name, **t, "test_error": m[t["eval_metric"] if isinstance(t["eval_metric"], str)
                                                           else t["eval_metric"]["name"]],
                   "training_time_s": 0.0, "inference_time_s": None, "num_forecasts": r["num_forecasts"],
                   "dataset_fingerprint": r["data_sha256"][:16], "trained_on_this_dataset": False,
                   "fev_version": FEV_VERSION, **m, "data_sha256": r["data_sha256"]}
            writer.writerow([_cell(row[c]) for c in SUMMARY_COLUMNS])
    return out.getvalue()


def relative_table(results):
    """fev's leaderboard in brief: each task's test_error over seasonal naive's, the geometric mean (skill is one
    minus it) and the share of tasks where the model beats seasonal naive (ties half)."""
    ratios, wins = [], 0.0
    for r in results:
        metric = r["task"]["eval_metric"]
        metric = metric if isinstance(metric, str) else metric["name"]
        a, b = r["metrics"][metric], r["seasonal_naive"][metric]
        if math.isfinite(a) and math.isfinite(b) and b > 0:
            ratios.append(min(max(a / b, 1e-2), 100.0))  # fev's clipping of relative errors
        wins += 1.0 if a < b else 0.5 if a == b else 0.0
    gm = gift_eval._geometric_mean(ratios)
    return (f"{len(results)} tasks: relative error to seasonal naive (geometric mean) {gm:.4f}, skill {1 - gm:.4f}, "
            f"win rate against it {wins / len(results):.4f}")


def main(argv=None):
    gift_eval.harness_main(parse_args, run, argv)


if __name__ == "__main__":
    main()
