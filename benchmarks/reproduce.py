"""Accuracy reproduction: our test MSE / MAE beside the published figures, over a grid of
models x data sets x horizons x seeds.

    python benchmarks/reproduce.py --models DLinear,PatchTST --data ETTh1,Exchange --horizons 96,336 --seeds 2021,2022
    python benchmarks/reproduce.py --models TimerXL,DLinear --data ETTh1 --protocol C
    python benchmarks/reproduce.py --models DLinear --data ETTh1 --extra "--train_epochs 3" --ddp 2
    python benchmarks/reproduce.py --models DLinear --data ETTh1,Exchange --dry_run    # print the commands only

Every (model, data set, seed) is one subprocess: the model's own script
scripts/long_term_forecast/<ETT_script|Exchange_script>/<Model>_<ETTh1|Exchange>.sh with PRED_LENS set to
the horizons, ROOT_PATH to ../shared/datasets/..., and --seed, a private --results_dir and --checkpoints,
--num_threads, the protocol's input length (--seq_len 96 for A, 672 for C), --ddp --nproc_per_node N
when asked, and --extra last (so it overrides everything). A missing script or data file is skipped
with the reason printed. The records run.py appends to results.jsonl are collected; a run's wall
seconds run from the previous record (or the script's start) to its own.

Published figures are read from ../shared/reference/targets.md (tables A and C). A row's verdict is
`within +2%` when our mean MSE over seeds is at most the published MSE x 1.02 (targets.md's rule),
otherwise `miss`. Writes benchmarks/results/reproduce_<data>_<models>.md (plus _C for protocol C),
the raw records beside it as .json, and prints the same table.
"""
import argparse
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: make the repository's packages importable
from benchmarks.report import PROTOCOL_INPUT, TARGETS, horizon_of, input_of, normalise, read_published  # noqa: E402

SHARED = REPO.parent / "shared"
SCRIPTS = REPO / "scripts" / "long_term_forecast"

# data set -> (script folder, script suffix, data folder, the file the script reads)
DATASETS = {
    "ETTh1": ("ETT_script", "ETTh1", SHARED / "datasets" / "ETT-small", "ETTh1.csv"),
    "Exchange": ("Exchange_script", "Exchange", SHARED / "datasets" / "exchange_rate", "exchange_rate.txt.gz"),
}
TOLERANCE = 0.02  # targets.md: a reproduction counts at or below published MSE + 2 %


# ------------------------------------------------------------------ one script run (one seed)
def _count_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")  # a record still being written has no newline yet
    except FileNotFoundError:
        return 0


def _watch_records(path, stamps, done):
    """Note when each record lands in results.jsonl: a run ends when its record is written."""
    seen = 0
    while True:
        finished = done.is_set()
        count = _count_lines(path)
        stamps.extend([time.perf_counter()] * (count - seen))
        seen = max(seen, count)
        if finished:
            return
        done.wait(0.2)


def run_script(script, env, argv, work, echo):
    """Run one script; return (records with wall_seconds, exit code, output tail)."""
    results = Path(work, "results.jsonl")
    stamps, done = [], threading.Event()
    watcher = threading.Thread(target=_watch_records, args=(results, stamps, done), daemon=True)
    started = time.perf_counter()
    watcher.start()
    tail = []
    with open(Path(work, "output.log"), "w") as log:
        proc = subprocess.Popen(["bash", str(script), *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:
            log.write(line)
            tail = (tail + [line.rstrip()])[-40:]
            if echo:
                print("    " + line.rstrip(), flush=True)
        code = proc.wait()
    done.set()
    watcher.join()
    records = []
    if results.exists():
        records = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    previous = started
    trained = None
    for record, stamp in zip(records, stamps):
        record["wall_seconds"] = stamp - previous
        previous = stamp
        if record.get("args", {}).get("is_training", 1):
            trained = record
        elif trained is not None:  # evaluates (rolls out) the model this script trained before
            record["shared_training_seconds"] = trained["wall_seconds"]
            record["shared_training_epochs"] = trained.get("stopped_epoch")
    return records, code, tail


def select(records, horizons):
    """Mark the records the table uses: requested horizons, and where a script both tested its freshly
    trained model and later evaluated the same checkpoint at that horizon (Timer-XL's roll-out), the later."""
    last = {}
    for i, r in enumerate(records):
        r["used"] = False
        if horizon_of(r) in horizons:
            last[(horizon_of(r), r["seed"])] = i
    for i in last.values():
        records[i]["used"] = True
    return records


# ------------------------------------------------------------------ table
def summarise(records, published, protocol):
    groups = {}
    for r in (r for r in records if r.get("used", True)):
        groups.setdefault((r["model"], r["grid_data"], horizon_of(r)), []).append(r)
    rows = []
    for (model, data, horizon), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        runs.sort(key=lambda r: r["seed"])
        mse = [r["mse"] for r in runs]
        mae = [r["mae"] for r in runs]
        inputs = sorted({input_of(r) for r in runs})
        figure = published.get((protocol, normalise(data), normalise(model), horizon))
        row = {"model": model, "data": data, "horizon": horizon, "protocol": protocol, "input": inputs,
               "mse": statistics.fmean(mse), "mae": statistics.fmean(mae), "mse_per_seed": mse, "mae_per_seed": mae,
               "seeds": [r["seed"] for r in runs],
               "epochs": [r.get("stopped_epoch", r.get("shared_training_epochs")) for r in runs],
               "wall_seconds": statistics.fmean(r.get("wall_seconds", float("nan")) for r in runs),
               "shared_training_seconds": (statistics.fmean(r["shared_training_seconds"] for r in runs)
                                           if all("shared_training_seconds" in r for r in runs) else None),
               "world_size": sorted({r["world_size"] for r in runs}),
               "published_mse": figure[0] if figure else None, "published_mae": figure[1] if figure else None}
        if figure is None:
            row["diff_pct"], row["verdict"] = None, "no published figure"
        else:
            row["diff_pct"] = 100 * (row["mse"] - figure[0]) / figure[0]
            if inputs != [PROTOCOL_INPUT[protocol]]:
                row["verdict"] = f"not comparable: input {'/'.join(map(str, inputs))}"
            elif row["mse"] <= figure[0] * (1 + TOLERANCE):
                row["verdict"] = "within +2%"
            else:
                row["verdict"] = "miss"
        rows.append(row)
    return rows


def _join(values, fmt="{:.4f}"):
    return ", ".join(fmt.format(v) for v in values)


def _wall(row):
    if row["shared_training_seconds"] is None:
        return f"{row['wall_seconds']:.1f}"
    return f"{row['wall_seconds']:.1f} (+{row['shared_training_seconds']:.1f} training, shared)"


def shown_command():
    """This run's command line, after PYTHONPATH when set: a folder there can change what every
    run computes (lab/tf32 emulates TF32 products)."""
    path = os.environ.get("PYTHONPATH")
    return (f"PYTHONPATH={shlex.quote(path)} " if path else "") + " ".join(shlex.quote(a) for a in sys.argv)


def render(rows, skipped, opts, environment):
    extra = f" Extra flags: `{opts.extra}`." if opts.extra else ""
    lines = [f"# Accuracy reproduction, protocol {opts.protocol}: {opts.models} on {opts.data}", "",
             f"{environment}. Command: `{shown_command()}`.{extra}", "",
             f"Test MSE / MAE on the z-scored data, features M. Ours is the mean over seeds (per-seed values "
             f"beside it); published figures from ../shared/reference/targets.md table {opts.protocol}. "
             f"diff = (ours - published) / published MSE; `within +2%` when ours <= published x 1.02. "
             f"Wall seconds per run = one training + test of one (horizon, seed), mean over seeds; a model "
             f"trained once and evaluated per horizon shows the evaluation, plus the shared training.", "",
             "| model | data | horizon | protocol | input | MSE | MAE | MSE per seed | MAE per seed | published MSE "
             "| published MAE | diff MSE | verdict | seeds | epochs | wall s / run | world size |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        published = (f"{r['published_mse']:.3f}", f"{r['published_mae']:.3f}") if r["published_mse"] else ("-", "-")
        diff = f"{r['diff_pct']:+.1f}%" if r["diff_pct"] is not None else "-"
        lines.append(f"| {r['model']} | {r['data']} | {r['horizon']} | {r['protocol']} | "
                     f"{'/'.join(map(str, r['input']))} | {r['mse']:.4f} | {r['mae']:.4f} | "
                     f"{_join(r['mse_per_seed'])} | {_join(r['mae_per_seed'])} | {published[0]} | {published[1]} | "
                     f"{diff} | {r['verdict']} | "
                     f"{_join(r['seeds'], '{}')} | {_join(r['epochs'], '{}')} | {_wall(r)} | "
                     f"{'/'.join(map(str, r['world_size']))} |")
    if not rows:
        lines += ["", "No run completed."]
    if skipped:
        lines += ["", "Skipped or failed:", ""] + [f"- {s}" for s in skipped]
    if opts.protocol == "C":
        lines += ["", "Protocol C: token models (autoregressive) train once on 672 -> 96 and roll out to each "
                      "horizon; direct models are trained per horizon with input 672 (no roll-out), which is "
                      "the published setting only at horizon 96."]
    return "\n".join(lines) + "\n"


def describe_environment():
    try:
        import torch

        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU only"
        version = f"torch {torch.__version__}"
    except ImportError:
        device, version = "unknown device", "torch missing"
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {device}, {version}, "
            f"Python {platform.python_version()}")


def output_name(opts):
    def clean(text):
        return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")

    suffix = "" if opts.protocol == "A" else f"_{opts.protocol}"
    return f"reproduce_{clean(opts.data)}_{clean(opts.models)}{suffix}"


# ------------------------------------------------------------------ orchestration
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="DLinear")
    parser.add_argument("--data", default="ETTh1,Exchange", help=f"any of {', '.join(DATASETS)}")
    parser.add_argument("--horizons", default="96,192,336,720")
    parser.add_argument("--seeds", default="2021")
    parser.add_argument("--protocol", default="A", choices=sorted(PROTOCOL_INPUT),
                        help="A: input 96 (targets.md table A); C: input 672, token models rolled out (table C)")
    parser.add_argument("--extra", default="", help='flags appended last to every run, e.g. "--train_epochs 3"')
    parser.add_argument("--ddp", type=int, default=0, metavar="N", help="run each training on N local DDP workers")
    parser.add_argument("--num_threads", type=int, default=0, help="torch threads per process (0: run.py decides)")
    parser.add_argument("--targets", default=str(TARGETS),
                        help="markdown file with the published tables (default: shared/reference/targets.md "
                             "beside this repository checkout)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--keep", action="store_true", help="keep each run's results and checkpoints folder")
    parser.add_argument("--quiet", action="store_true", help="do not echo the runs' output")
    parser.add_argument("--dry_run", action="store_true", help="print the commands and exit")
    opts = parser.parse_args()

    models = [m for m in opts.models.split(",") if m]
    datas = [d for d in opts.data.split(",") if d]
    horizons = [int(h) for h in opts.horizons.split(",") if h]
    seeds = [int(s) for s in opts.seeds.split(",") if s]
    if Path(opts.targets).exists():
        published = read_published(opts.targets)
    else:
        print(f"warning: {opts.targets} not found: no published figures to compare with")
        published = {}
    protocol_data = {data for (protocol, data, _, _) in published if protocol == opts.protocol}

    records, skipped = [], []

    def skip(reason):
        print(f"skipping {reason}", flush=True)
        skipped.append(reason)

    for data in datas:
        if data not in DATASETS:
            skip(f"{data}: unknown data set (known: {', '.join(DATASETS)})")
            continue
        folder, suffix, root, filename = DATASETS[data]
        if published and normalise(data) not in protocol_data:
            skip(f"{data}: targets.md has no protocol {opts.protocol} table for it")
            continue
        if not (root / filename).exists():
            skip(f"{data}: data file {root / filename} not found")
            continue
        for model in models:
            script = SCRIPTS / folder / f"{model}_{suffix}.sh"
            if not script.exists():
                skip(f"{model} on {data}: no script {script.relative_to(REPO)}")
                continue
            for seed in seeds:
                work = tempfile.mkdtemp(prefix=f"reproduce_{model}_{data}_{seed}_")
                argv = ["--seed", str(seed), "--results_dir", work, "--checkpoints", os.path.join(work, "checkpoints"),
                        "--num_threads", str(opts.num_threads), "--seq_len", str(PROTOCOL_INPUT[opts.protocol])]
                if opts.ddp:
                    argv += ["--ddp", "--nproc_per_node", str(opts.ddp)]
                argv += shlex.split(opts.extra)
                env = dict(os.environ, PRED_LENS=" ".join(map(str, horizons)), ROOT_PATH=f"{root}/",
                           PYTHONUNBUFFERED="1")
                shown = (f"PRED_LENS=\"{env['PRED_LENS']}\" ROOT_PATH={env['ROOT_PATH']} bash "
                         f"{script.relative_to(REPO)} {' '.join(shlex.quote(a) for a in argv)}")
                print(f"== {model} {data} seed {seed}: {shown}", flush=True)
                if opts.dry_run:
                    shutil.rmtree(work, ignore_errors=True)
                    continue
                runs, code, tail = run_script(script, env, argv, work, echo=not opts.quiet)
                for r in select(runs, horizons):
                    r.update(grid_data=data, script=str(script.relative_to(REPO)), command=shown)
                    print(f"== {model} {data} horizon {horizon_of(r)} seed {r['seed']}: mse {r['mse']:.4f} "
                          f"mae {r['mae']:.4f}, {r.get('wall_seconds', float('nan')):.1f} s"
                          + ("" if r["used"] else " (superseded by a later record, not in the table)"), flush=True)
                records += runs
                if code != 0:
                    skip(f"{model} on {data} seed {seed}: the script exited {code} after {len(runs)} of "
                         f"{len(horizons)} horizons; last output: {' / '.join(tail[-3:])}")
                    if opts.quiet:
                        print("\n".join(tail), flush=True)
                if opts.keep:
                    print(f"   kept {work}")
                else:
                    shutil.rmtree(work, ignore_errors=True)
    if opts.dry_run:
        return 0

    rows = summarise(records, published, opts.protocol)
    table = render(rows, skipped, opts, describe_environment())
    print()
    print(table)
    os.makedirs(opts.out, exist_ok=True)
    stem = Path(opts.out, output_name(opts))
    stem.with_suffix(".md").write_text(table)
    stem.with_suffix(".json").write_text(json.dumps({"argv": sys.argv, "pythonpath": os.environ.get("PYTHONPATH"),
                                                     "protocol": opts.protocol, "rows": rows,
                                                     "skipped": skipped, "records": records}, indent=1))
    print(f"wrote {stem.with_suffix('.md')} and {stem.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
