"""GIFT-Eval in one command: forecast every configuration, score it as GIFT-Eval does, write its all_results.csv.

    python -m benchmarks.gift_eval --model seasonal_naive --data_root DIR [--terms short,medium,long]
        [--datasets electricity/H hospital ...] [--out DIR] [--batch_size 512]
        [--dataset NAME=FOLDER ...]   # your own data sets in GIFT-Eval's layout, reported as NAME/<freq>/<term>
    python -m utils.launch --nproc_per_node 3 -m benchmarks.gift_eval --ddp ...   # the same CSV, byte for byte
    [--use_gpu false] [--gpu N]   # run.py's: a model forecasts on the GPU when there is one (one per process
                                  # under --ddp, nccl), else on the CPU (gloo); scores are summed on the host
    (utils.launch is torchrun with one line on a bad input; plain torchrun works too)

DIR holds GIFT-Eval's data as published (huggingface.co/datasets/Salesforce/GiftEval: a folder per data set
and frequency, e.g. DIR/electricity/15T, DIR/hospital). The rules (prediction length, rolling windows,
seasonality, univariate scoring of multivariate sets) are benchmarks/gift_eval_data.py's, the 11 columns
benchmarks/gift_eval_scores.py's; docs/benchmarks.md has the sources and how to submit the result.

Exact on any number of processes: in every configuration the test windows are cut into batches of
--batch_size, each rank forecasts its contiguous share of the batches (utils.distributed.shard_range, nothing
padded), rank 0 gathers each window's own sums and adds them with math.fsum (correctly rounded in any order).
So the CSV is byte for byte the same on any number of processes; the baselines' at any batch size too (a
model's float32 forward may round a window differently in another batch: about 1e-9 relative here).
Each configuration's result is written atomically to OUT/configurations/ as soon as it is scored, naming the
data it was computed on (the data set's sha256); a run started again with the same arguments skips the
configurations already there whose data is unchanged.

Models: benchmarks/gift_eval_models.py runs any model of this codebase; written here are three baselines
(seasonal naive, GIFT-Eval's reference, naive and mean), each with
Gaussian quantiles from its in-sample residuals (Hyndman & Athanasopoulos, Forecasting: Principles and
Practice, 3rd ed., section 5.5, the benchmark methods' h-step standard deviations), which are statsforecast's
SeasonalNaive and Naive, GIFT-Eval's reference rows (lab/gift_eval_statsforecast.py checks them).
"""
import argparse
import csv
import io
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import gift_eval_data as data
from benchmarks import gift_eval_scores as scores
from utils import distributed, worker
from utils.arguments import add_device_arguments
from utils.errors import UserError, require
from utils.files import atomic_write
from utils.metrics import seasonality
from utils.progress import progress_mode
from utils.threads import same_on_any_world_size

CSV_HEADER = ["dataset", "model", *(f"eval_metrics/{c}" for c in scores.COLUMNS), "domain", "num_variates"]
Z = np.array([statistics.NormalDist().inv_cdf(q) for q in scores.LEVELS])  # standard normal quantiles


def impute(history):
    """GIFT-Eval's statsforecast predictors' imputation (gluonts LastValueImputation): each NaN takes the last
    value before it, leading NaNs the first value; an all-NaN (or one-step) history's NaNs become 0."""
    h = np.asarray(history, np.float64)
    missing = np.isnan(h)
    if not missing.any():
        return h
    if len(h) == 1 or missing.all():
        return np.where(missing, 0.0, h)
    last = np.maximum.accumulate(np.where(missing, 0, np.arange(len(h))))
    h = h[last]
    missing = np.isnan(h)  # only a leading run is left
    h[missing] = h[np.flatnonzero(~missing)[0]]
    return h


def seasonal_naive(history, horizon, season):
    """The last season repeated; sigma_h = sigma sqrt(k + 1), k full seasons before step h, sigma from the
    residuals y_t - y_(t-m). A history shorter than a season forecasts as naive."""
    if len(history) < season or season == 1:
        return naive(history, horizon, season)
    steps = np.arange(horizon)
    point = history[len(history) - season + steps % season]
    return point, _sigma(history[season:] - history[:-season]) * np.sqrt(steps // season + 1)


def naive(history, horizon, season):
    """The last value; sigma_h = sigma sqrt(h), sigma from the one-step residuals."""
    return np.full(horizon, history[-1]), _sigma(np.diff(history)) * np.sqrt(np.arange(1, horizon + 1))


def mean(history, horizon, season):
    """The history's mean; sigma_h = s sqrt(1 + 1/T), s its sample standard deviation."""
    spread = history.std(ddof=1) * math.sqrt(1 + 1 / len(history)) if len(history) > 1 else 0.0
    return np.full(horizon, history.mean()), np.full(horizon, spread)


def _sigma(residuals):
    return math.sqrt(np.mean(residuals ** 2)) if len(residuals) else 0.0


BASELINES = {"seasonal_naive": seasonal_naive, "naive": naive, "mean": mean}


def baseline_forecasts(method, histories, horizon, season):
    """mean [B, P] and quantiles [B, 9, P] at GIFT-Eval's levels (point + z_q sigma_h)."""
    points, spreads = zip(*(method(impute(h), horizon, season) for h in histories))
    point, spread = np.stack(points), np.stack(spreads)
    return point, point[:, None, :] + Z[None, :, None] * spread[:, None, :]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help=f"one of {', '.join(BASELINES)}, or any --model of run.py "
                   "with its weights (--pretrain_model_path / --checkpoint) and shape arguments")
    p.add_argument("--model_name", default=None, help="the CSV's model column (default: --model)")
    p.add_argument("--data_root", default=None, help="GIFT-Eval's data: a folder per data set and frequency")
    p.add_argument("--terms", default="short,medium,long")
    p.add_argument("--datasets", nargs="+", default=None, help="a subset of GIFT-Eval's 55 data sets")
    p.add_argument("--dataset", action="append", default=[], metavar="NAME=FOLDER",
                   help="your own data set (repeatable): FOLDER in GIFT-Eval's layout (save_to_disk's Arrow), its "
                   "frequency read from the data, GIFT-Eval's rules for its horizon and windows, each --terms "
                   "scored and reported as NAME/<freq>/<term>; alone it scores no GIFT-Eval data set")
    p.add_argument("--out", default=None, help="output folder (default results/gift_eval/<model name>)")
    p.add_argument("--batch_size", type=int, default=512, help="windows forecast at once")
    p.add_argument("--ddp", action="store_true", help="under torchrun: share the windows across the processes")
    add_device_arguments(p)  # run.py's --use_gpu / --no_use_gpu / --gpu (a baseline computes on the host anyway)
    p.add_argument("--num_threads", type=int, default=0, help="torch threads per process (default: 1, or "
                   "OMP_NUM_THREADS; never the cores split between processes, so the CSV does not depend on their number)")
    for field, default in (("model_type", None), ("model_dtype", "float32"), ("model_link", ""),
                           ("code_link", ""), ("org", ""), ("testdata_leakage", "No")):
        p.add_argument(f"--{field}", default=default, help=f"config.json's {field}")
    args, run_argv = p.parse_known_args(argv)
    # any other --model is this codebase's: the arguments left over are run.py's (weights, shapes, --loss ...)
    require(args.model not in BASELINES or not run_argv,
            f"--model {args.model} is a baseline here and takes none of {' '.join(run_argv)}")
    args.run_argv = run_argv
    args.device = None  # where a model forecasts: main's distributed.setup decides (None: the CPU)
    require(args.batch_size >= 1, f"--batch_size must be at least 1, got {args.batch_size}")
    terms = [t.strip() for t in args.terms.split(",") if t.strip()]
    bad = [t for t in terms if t not in data.TERMS]
    require(terms and not bad, f"--terms: {', '.join(bad) or 'none given'}; use short, medium and/or long")
    args.terms = terms
    args.own = own_datasets(args.dataset)
    require(args.data_root or args.own, "give --data_root (GIFT-Eval's data) and/or --dataset NAME=FOLDER")
    args.model_name = args.model_name or args.model
    zero_shot = ("--pretrain_model_path" in run_argv and "--checkpoint" not in run_argv) or "--members" in run_argv
    args.model_type = args.model_type or ("statistical" if args.model in BASELINES else
                                          "zero-shot" if zero_shot else "deep-learning")
    args.out = Path(args.out or Path("results") / "gift_eval" / args.model_name)
    return args


def plan(args):
    """Every configuration's facts, checked before anything is written: [{name, term, csv, horizon, windows,
    season, freq, data_sha256}] (data_sha256: the data set's content, gift_eval_data.content_digest). Bad
    folders and undefined frequencies stop the run here (UserError)."""
    configs = data.configurations(args.datasets, args.terms) if args.datasets or not args.own else []
    root = Path(args.data_root or ".")
    require(not configs or args.data_root, "--datasets names GIFT-Eval's data sets: give their --data_root too")
    require(not configs or root.is_dir(), f"--data_root {root} is not a folder")
    missing = [name for name in dict.fromkeys(n for n, _ in configs) if not (root / name).is_dir()]
    require(not missing, f"--data_root {root} lacks {len(missing)} of the data sets ({', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}); download GIFT-Eval there or pick --datasets")
    facts, cache = [], {}
    for name, term in configs:
        if name not in cache:
            ds = data.read_dataset(root / name)
            # one data set's facts at a time
            cache = {name: (ds["freq"], data.shortest(ds), data.content_digest(root / name))}
        freq, shortest, digest = cache[name]
        horizon = data.prediction_length(name, freq, term)
        n_windows = data.windows(name, shortest, horizon)
        require(shortest > horizon * n_windows, f"{name} ({term}): its shortest series ({shortest} steps) has no "
                f"history before its {n_windows} test window(s) of {horizon} steps")
        facts.append({"name": name, "term": term, "csv": data.csv_name(name, term), "freq": freq,
                      "horizon": horizon, "windows": n_windows,
                      "season": seasonality(freq), "data_sha256": digest})
    for name, folder in args.own.items():
        ds = data.read_dataset(folder)
        freq, shortest, digest = ds["freq"], data.shortest(ds), data.content_digest(folder)
        for term in args.terms:
            horizon = data.prediction_length("", freq, term)  # GIFT-Eval's rules for a data set not of M4
            n_windows = data.windows("", shortest, horizon)
            require(shortest > horizon * n_windows, f"--dataset {name} ({term}): its shortest series ({shortest} "
                    f"steps) has no history before its {n_windows} test window(s) of {horizon} steps; pick --terms")
            facts.append({"name": name, "term": term, "csv": f"{name}/{freq}/{term}", "freq": freq,
                          "horizon": horizon, "windows": n_windows, "season": seasonality(freq),
                          "data_sha256": digest, "path": str(folder), "domain": "",
                          "variates": int(ds["target"][0].shape[0]) if ds["target"][0].ndim == 2 else 1})
    return facts


def own_datasets(entries):
    """{NAME: folder} of --dataset NAME=FOLDER: a name of letters, digits, '_', '.', '-' that is none of
    GIFT-Eval's, each given once."""
    import re

    own = {}
    for entry in entries:
        name, sep, folder = entry.partition("=")
        require(sep and re.fullmatch(r"[A-Za-z0-9_.-]+", name) and folder, f"--dataset {entry!r}: give NAME=FOLDER, "
                "NAME of letters, digits, '_', '.', '-', FOLDER a data set in GIFT-Eval's layout")
        require(data.key_of(name) not in data.PROPERTIES and name not in data.SHORT, f"--dataset {name}: a name of "
                "GIFT-Eval's own data sets; report yours under another")
        require(name not in own, f"--dataset {name} is given twice")
        own[name] = Path(folder)
    return own


def properties(config):
    """(domain, variates) of a configuration: GIFT-Eval's dataset_properties.json's, or your data's own."""
    if "path" in config:
        return config["domain"], config["variates"]
    domain, _, variates = data.PROPERTIES[data.key_of(config["name"])]
    return domain, variates


def evaluate(config, series, args):
    """This rank's windows' sums (model, seasonal naive) for one configuration; every rank calls it."""
    todo = data.instances(series, config["horizon"], config["windows"])
    # whole batches are shared out, not windows: a window's batch mates, hence a model's float32 rounding,
    # do not depend on the number of processes
    batches = [todo[b:b + args.batch_size] for b in range(0, len(todo), args.batch_size)]
    start, stop = distributed.shard_range(len(batches))
    rows, reference, point_only, crossed = [], [], False, 0
    for batch in batches[start:stop]:
        histories = [series[s][:t] for s, _, t in batch]
        labels = np.stack([series[s][t:t + config["horizon"]] for s, _, t in batch])
        scale = scores.seasonal_errors(histories, config["season"])
        point, quantiles, crossings = forecast_batch(args, histories, config, [(s, t) for s, _, t in batch])
        rows.append(scores.window_sums(labels, point, quantiles, scale))
        point_only = quantiles is None
        crossed += crossings
        if args.model != "seasonal_naive":  # the leaderboard's reference, for the relative scores
            point, quantiles = baseline_forecasts(seasonal_naive, histories, config["horizon"], config["season"])
            reference.append(scores.window_sums(labels, point, quantiles, scale))
    width = len(scores.FIELDS)
    return (np.concatenate(rows) if rows else np.zeros((0, width)),
            np.concatenate(reference) if reference else np.zeros((0, width)), len(todo), point_only, crossed)


def forecast_batch(args, histories, config, keys):
    """mean [B, P], quantiles [B, 9, P] (None for a point forecast) and how many elements (a step of a window)
    had crossing quantiles before the rule was applied (utils.probabilistic.QuantileObjective: a release's kept
    as forecast, a --loss quantile's sorted), of the windows whose histories are given; keys: each window's
    (series, start), for forecasts looked up rather than computed."""
    if args.model in BASELINES:  # Gaussian quantiles around the point: never crossing
        return (*baseline_forecasts(BASELINES[args.model], histories, config["horizon"], config["season"]), 0)
    if getattr(args, "forecaster", None) is None:
        from benchmarks.gift_eval_models import forecaster

        args.forecaster = forecaster(["--model", args.model, "--num_threads", str(args.num_threads),
                                           "--use_gpu", str(args.use_gpu), *args.run_argv], distributed.world_size(),
                                          args.device)
    return args.forecaster.forecast(histories, config["horizon"], impute)


def run(args):
    facts = plan(args)
    folder = args.out / "configurations"
    identity = {"model": args.model_name, "method": args.model, "arguments": args.run_argv}
    paths = [folder / (config["csv"].replace("/", "__") + ".json") for config in facts]
    # a killed run's finished configurations are kept if they are this run's; rank 0 decides for all (its
    # disk is the one results are written to)
    distributed.raise_on_every_rank(lambda: another_runs(paths, identity))
    # a stored result counts only for the data it was computed on (its config's data_sha256): a data set that
    # changed under --data_root since, or a result from before results named their data, is scored again
    finished = distributed.broadcast_object([computed_on(path, config) if distributed.is_main() else None
                                             for config, path in zip(facts, paths)])
    warned = False
    bar, say = item_progress(len(facts), sum(finished), "configuration")
    for i, (config, path) in enumerate(zip(facts, paths)):
        if finished[i]:
            continue
        began = time.perf_counter()
        ds = data.read_dataset(Path(config["path"]) if "path" in config else Path(args.data_root) / config["name"])
        rows, reference, n_windows, point_only, crossed = evaluate(config, data.univariate_series(ds), args)
        gathered = distributed.gather_on_main((rows, reference, point_only, crossed))
        if distributed.is_main():
            all_rows = np.concatenate([g[0] for g in gathered])
            ref_rows = np.concatenate([g[1] for g in gathered]) if args.model != "seasonal_naive" else all_rows
            point_only = any(g[2] for g in gathered)
            crossed = sum(g[3] for g in gathered)
            assert len(all_rows) == n_windows  # every window scored exactly once
            if point_only and not warned:
                print(f"warning: {args.model} gives point forecasts, no quantiles: its CRPS "
                      "(mean_weighted_sum_quantile_loss) and MSIS columns are left empty", file=sys.stderr)
                warned = True
            result = {"identity": identity, "config": config, "windows": n_windows, "point_only": point_only,
                      "quantiles_crossed": crossed, "quantile_order": quantile_order(args, point_only),
                      "msis_alpha": scores.MSIS_ALPHA,  # the MSIS column's interval: GIFT-Eval's 95 %
                      "metrics": scores.metrics(all_rows), "seasonal_naive": scores.metrics(ref_rows)}
            atomic_write(path, lambda f: f.write(json.dumps(result, indent=1)), binary=False)
            crossing = ("" if point_only else f"quantiles crossed at {crossed} of {n_windows * config['horizon']} "
                        f"steps ({result['quantile_order']}), ")
            say(f"[{i + 1}/{len(facts)}] {config['csv']}: {n_windows} windows, "
                  f"MASE {result['metrics']['MASE[0.5]']:.4f}, CRPS "
                  f"{'-' if point_only else format(result['metrics'][scores.COLUMNS[-1]], '.4f')}, "
                  f"{crossing}"
                  f"{time.perf_counter() - began:.1f}s")
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    if distributed.is_main():
        results = [json.loads(path.read_text()) for path in paths]
        write_outputs(args, results)
        print(relative_table(results))


def quantile_order(args, point_only):
    """The rule the scored quantiles follow (utils.probabilistic.QuantileObjective.order): a release's own
    quantiles "as forecast", a --loss quantile's and a baseline's "sorted"; None for a point forecast."""
    if point_only:
        return None
    if args.model in BASELINES:
        return "sorted"
    from exp.ensemble import is_ensemble
    from models import get_model_class
    from utils.probabilistic import native_levels

    if is_ensemble(args.model):  # combined as the members forecast them, never sorted
        return "as forecast"
    return "as forecast" if native_levels(get_model_class(args.model)) else "sorted"


def computed_on(path, config):
    """Whether the stored result at `path` is of this configuration's data as it is now; rank 0 says so in a line
    where it is not (its data changed since, or it names none)."""
    if not path.exists():
        return False
    stored = json.loads(path.read_text())["config"].get("data_sha256")
    if stored == config["data_sha256"]:
        return True
    print(f"{config['csv']}: its stored result was computed on "
          + (f"other data (data set sha256 {stored[:12]}, now {config['data_sha256'][:12]})" if stored else
             "data it does not name (written before results named their data)") + "; scoring it again", flush=True)
    return False


def item_progress(total, done, unit):
    """(bar or None, say): a tqdm bar of `total` items (`done` of them already) on a terminal, its `write` saying a
    line above it; else no bar and one printed line per item (a log, a pipe). Rank 0's; shared with fev_bench."""
    if progress_mode() != "bar":
        return None, lambda line: print(line, flush=True)
    from tqdm import tqdm

    bar = tqdm(total=total, initial=done, unit=unit, leave=False)
    return bar, bar.write


def another_runs(paths, identity):
    """A message if a configuration file already in --out is another run's (model or arguments), else None."""
    for path in paths:
        if path.exists():
            saved = json.loads(path.read_text())["identity"]
            if saved != identity:
                return f"{path} holds another run's result ({saved}); use another --out"
    return None


def csv_text(results, model_name):
    """all_results.csv in GIFT-Eval's layout; a metric gluonts could not compute here (a point forecast's
    CRPS and MSIS) is left empty, never filled."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for r in results:
        domain, variates = properties(r["config"])
        empty = ("MSIS", "mean_weighted_sum_quantile_loss") if r["point_only"] else ()
        values = ["" if c in empty else r["metrics"][c] for c in scores.COLUMNS]
        writer.writerow([r["config"]["csv"], model_name, *values, domain, variates])
    return out.getvalue()


def write_outputs(args, results):
    atomic_write(args.out / "all_results.csv", lambda f: f.write(csv_text(results, args.model_name)), binary=False)
    config = {"model": args.model_name, "model_type": args.model_type, "model_dtype": args.model_dtype,
              "model_link": args.model_link, "code_link": args.code_link, "org": args.org,
              "testdata_leakage": args.testdata_leakage, "replication_code_available": "Yes"}
    atomic_write(args.out / "config.json", lambda f: f.write(json.dumps(config, indent=4) + "\n"), binary=False)


def relative_table(results):
    """The leaderboard's aggregate: each configuration's MASE and CRPS divided by seasonal naive's, then the
    geometric mean over all configurations, per term, per domain and per frequency."""
    groups = {"overall": results}
    for kind, of in (("term", lambda c: c["term"]), ("domain", lambda c: properties(c)[0] or "(your own)"),
                     ("frequency", lambda c: c["csv"].split("/")[1])):
        for r in results:
            groups.setdefault(f"{kind} {of(r['config'])}", []).append(r)
    lines = [f"{'geometric mean relative to seasonal naive':44s} {'MASE':>8s} {'CRPS':>8s} configurations"]
    for group, members in groups.items():
        cells = [_geometric_mean([m["metrics"][k] / m["seasonal_naive"][k] if m["seasonal_naive"][k] else math.nan
                                  for m in members])
                 for k in ("MASE[0.5]", "mean_weighted_sum_quantile_loss")]
        lines.append(f"{group:44s} {cells[0]:8.4f} {cells[1]:8.4f} {len(members)}")
    return "\n".join(lines)


def _geometric_mean(ratios):
    ratios = [r for r in ratios if r is not None and math.isfinite(r) and r > 0]
    return math.exp(math.fsum(math.log(r) for r in ratios) / len(ratios)) if ratios else math.nan


def main(argv=None):
    harness_main(parse_args, run, argv)


def harness_main(parse, run_harness, argv=None):
    """A harness's command line on every rank (this one's, and fev_bench's): `parse(argv)`'s arguments on run.py's
    device, `run_harness(args)`; bad input (a UserError every rank meets, the same files and arguments) is one line
    on rank 0 and exit 2 on every rank."""
    from exp.settings import check_gpu_choice

    code = 0
    worker.die_with_launcher()
    try:
        args = parse(argv)
        # threads that do not follow the number of processes: a model's float32 sums can depend on the count
        args.num_threads = same_on_any_world_size(args.num_threads)
        check_gpu_choice(args.ddp, args.gpu)
        # run.py's device: CUDA (--gpu's, or LOCAL_RANK's under --ddp; nccl) where --use_gpu and a GPU is
        # visible, else the CPU (gloo); each batch's forecasts come back to the host, where they are scored. A
        # baseline computes on the host: no GPU taken, so it runs on as many processes as there are cores
        use_gpu = args.use_gpu and args.model not in BASELINES
        args.device = distributed.setup(args.ddp, use_gpu, args.gpu, timeout_s=1800, threads=args.num_threads)
        run_harness(args)
    except UserError as exc:
        if distributed.env_rank() == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            worker.tell_the_launcher_a_line_was_printed()  # utils.launch then adds no line of its own
        distributed.wait_for_the_message(exc)
        worker.end_job_on_user_error()
        code = 2
    distributed.cleanup()
    distributed.exit_process(code)


if __name__ == "__main__":
    main()
