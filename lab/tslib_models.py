"""TSLib's long-term-forecasting model files, each dropped unchanged into a scratch copy of this repository.

    git clone https://github.com/thuml/Time-Series-Library /path/to/TSLib
    python lab/tslib_models.py --tslib /path/to/TSLib                       # every LTF model file
    python lab/tslib_models.py --tslib /path/to/TSLib --models SegRNN Informer --jobs 2
    python lab/tslib_models.py --tslib /path/to/TSLib --out lab/results/tslib_models.md

The drop-in promise of TSLib-style codebases (Wu et al., "TimesNet", ICLR 2023, and the Time-Series-Library
that ships its models): a paper's `models/X.py` runs wherever TSLib's `layers/` and `configs` are. For each
file under the checkout's `models/` this script decides by reading it whether it is a long-term-forecasting
model file (a `long_term_forecast` branch, or no task switch at all). Wrappers of released foundation models
(Chronos, Moirai, TimesFM, ...: they download weights through a package and train nothing) and files without a
forecasting branch are listed as excluded, with the reason. Each LTF file is copied ALONE into its own copy of
this repository's working tree (tracked and untracked files, outside the repository; nothing of TSLib is
copied into the repository itself) as `models/<Name>.py`, replacing ours of that name, and there:

  1. trains one epoch with `--global_batch_size 8 --sync_bn` on 1 process and on 2 (`--ddp --nproc_per_node
     2`): the largest relative difference of every metric and loss `metrics.json` records, which must be
     <= 1e-6. --sync_bn (docs/ddp.md) normalises BatchNorm layers with the global batch's statistics, as one
     process does (PatchTST, Pyraformer); it changes nothing in a file without BatchNorm. Where the two
     differ, one process trains again with `--accumulation_steps 2` (micro-batches of 4, as each of the 2
     processes has): a file that then agrees reads its batch-mates by its own design (TSLib's TimesNet picks
     its periods from the batch's mean spectrum, Autoformer its lags from the batch's mean correlation), is
     listed as such with both figures and the reason, and is not counted among the files that run;
  2. reloads the 1-process checkpoint with `--is_training 0`: the test metrics must be the training run's;
  3. runs the model contract on it (`tests/test_model_contract.py`, which holds every file in `models/` to it).

Two findings are the file's own, not this repository's, and each is named in its row and in the summary line:

  * *rounding-sensitive*: where 1 vs 2 processes differ by more than 1e-6, equal micro-batches do not explain
    it and everything else passes, one process trains again with `--num_threads 2`: the same arithmetic in
    another summation order, without DDP, so its difference from the 1-thread run is the file's own rounding
    floor. 1 vs 2 processes within ROUNDING_FACTOR (4) times a floor that itself exceeds 1e-6 is that rounding
    (TSLib's PatchTST and Pyraformer: a BatchNorm after a bias that Adam moves by rounding, FOUND_CAUSES): the
    file runs, as rounding-sensitive. The floor costs one more run, so only such files measure it;
  * *own limit*: a contract configuration where the file raises (`--features S` or `MS`) is tried on TSLib's
    own file, imported from the checkout outside this repository, at the same shapes. The same exception and
    message there is the file's limit (TSLib's TemporalFusionTransformer knows no `--features S`), so that
    clause does not count against it; the note keeps the error, the contract column the count. Any other
    failure counts.

A file whose run is refused in one line (a package that is not installed: `pip install ...`) is listed as
refused with that line. Sizes are tiny (synthetic data, d_model 16, one layer): seconds per step, so every
file takes well under a minute and the whole checkout some minutes. Prints `N of M model files run unchanged`
(the batch-dependent ones apart) and the table, and writes it to `--out` as markdown. `--merge_markdown` takes
the rows (and run records) of a results file written earlier, so that checking a few files again updates it:

    python lab/tslib_models.py --tslib /path/to/TSLib --files PatchTST \\
        --merge_markdown lab/results/tslib_models.md --out lab/results/tslib_models.md
"""
import argparse
import ast
import json
import shlex
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from utils.errors import UserError, require  # noqa: E402

TOLERANCE = 1e-6
# One small configuration for every file, the model contract's shapes (each file reads the fields it needs;
# TSLib's defaults for the rest, which utils/arguments.py shares). seg_len 24 divides seq_len and pred_len
# (SegRNN's segments); dropout stays at TSLib's 0.1 so that 1 vs 2 processes tests the keyed masks.
RUN_ARGS = [
    "--data", "synthetic", "--synthetic_rows", "400", "--synthetic_channels", "7", "--features", "M",
    "--seq_len", "48", "--label_len", "24", "--pred_len", "24", "--seg_len", "24",
    "--d_model", "16", "--d_ff", "32", "--n_heads", "2", "--e_layers", "1", "--d_layers", "1",
    "--top_k", "2", "--num_kernels", "2", "--patch_len", "8", "--stride", "4",
    "--down_sampling_layers", "1", "--down_sampling_window", "2", "--down_sampling_method", "avg",
    "--train_epochs", "1", "--global_batch_size", "8", "--num_threads", "1", "--seed", "2021", "--no_plots",
    "--sync_bn",  # BatchNorm over the global batch: 1 x 8 and 2 x 4 normalise alike (nothing without BatchNorm)
]
# 1 process in micro-batches of 4, the 2-process run's micro-batches: what a batch-dependent file is held to.
EQUAL_MICRO_BATCHES = ["--accumulation_steps", "2"]
# Why a file trains differently on 1 x 8 and 2 x 4 by its own design (read in TSLib's code), by file name.
BY_DESIGN = {
    "TimesNet": "FFT_for_Period (in the model file) picks the top_k periods from the batch's mean amplitude "
                "spectrum in training and in evaluation",
    "Autoformer": "AutoCorrelation's training path (TSLib's layers/AutoCorrelation.py, ours the same function) "
                  "picks the top lags from the batch's mean correlation",
    "TimeMixer": "x_mark.repeat(N, 1, 1) tiles the batch's time marks while the values are reshaped window by "
                 "window to B x N rows, so channel n of window b is embedded with the dates of window (b N + n) "
                 "mod B, a batch-mate (in training and evaluation)",
}
# 1 process with 2 threads: the same arithmetic in another summation order, no DDP (appended, it overrides
# RUN_ARGS' --num_threads 1). Its difference from the 1-thread run is the file's own rounding floor; 1 vs 2
# processes within ROUNDING_FACTOR of a floor above TOLERANCE is that rounding, not DDP's.
OTHER_THREADS = ["--num_threads", "2"]
ROUNDING_FACTOR = 4
# Why a file's 1 vs 2 processes differ when not by design, as found by hand (2026-11-27, TSLib 4e938a1; the
# figures from runs of this script's settings with the named biases removed from a scratch copy's layers).
FOUND_CAUSES = {
    "PatchTST": "with --sync_bn training agrees (train loss 1e-8), evaluation not: BatchNorm's running mean follows "
                "the bias of the LayerNorm before it (norm2), whose gradient is zero in exact arithmetic and which "
                "Adam moves by its rounding (lr-sized, other on 2 processes). Without that bias: 6.6e-7",
    "Pyraformer": "with --sync_bn training agrees (train loss 1e-8), evaluation not: BatchNorm's running mean "
                  "follows the biases of the Linear (down) and Conv1d (downConv) before it, whose gradient is zero in "
                  "exact arithmetic and which Adam moves by their rounding (lr-sized, other on 2 processes). Without "
                  "those biases: 9e-9",
}
# What of the contract a file meets only by its own nature, as found by hand with TSLib's own file outside the
# repository: shown in its row whether the clauses pass or not.
CONTRACT_CAUSES = {
    "Koopa": "the same weights on the same input give outputs 6e-8 apart from one call to the next (its eval "
             "forward solves torch.linalg.lstsq per batch): the file's own forward is not bit-reproducible on this "
             "CPU, so two same-seed builds and a reloaded copy differ by rounding, which the contract's same-seed "
             "and state_dict round-trip clauses allow a forward that moves from call to call (identical weights)",
}
GENERIC_DESIGN = "its forward reads its batch-mates (a statistic over the batch)"
# The contract's clauses of that same property: training (1 x 8 vs 2 x 4) and evaluation (a window's forecast
# alone and in a batch of 4). Evaluation batches are one process's, dealt out (data_provider.windows.ShardSampler),
# so at equal micro-batches such a file agrees on every metric; the verdict asks only its training losses to.
INVARIANCE_CLAUSE = "the same training on 1 process x 8 windows and 2 processes x 4"
WINDOWS_CLAUSE = "windows are independent"
# A file's own settings where it cannot run on RUN_ARGS, as its TSLib scripts set them (applied in the
# training runs and in the contract, through TSL_CONTRACT_ARGS). ETTH1 stands for an ETTh1-shaped file.
FILE_ARGS = {
    "MICN": ["--label_len", "48"],  # its decoder reads seq_len + pred_len steps: its scripts set label_len = seq_len
    "MultiPatchFormer": ["--seq_len", "96", "--label_len", "48"],  # fixed patches of 8 ... 32 steps, strides 6 ... 8
    # columns named per data set in its datatype_dict (ETTh1, ETTm1 only): ETTh1-shaped data, 25 steps of it
    "TemporalFusionTransformer": ["--data", "ETTh1", "--root_path", "ETTH1", "--data_path", "ETTh1.csv",
                                  "--train_steps", "25"],
}
METRICS = ("mse", "mae", "rmse", "mape", "mspe", "vali_loss")
HISTORY = ("train_loss", "vali_loss", "test_loss")
# Packages through which TSLib's wrappers of released foundation models download their weights.
FOUNDATION_PACKAGES = ("chronos", "uni2ts", "timesfm", "transformers", "tirex")
STEP_TIMEOUT = 600


# ---------------------------------------------------------------- which files are long-term forecasting

def imported_packages(source):
    """Top-level names of the modules a file imports (`from x.y import z`, `import x as y`)."""
    names = re.findall(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", source, flags=re.M)
    return {(a or b).split(".")[0] for a, b in names}


def unsupported_forecast(source):
    """The message of a `raise NotImplementedError(...)` that a long_term_forecast branch starts with, or None."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and "long_term_forecast" in ast.unparse(node.test):
            first = node.body[0]
            if isinstance(first, ast.Raise) and "NotImplementedError" in ast.unparse(first.exc):
                arguments = getattr(first.exc, "args", [])
                return ast.literal_eval(arguments[0]) if arguments else "NotImplementedError"
    return None


def classify(path):
    """('ltf', '') for a long-term-forecasting model file, else ('excluded', why)."""
    source = Path(path).read_text()
    foundation = sorted(imported_packages(source) & set(FOUNDATION_PACKAGES))
    if foundation:
        return "excluded", (f"wraps a released foundation model whose weights {foundation[0]} downloads "
                            "(zero-shot; no model file to train)")
    if "class Model" not in source:
        return "excluded", "defines no Model class"
    if "task_name" in source and "long_term_forecast" not in source:
        tasks = sorted(set(re.findall(r"task_name\s*(?:==|in)\s*\[?\s*'(\w+)'", source)))
        return "excluded", f"no long-term forecasting branch (its tasks: {', '.join(tasks) or 'none named'})"
    unsupported = unsupported_forecast(source)
    if unsupported:
        return "excluded", f"its long_term_forecast branch raises NotImplementedError: {unsupported}"
    return "ltf", ""


def model_files(tslib):
    root = Path(tslib)
    require((root / "models").is_dir() and (root / "layers").is_dir(),
            f"--tslib {tslib} has no models/ and layers/: give the root of a Time-Series-Library checkout")
    return sorted(p for p in (root / "models").glob("*.py") if not p.name.startswith("_"))


# ---------------------------------------------------------------- a scratch copy with one file dropped in

def working_tree_files(repo):
    """This repository's tracked files and the untracked ones git does not ignore (the working tree as it is)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                            capture_output=True, text=True, check=True).stdout
    return [name for name in listed.split("\0") if name and (Path(repo) / name).is_file()]


def scratch_copy(repo, folder, model_file):
    """A copy of `repo`'s working tree in `folder` with `model_file` alone added as models/<its name>."""
    for name in working_tree_files(repo):
        target = Path(folder) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(repo) / name, target)
    shutil.copy2(model_file, Path(folder) / "models" / Path(model_file).name)
    return Path(folder)


def scratch_env(scratch):
    env = dict(os.environ, PYTHONPATH=str(scratch), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(name, None)
    return env


def file_args(name, scratch):
    """FILE_ARGS of model `name`, an ETTh1-shaped file written into the scratch copy where they name one."""
    arguments = list(FILE_ARGS.get(name, []))
    if "ETTH1" in arguments:
        folder = Path(scratch) / "dataset" / "ETTh1-shaped"
        write_etth1_shaped(folder)
        arguments[arguments.index("ETTH1")] = str(folder)
    return arguments


def write_etth1_shaped(folder):
    """ETTh1's length and columns (20 months of hours; its fixed split borders need exactly this length)."""
    from data_provider.synthetic import make_synthetic

    frame = make_synthetic(rows=14400, channels=7, seed=1)
    frame.columns = ["date", "HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / "ETTh1.csv", index=False)


def run_py(scratch, name, outputs, *extra, nproc=None):
    """`python run.py` in the scratch copy (`--ddp --nproc_per_node N` for N processes): (CompletedProcess,
    metrics.json or None)."""
    launch = ["--ddp", "--nproc_per_node", str(nproc)] if nproc else []
    argv = [sys.executable, "run.py", "--model", name, *RUN_ARGS, *file_args(name, scratch), *launch, *extra,
            "--checkpoints", str(outputs / "checkpoints"), "--results_dir", str(outputs / "results")]
    proc = subprocess.run(argv, cwd=scratch, env=scratch_env(scratch), capture_output=True, text=True,
                          timeout=STEP_TIMEOUT)
    found = sorted((outputs / "results").glob("*/metrics.json"))
    return proc, (json.loads(found[0].read_text()) if proc.returncode == 0 and found else None)


def one_line(proc):
    """What a failed run said: its first `error:` line (not the launcher's summary), else the first
    exception line of a traceback, else its last line."""
    lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    lines = [re.sub(r"/\S*/repo/", "", line) for line in lines]  # paths inside the scratch copy, shortened
    errors = [line for line in lines if line.startswith("error:") and "worker(s) failed" not in line]
    raised = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)]
    return (errors or raised or lines[-1:] or [f"exit {proc.returncode}, no output"])[0][:400]


# ---------------------------------------------------------------- the checks

def relative_difference(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def metrics_difference(a, b, keys=METRICS, history=True):
    """The largest relative difference over `keys` and every epoch's losses, and the key where it is."""
    pairs = [(key, a[key], b[key]) for key in keys if a.get(key) is not None]
    if history:
        for epoch_a, epoch_b in zip(a["history"], b["history"], strict=True):
            pairs += [(f"{key}@{epoch_a['epoch']}", epoch_a[key], epoch_b[key]) for key in HISTORY
                      if epoch_a.get(key) is not None]
    return max(((relative_difference(x, y), key) for key, x, y in pairs), default=(0.0, "-"))


def collect_contract(scratch):
    """The node ids of tests/test_model_contract.py in the scratch copy."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_model_contract.py", "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=scratch, env=scratch_env(scratch),
                          capture_output=True, text=True, timeout=STEP_TIMEOUT)
    return [line.strip() for line in proc.stdout.splitlines() if "::" in line]


def contract_tests(node_ids, name):
    """The tests parametrised with model `name`: not the suite's self-tests, nor the zoo's house style
    (docstring, `autoregressive` set), which a file dropped in from TSLib need not have, though it takes the
    name of a zoo model (DLinear, PatchTST, ...)."""
    mine = re.compile(rf"\[(?:[^\]]*-)?{re.escape(name)}(?:-[^\]]*)?\]$")
    return [node for node in node_ids if mine.search(node) and "::test_house_style[" not in node]


def run_contract(scratch, name, outputs):
    """(passed, total, [failing clause messages]) of the model contract for `name` in the scratch copy."""
    ids = contract_tests(collect_contract(scratch), name)
    if not ids:
        return 0, 0, ["no contract test collected"]
    report = outputs / "contract.xml"
    # the file is TSLib's even where it takes a zoo model's name (TiDE): held to what every file must do
    env = dict(scratch_env(scratch), TSL_CONTRACT_ARGS=shlex.join(file_args(name, scratch)), TSL_CONTRACT_DROPPED_IN=name)
    subprocess.run([sys.executable, "-m", "pytest", *ids, "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
                   cwd=scratch, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT)
    if not report.is_file():
        return 0, len(ids), ["pytest wrote no report"]
    failures = []
    cases = list(ElementTree.parse(report).iter("testcase"))
    for case in cases:
        for bad in [*case.iter("failure"), *case.iter("error")]:
            message = (bad.get("message") or "").splitlines()[0] if bad.get("message") else bad.tag
            message = message.split("ContractViolation: ", 1)[-1].replace(f"{scratch}/", "")
            failures.append(message[:300])
    return len(cases) - len(failures), len(cases), failures


def check_file(repo, model_file, keep=None):
    """Every check on one TSLib model file in its own scratch copy: a dict, one row of the table."""
    name = Path(model_file).stem
    row = dict(file=f"models/{name}.py", status="fails", difference="", micro="", reload="", contract="", note="")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"tslib_{name}_", dir=keep) as folder:
        scratch = scratch_copy(repo, Path(folder) / "repo", model_file)
        outputs = Path(folder) / "outputs"
        single, one = run_py(scratch, name, outputs / "1")
        if one is None:
            line = one_line(single)
            row.update(status="refused" if "pip install" in line else "fails", note=line)
            return finish(row, started)
        pair, two = run_py(scratch, name, outputs / "2", nproc=2)
        if two is None:
            row.update(note=f"2 processes: {one_line(pair)}")
        else:
            difference, where = metrics_difference(one, two)
            row["difference"] = f"{difference:.1e} ({where})" if difference else "0"
            row["equal"] = difference <= TOLERANCE and two["world_size"] == 2
            row["gap"] = difference if two["world_size"] == 2 else None
            if not row["equal"]:  # the same micro-batches on 1 process: is it the batch, not the processes?
                equal_micro_batches(scratch, name, outputs / "1x2", two, row)
        reload_proc, reloaded = run_py(scratch, name, outputs / "1", "--is_training", "0")
        if reloaded is None:
            row.update(reload="fails", note=f"--is_training 0: {one_line(reload_proc)}")
        else:
            difference, _ = metrics_difference(one, reloaded, history=False)
            row["reload"] = "same metrics" if difference <= TOLERANCE else f"differs by {difference:.1e}"
        passed, total, failures = run_contract(scratch, name, outputs)
        row["contract"] = f"{passed}/{total}"
        said = tslib_said(Path(model_file).parents[1], name, failures)
        if needs_floor(row, failures, total, said):  # one more run, only where the floor decides
            rounding_floor(scratch, name, outputs / "1t2", one, row)
        judge(row, name, failures, total, said)
    return finish(row, started)


def joined(*parts):
    return "; ".join(part for part in parts if part)


def judge(row, name, failures, total, said):
    """The row's status (verdict) and its note: the failures that count, what TSLib's own file does where ours
    raised, and the causes found by hand (by design, FOUND_CAUSES, CONTRACT_CAUSES)."""
    row["status"] = verdict(row, failures, total, said)
    own = own_limits(failures, said)
    counted = [failure for failure in dict.fromkeys(failures) if failure not in own]
    compared = []
    for failure in dict.fromkeys(failures):
        features, error = raised_at(failure) or (None, None)
        if failure in own:
            compared.append(f"--features {features}: fails in TSLib's own file identically: {error} (the file's own "
                            "limit: that contract clause does not count against it)")
        elif features in said:
            compared.append(f"TSLib's own {name}.py at --features {features}: {said[features]} (ours differs from "
                            "TSLib's)")
    design = BY_DESIGN.get(name, GENERIC_DESIGN)
    if row["status"].startswith("batch-dependent"):
        clauses = [title for title in (INVARIANCE_CLAUSE, WINDOWS_CLAUSE) if any(title in f for f in counted)]
        fails = f" (the contract's clauses it fails, of that property: {', '.join(clauses)})" if clauses else ""
        row["note"] = joined(f"by design: {design}{fails}", *compared)
    elif row.get("micro_train"):  # it fails for other reasons too; 1 vs 2 is still the design's
        row["note"] = joined(f"1 vs 2 by design: {design}", row["note"], *counted, *compared)
    elif row["difference"] and not row.get("equal"):
        row["note"] = joined(floor_line(row), f"1 vs 2: {FOUND_CAUSES[name]}" if name in FOUND_CAUSES else "",
                             row["note"], *counted, *compared)
    else:
        row["note"] = joined(row["note"], *counted, *compared)
    if name in CONTRACT_CAUSES:
        row["note"] = joined(row["note"], f"TSLib's own {name}.py: {CONTRACT_CAUSES[name]}")


def floor_line(row):
    """The rounding floor's figures, where it was measured."""
    if row.get("floor") is None:
        return ""
    within = "within" if rounding_sensitive(row) else "not within"
    return (f"rounding floor: 1 process on 1 vs 2 threads {row['floor_text']}, 1 vs 2 processes {row['difference']}: "
            f"{within} {ROUNDING_FACTOR} x the floor")


def rounding_floor(scratch, name, outputs, one, row):
    """Trains 1 process again on 2 threads (OTHER_THREADS): row['floor'] is the largest relative difference of
    its metrics and losses from the 1-thread run `one`, the file's own rounding (no DDP in either)."""
    proc, threaded = run_py(scratch, name, outputs, *OTHER_THREADS)
    if threaded is None:
        row["note"] = joined(row["note"], f"1 process on 2 threads: {one_line(proc)}")
        return
    floor, where = metrics_difference(one, threaded)
    row.update(floor=floor, floor_text=f"{floor:.1e} ({where})" if floor else "0")


# TSLib's own file, imported from its checkout in a process of its own (never from this repository), trained
# forward once on random inputs: does a contract configuration fail in TSLib itself?
OWN_FORWARD = """
import importlib, json, sys
from types import SimpleNamespace
import torch
sys.path.insert(0, sys.argv[1])
configs = SimpleNamespace(**json.loads(sys.argv[3]))
torch.manual_seed(0)
try:
    model = importlib.import_module("models." + sys.argv[2]).Model(configs).train()
    steps = configs.label_len + configs.pred_len
    out = model(torch.randn(4, configs.seq_len, configs.enc_in), torch.randn(4, configs.seq_len, 4),
                torch.randn(4, steps, configs.dec_in), torch.randn(4, steps, 4))
    print("runs, output", tuple((out[0] if isinstance(out, tuple) else out).shape))
except Exception as exc:
    print(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
"""


def own_configs(name, features):
    """TSLib's configs for model `name` as the contract builds it with --features `features` (7 columns)."""
    from utils.arguments import build_parser

    args, _ = build_parser().parse_known_args([*RUN_ARGS, *FILE_ARGS.get(name, []), "--features", features])
    args.enc_in = args.dec_in = 1 if features == "S" else 7
    args.c_out = 7 if features == "M" else 1
    return dict(vars(args), task_name="long_term_forecast")


# The contract's clause where the model raised at a --features configuration: the configuration and the error.
RAISED = re.compile(r"output shape \(--features (\w+), batch 4\): (\w+: .*?)(?: \(at [^)]*\))?(?:; |$)")


def raised_at(failure):
    """(features, 'Error: message') of a contract failure where the model raised at that configuration, or None."""
    found = RAISED.search(failure)
    return found.groups() if found else None


def tslib_env():
    """The environment TSLib's own file is imported in: this one's without PYTHONPATH, which could name this
    repository, whose `models` package (a regular one) Python would import before a checkout's namespace folder
    whatever sys.path's order; one thread."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return dict(env, OMP_NUM_THREADS="1")


def tslib_said(tslib, name, failures):
    """{features: what TSLib's own file does at the same shapes} for each contract configuration (--features
    S / MS) where ours raised: 'runs, output (...)' or its exception and message."""
    said = {}
    for features, _ in filter(None, map(raised_at, failures)):
        proc = subprocess.run([sys.executable, "-c", OWN_FORWARD, str(tslib), name,
                               json.dumps(own_configs(name, features), default=str)],
                              cwd=tempfile.gettempdir(), env=tslib_env(),
                              capture_output=True, text=True, timeout=STEP_TIMEOUT)
        said[features] = (proc.stdout.strip().splitlines() or [one_line(proc)])[-1]
    return said


def own_limits(failures, said):
    """{failure: its --features} of the contract failures that are the file's own limit: TSLib's own file
    raised at the same configuration with the same exception and message, shapes included (`said`, from
    tslib_said). Any other failure, and one where TSLib's file runs or raises otherwise, is not."""
    limits = {}
    for failure in failures:
        features, error = raised_at(failure) or (None, None)
        if features is not None and said.get(features) == error:
            limits[failure] = features
    return limits


def equal_micro_batches(scratch, name, outputs, two, row):
    """Trains on 1 process in the micro-batches of 4 the 2-process run had (`--accumulation_steps 2`) and
    compares with the 2-process run: row['micro'] gets the figures, row['micro_train'] whether every epoch's
    training loss agrees to TOLERANCE, row['micro_all'] whether every metric and loss does."""
    proc, one = run_py(scratch, name, outputs, *EQUAL_MICRO_BATCHES)
    if one is None:
        row["note"] = f"1 process x 2 micro-batches: {one_line(proc)}"
        return
    difference, where = metrics_difference(one, two)
    training = max(relative_difference(a["train_loss"], b["train_loss"])
                   for a, b in zip(one["history"], two["history"], strict=True))
    row.update(micro_train=training <= TOLERANCE, micro_all=difference <= TOLERANCE,
               micro=f"{difference:.1e} ({where})" if difference else "0")
    if difference and not row["micro_all"]:
        row["micro"] += f", training loss {training:.1e}" if training else ", training loss 0"


def verdict(row, failures, total, said=None):
    """'runs': 1 vs 2 processes agree, the reload gives the same metrics, every contract clause passes.
    'batch-dependent': all of that except 1 x 8 vs 2 x 4, which agree at equal micro-batches (every metric, or
    the training losses where the contract finds that the evaluation reads the batch too), and no contract
    clause fails but those of the same property. 'runs (rounding-sensitive)': as 'runs', but 1 vs 2 processes
    agree only within the file's own rounding (rounding_sensitive). A contract failure TSLib's own file shares
    (own_limits of `said`) does not count, and the status names it: 'runs (own limit: --features S)'. Else
    'fails': never counted as running."""
    own = own_limits(failures, said or {})
    counted = [failure for failure in failures if failure not in own]
    reloaded = row["reload"] == "same metrics" and total > 0
    same_property = all(INVARIANCE_CLAUSE in failure or WINDOWS_CLAUSE in failure for failure in counted)
    evaluation_reads_batch = any(WINDOWS_CLAUSE in failure for failure in counted)
    qualifiers = []
    if row.get("equal") and reloaded and not counted:
        status = "runs"
    elif (row.get("micro_train") and (row.get("micro_all") or evaluation_reads_batch) and reloaded
          and same_property):
        status = "batch-dependent"
    elif rounding_sensitive(row) and reloaded and not counted:  # equal micro-batches do not explain it
        status, qualifiers = "runs", ["rounding-sensitive"]
    else:
        return "fails"
    qualifiers += [f"own limit: --features {features}" for features in dict.fromkeys(own.values())]
    return status + (f" ({'; '.join(qualifiers)})" if qualifiers else "")


def rounding_sensitive(row):
    """1 vs 2 processes (row['gap']) within ROUNDING_FACTOR x the file's own rounding floor (row['floor']: 1 vs
    2 threads on 1 process), a floor itself above TOLERANCE: a file whose floor is below it rounds finely, so a
    larger 1 vs 2 is not its rounding."""
    gap, floor = row.get("gap"), row.get("floor")
    return gap is not None and floor is not None and floor > TOLERANCE and gap <= ROUNDING_FACTOR * floor


def needs_floor(row, failures, total, said):
    """Whether the rounding floor decides the verdict: 1 vs 2 processes differ, equal micro-batches do not
    explain it, and the file would run with any floor (so a file that fails anyway costs no extra run)."""
    unbounded = dict(row, floor=float("inf"))
    return (row.get("gap") is not None and not row.get("equal") and row.get("floor") is None
            and verdict(unbounded, failures, total, said).startswith("runs (rounding-sensitive"))


def finish(row, started):
    row["seconds"] = f"{time.perf_counter() - started:.0f}"
    print(f"  {row['file']}: {row['status']} {row['difference']} {row.get('micro', '')} {row['reload']} "
          f"{row['contract']} ({row['seconds']} s) {row['note']}", flush=True)
    return row


# ---------------------------------------------------------------- the report

WHOLE = ("1 vs 2", "by design", "TSLib's own", "--features", "rounding floor")  # its own findings, never cut


def shortened(note, each=240):
    """A row's failures, each cut to its first `each` characters (the clause and its cause come first)."""
    return "; ".join(part if len(part) <= each or part.startswith(WHOLE) else part[:each] + " ..."
                     for part in note.split("; ") if part)


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def status_parts(status):
    """'runs (rounding-sensitive; own limit: --features S)' -> ('runs', ['rounding-sensitive', 'own limit: ...'])."""
    base, _, inside = status.partition(" (")
    return base, [part for part in inside.removesuffix(")").split("; ") if part]


def own_findings(rows):
    """What of the files' own their statuses name (verdict's qualifiers), as the summary line says it."""
    rounding = [Path(row["file"]).stem for row in rows if "rounding-sensitive" in status_parts(row["status"])[1]]
    limits = {Path(row["file"]).stem: [part.removeprefix("own limit: ") for part in status_parts(row["status"])[1]
                                       if part.startswith("own limit: ")] for row in rows}
    limits = {name: features for name, features in limits.items() if features}
    said = []
    if rounding:
        said.append(f"{len(rounding)} rounding-sensitive: 1 vs 2 processes within {ROUNDING_FACTOR} x the file's own "
                    f"rounding floor, 1 vs 2 threads ({', '.join(rounding)})")
    if limits:
        said.append(f"{len(limits)} with a contract configuration that fails in TSLib's own file identically ("
                    + ", ".join(f"{name} {' and '.join(features)}" for name, features in limits.items()) + ")")
    return said


def summary(rows):
    """The line the issue asks for: files that run (every check passed), the batch-dependent ones apart, each
    class of the files' own findings counted and named."""
    bases = [status_parts(row["status"])[0] for row in rows]
    count = {status: bases.count(status) for status in
             ("runs", "batch-dependent", "refused", "fails", "not run")}  # not run: a merged run ended first
    running = [row for row, base in zip(rows, bases) if base == "runs"]
    said = own_findings(running)
    parts = [f"**{count['runs']} of {len(rows)} model files run unchanged**"
             + (f", of them {' and '.join(said)}" if said else "")]
    if count["batch-dependent"]:
        dependent = [row for row, base in zip(rows, bases) if base == "batch-dependent"]
        names = ", ".join(Path(row["file"]).stem for row in dependent)
        said = own_findings(dependent)
        parts.append(f"{count['batch-dependent']} more run unchanged but train alike on 1 and 2 processes only at "
                     f"equal micro-batches: they read their batch by design ({names})"
                     + (f", of them {' and '.join(said)}" if said else ""))
    parts.append(f"{count['refused']} refused in one line for a package that is not installed")
    parts.append(f"{count['fails']} fail")
    if count["not run"]:
        parts.append(f"{count['not run']} not run")
    return "; ".join(parts) + "."


def run_record(command, seconds, files):
    """What the results file says of one run: its command, when, from which commit, how long, how many files."""
    return dict(command=command, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                version=repository_version(), seconds=seconds, files=files)


def markdown(rows, excluded, tslib, runs):
    """The results file; `runs`: run_record of this run and of every merged one (the rows' origins)."""
    said = [f"`{run['command']}`, {run['date']}, this repository's {run['version']}, {run['seconds']:.0f} s "
            f"({run['files']} files)" for run in runs]
    lines = [f"# TSLib's long-term-forecasting model files, dropped in unchanged", "",
             said[0] if len(said) == 1 else "\n".join([f"Rows from {len(said)} runs (a file checked again "
                                                       "replaces its earlier row):", "", *(f"- {x}" for x in said)]),
             "",
             f"TSLib {checkout_version(tslib)}; torch {torch_version()}, CPU (2 cores shared with other jobs), "
             f"{sum(run['seconds'] for run in runs):.0f} s of runs in all" + (" (some of them at once)." if len(runs) > 1
                                                                            else "."),
             "", summary(rows), "",
             "Each file was copied alone into a scratch copy of this repository. *1 vs 2*: the largest relative "
             "difference of the metrics and losses of one epoch with `--global_batch_size 8 --sync_bn` on 1 and "
             f"on 2 processes (at most {TOLERANCE:g} to pass); *equal micro-batches*, only where those differ: 1 "
             "process with `--accumulation_steps 2` (micro-batches of 4, as on each of the 2 processes) against "
             "the 2 processes; *reload*: the checkpoint tested again with `--is_training 0`; *contract*: clauses "
             "of tests/test_model_contract.py passed (a batch-dependent file fails only those of that property: "
             "1 x 8 vs 2 x 4, and windows independent where its evaluation reads the batch too). *Rounding-sensitive*: "
             "1 vs 2 differs, equal micro-batches do not explain it and all else passes, so 1 process trained again "
             "with `--num_threads 2` gives the file's own rounding floor (the same arithmetic in another summation "
             f"order, no DDP); 1 vs 2 within {ROUNDING_FACTOR} x that floor, a floor above {TOLERANCE:g}, is "
             "counted as running. *Own limit*: a contract configuration where the file raises fails in TSLib's own "
             "file, run from the checkout at the same shapes, with the same exception and message; that clause "
             "does not count against the file (the contract column still counts it; any other failure counts).", "",
             "| file | status | 1 vs 2 | equal micro-batches | reload | contract | seconds | refusal or failure |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {row['file']} | {row['status']} | {row['difference']} | {row.get('micro', '')} | {row['reload']} "
              f"| {row['contract']} | {row['seconds']} | {cell(shortened(row['note']))} |" for row in rows]
    lines += ["", "Not long-term-forecasting model files:", "", "| file | why excluded |", "|---|---|"]
    lines += [f"| models/{name}.py | {cell(why)} |" for name, why in excluded]
    return "\n".join(lines) + "\n"


def repository_version():
    """The commit the scratch copies were made from, and how many working-tree files differed from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=normal"], cwd=REPO,
                             capture_output=True, text=True).stdout.splitlines()
    return f"commit {head.stdout.strip()}" + (f" with {len(changed)} uncommitted files" if changed else "")


def checkout_version(tslib):
    proc = subprocess.run(["git", "log", "-1", "--format=%h (%cs)"], cwd=tslib, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else "(not a git checkout)"


def torch_version():
    import torch

    return torch.__version__


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tslib", required=True, help="root of a Time-Series-Library checkout (outside this repository)")
    parser.add_argument("--models", "--files", nargs="*", help="only these file names, e.g. PatchTST TimesNet "
                        "(default: every LTF file)")
    parser.add_argument("--jobs", type=int, default=1, help="files checked at once (each runs up to 2 processes)")
    parser.add_argument("--out", help="write the markdown table here (e.g. lab/results/tslib_models.md)")
    parser.add_argument("--keep", help="make the scratch copies under this folder (default: the system's temp)")
    parser.add_argument("--json", help="also write the rows here, for --merge")
    parser.add_argument("--merge", nargs="*", default=[],
                        help="rows of earlier runs (--json files) under this run's; a file checked again replaces them")
    parser.add_argument("--merge_markdown", help="rows and run records of a results file this script wrote (e.g. "
                        "lab/results/tslib_models.md), under this run's and --merge's")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    tslib = Path(args.tslib).resolve()
    require(not tslib.is_relative_to(REPO), f"--tslib {args.tslib} is inside this repository: keep TSLib outside it")
    files = model_files(tslib)
    if args.models:
        unknown = sorted(set(args.models) - {path.stem for path in files})
        require(not unknown, f"--models {' '.join(unknown)}: not in {tslib / 'models'}")
    kinds = {path: classify(path) for path in files}  # every file: the excluded ones are listed in any case
    excluded = [(path.stem, why) for path, (kind, why) in kinds.items() if kind != "ltf"]
    chosen = [path for path, (kind, _) in kinds.items()
              if kind == "ltf" and (not args.models or path.stem in args.models)]
    print(f"{len(chosen)} long-term-forecasting model files in {tslib / 'models'}, {len(excluded)} excluded", flush=True)
    started = time.perf_counter()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda path: check_file(REPO, path, args.keep), chosen))
    command = shlex.join(["python", "lab/tslib_models.py", *(sys.argv[1:] if argv is None else argv)])
    run = run_record(command, time.perf_counter() - started, len(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(rows=rows, seconds=run["seconds"], run=run), indent=1))
    rows, runs = merged(rows, run, args.merge, args.merge_markdown)
    text = markdown(rows, excluded, tslib, runs)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return rows


def merged(rows, run, earlier, results=None):
    """`rows` with those of a results file (`results`, markdown_rows) and of earlier runs' --json files for the
    files not checked here, in file order, and the run records of every run (an earlier file without one: its
    seconds only)."""
    by_file, runs = {}, []
    if results:
        table, records = markdown_rows(results)
        by_file.update({row["file"]: row for row in table})
        runs += records
    for path in earlier:
        saved = json.loads(Path(path).read_text())
        by_file.update({row["file"]: row for row in saved["rows"]})
        runs.append(saved.get("run") or dict(command=f"(rows of {path})", date="?", version="?",
                                             seconds=saved["seconds"], files=len(saved["rows"])))
    by_file.update({row["file"]: row for row in rows})
    return [by_file[name] for name in sorted(by_file, key=str.lower)], [*runs, run]


# A run record as markdown() writes it, in the list of runs or alone.
RUN_LINE = re.compile(r"^(?:- )?`(?P<command>[^`]+)`, (?P<date>[^,]+), this repository's (?P<version>[^,]+), "
                      r"(?P<seconds>[\d.]+) s \((?P<files>\d+) files\)$")
COLUMNS = ("file", "status", "difference", "micro", "reload", "contract", "seconds", "note")


def markdown_rows(path):
    """(rows, run records) of a results file markdown() wrote: the committed table is the source when the --json
    files of its runs are gone. A note is as the table shows it (long failures already cut, shortened)."""
    rows, runs = [], []
    for line in Path(path).read_text().splitlines():
        record = RUN_LINE.match(line)
        if record:
            runs.append(dict(record.groupdict(), seconds=float(record["seconds"]), files=int(record["files"])))
        elif line.startswith("| models/") and line.count(" | ") >= len(COLUMNS) - 1:
            cells = [part.strip().replace("\\|", "|") for part in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows.append(dict(zip(COLUMNS, cells, strict=True)))
    require(rows, f"--merge_markdown {path}: no row of this script's table in it")
    return rows, runs


if __name__ == "__main__":
    try:
        main()
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
