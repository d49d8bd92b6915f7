"""Fine-tuning speed and memory per GPU: every release at its largest released shape (each release folder's
LARGEST_SHAPES, random weights: no download), or those --releases names (scripts/gpu_check.sh: Chronos-2, TimesFM 2.5,
Time-MoE-200M and Toto-2.0-2.5B), each fine-tuned by run.py under DDP, FSDP2 and LoRA on one GPU, as a user runs
them: samples/s and the peak GPU memory of the rank at a stated batch.

    python -m benchmarks.fine_tuning_table                       # every cell (a GPU), or a CPU dry run at tiny shapes
    python -m benchmarks.fine_tuning_table --releases A,B --modes FSDP2   # some cells (--model names)
    python -m benchmarks.fine_tuning_table --write               # store the GPU table as results/fine_tuning_table.*
    python -m benchmarks.fine_tuning_table --write --results_dir DIR   # ... in DIR (copy both files to results/)
    python -m benchmarks.fine_tuning_table --pending --write --releases A,B   # the stored page before a GPU ran it

Each cell is one `python run.py --ddp --nproc_per_node 1 ...` process (the public path: DDP, `--fsdp
--fsdp_mixed_precision bf16`, `--lora_rank`), trained for `--steps` optimizer steps with `--log_steps` every
`--window` steps: samples/s over every logged window but the first (start-up, allocator and kernel warm-up), from
the run's steps.csv; peak memory is metrics.json's `peak_gpu_mib` (torch.cuda.max_memory_allocated over the run).
Without CUDA every cell runs at tiny shapes and its line says "CPU dry run, not a figure"; `--write` then refuses.
Exit status: 0 when every cell ran (or was skipped for a missing package, or refused in run.py's one line: a mode
the model cannot take, such as --fsdp for a release that runs its blocks through their parts), 1 when one failed
or timed out, 2 for a usage error."""
import argparse
import csv
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
NAME = "fine_tuning_table"
DRY = "CPU dry run, not a figure"
PENDING = "pending a GPU"

LORA_RANK = 16
# mode: (what the table says, run.py's options). DDP and LoRA compute under bf16 autocast, FSDP2 under its bf16
# mixed-precision policy: the three in bf16, fp32 master weights and Adam.
MODES = {
    "DDP": ("DDP, bf16 autocast", ("--use_amp", "--amp_dtype", "bf16")),
    "FSDP2": ("FSDP2, bf16 mixed precision", ("--fsdp", "--fsdp_mixed_precision", "bf16")),
    "LoRA": (f"LoRA r={LORA_RANK} under DDP, bf16 autocast",
             ("--lora_rank", str(LORA_RANK), "--lora_alpha", str(2 * LORA_RANK), "--use_amp", "--amp_dtype", "bf16")),
}


class Setting:
    """The stated batch: `batch` windows of `seq_len` steps (one series each) -> `pred_len` per GPU; `steps`
    optimizer steps, logged every `window`."""

    def __init__(self, gpu, batch=None, steps=None, window=None):
        self.gpu = gpu
        self.seq_len, self.pred_len = (512, 64) if gpu else (64, 16)
        self.batch = batch or (16 if gpu else 4)
        self.window = window or (5 if gpu else 1)
        self.steps = steps or (3 * self.window if gpu else 2 * self.window)
        # enough rows for a few batches of training windows; validation and test cut to `eval_windows`
        self.rows = 4 * (self.seq_len + self.pred_len) + 2 * self.batch
        self.eval_windows = self.batch

    def describe(self):
        return (f"a batch of {self.batch} windows per GPU, {self.seq_len} steps of one series each -> "
                f"{self.pred_len}; {self.steps} optimizer steps, samples/s over steps {self.window + 1}-"
                f"{self.steps} (the first {self.window} warm up)")


def shapes(gpu):
    """{--model name: (run.py size arguments, its checkpoint and published size)} of every release folder with
    LARGEST_SHAPES, in the registry's order: the first entry (its largest released checkpoint) on a GPU, a tiny shape
    of the same layout on the CPU. A release is named only in its folder: a new one joins the table by itself."""
    from models.foundation import adapter_modules

    found = {}
    for module in adapter_modules():
        model = module.ADAPTERS[0].model
        shapes_of = getattr(module, "LARGEST_SHAPES", ())
        if shapes_of and model not in found:
            checkpoint, sizes, published = shapes_of[0][:3]
            found[model] = (sizes, f"{checkpoint}, {published}")
    tiny = {"d_model": 32, "d_ff": 64, "e_layers": 2, "n_heads": 2}
    return {name: (sizes if gpu else tiny, published) for name, (sizes, published) in found.items()}


def missing_package(release, mode):
    """The line saying which package a cell lacks (the release's official package, or peft for LoRA), or None."""
    from models import get_model_class
    from utils.errors import UserError

    try:
        get_model_class(release)  # a release's model file imports its package, or says how to install it
    except UserError as exc:
        return str(exc)
    if mode == "LoRA" and importlib.util.find_spec("peft") is None:
        return "--lora_rank needs the peft package: pip install peft"
    return None


def cell_argv(release, mode, sizes, setting, folder):
    """run.py's command line of one cell."""
    size_args = [f"--{name}={value}" for name, value in sizes.items()]
    return [sys.executable, str(REPO / "run.py"), "--ddp", "--nproc_per_node", "1", "--model", release, *size_args,
            "--seq_len", str(setting.seq_len), "--pred_len", str(setting.pred_len), "--data", "synthetic",
            "--synthetic_channels", "1", "--synthetic_rows", str(setting.rows), "--batch_size", str(setting.batch),
            "--eval_batch_size", str(setting.batch), "--train_steps", str(setting.steps),
            "--log_steps", str(setting.window), "--val_windows", str(setting.eval_windows),
            "--test_windows", str(setting.eval_windows), "--test_every_epoch", "false", "--no_plots",
            "--checkpoints", str(folder / "checkpoints"), "--results_dir", str(folder / "results"),
            *MODES[mode][1]]


def steady_rate(rates):
    """Samples/s over the logged windows after the first (each of the same number of samples, so the rate of all
    of them is the harmonic mean); the one window when there is only one."""
    timed = rates[1:] or rates
    if not timed or any(not r > 0 for r in timed):
        return math.nan
    return len(timed) / sum(1.0 / r for r in timed)


def read_run(folder):
    """(samples/s, peak GPU MiB of the rank or None) from the run's steps.csv and metrics.json."""
    metrics = next((folder / "results").glob("*/metrics.json"), None)
    steps = next((folder / "results").glob("*/steps.csv"), None)
    if metrics is None or steps is None:
        raise RuntimeError("the run wrote no metrics.json or steps.csv")
    with open(steps, newline="") as f:
        rates = [float(row["samples_per_s"]) for row in csv.DictReader(f)]
    peak = json.loads(metrics.read_text()).get("peak_gpu_mib")
    return steady_rate(rates), (max(peak) if peak else None)


def run_cell(release, mode, sizes, setting, timeout):
    """{"status", "samples_per_s", "peak_gib", "seconds"} of one cell."""
    missing = missing_package(release, mode)
    if missing:
        return {"status": f"skipped: {missing}"[:300], "samples_per_s": None, "peak_gib": None, "seconds": 0}
    folder = Path(tempfile.mkdtemp(prefix="fine_tuning_table_"))
    started = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    try:
        done = subprocess.run(cell_argv(release, mode, sizes, setting, folder), cwd=folder, env=env,
                              capture_output=True, text=True, timeout=timeout)
        seconds = time.perf_counter() - started
        if done.returncode == 2 and why(done).startswith("error:"):  # run.py's one line: a mode the model refuses
            return {"status": f"refused: {why(done)[len('error: '):]}"[:300], "samples_per_s": None,
                    "peak_gib": None, "seconds": seconds}
        if done.returncode != 0:
            return {"status": f"FAILED (exit {done.returncode}): {why(done)}", "samples_per_s": None,
                    "peak_gib": None, "seconds": seconds}
        rate, peak = read_run(folder)
        return {"status": "ok" if setting.gpu else DRY, "samples_per_s": rate,
                "peak_gib": None if peak is None else peak / 1024, "seconds": seconds}
    except subprocess.TimeoutExpired:
        return {"status": f"TIMED OUT after {timeout:.0f}s", "samples_per_s": None, "peak_gib": None,
                "seconds": time.perf_counter() - started}
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        return {"status": f"FAILED: {exc}"[:300], "samples_per_s": None, "peak_gib": None,
                "seconds": time.perf_counter() - started}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def why(done):
    """The line that says why a run failed: its first error line (run.py's `error: ...`, or an exception's last
    line), else the last line it wrote."""
    said = [line.strip() for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()]
    errors = [line for line in said if line.startswith("error:") or
              (not line.startswith(("File ", "warning")) and "Error: " in line.split(" ", 1)[0] + " ")]
    return (errors[0] if errors else said[-1] if said else "no output")[:300]


def failed(result):
    return result["status"].startswith(("FAILED", "TIMED OUT"))


def figure(value, digits):
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def cell_line(release, mode, setting, result):
    """The one line a cell prints (scripts/gpu_check.sh copies it into its summary)."""
    if result["samples_per_s"] is None:
        return f"fine-tuning {release} {mode}: {result['status']}"
    peak = f"peak {figure(result['peak_gib'], 2)} GiB" if result["peak_gib"] is not None else "peak: no GPU"
    return (f"fine-tuning {release} {mode} ({MODES[mode][0]}): {figure(result['samples_per_s'], 1)} samples/s, "
            f"{peak}, batch {setting.batch} x {setting.seq_len} -> {setting.pred_len}, {result['seconds']:.0f}s; "
            f"{result['status']}")


def device_line(gpu):
    import torch

    if not gpu:
        return f"{DRY}: no CUDA device (torch {torch.__version__}), every release at a tiny shape on the CPU"
    return (f"Measured on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
            "one GPU (one process)")


def document(rows, setting, published, status_line, command="--write"):
    """The result as markdown: its title, what was run, one row per cell."""
    lines = [
        "# Fine-tuning speed and memory per GPU", "",
        f"Generated by `python -m benchmarks.fine_tuning_table {command}`. {status_line}.", "",
        "Each release at its largest released shape (its folder's LARGEST_SHAPES: "
        + "; ".join(f"{name} {published[name]}" for name in dict.fromkeys(r for r, _, _ in rows))
        + "), weights random (no download), fine-tuned by `run.py --ddp --nproc_per_node 1` on the built-in "
        f"synthetic data: {setting.describe()}. Modes: "
        + "; ".join(f"{mode}: {label} (`{' '.join(options)}`)" for mode, (label, options) in MODES.items())
        + ". Peak memory: torch.cuda.max_memory_allocated of the rank over the run (evaluation included; the CUDA "
        "context not counted), GiB = 2^30 bytes. On one GPU FSDP2 shards nothing: its figure shows its cost "
        "against DDP's; the per-rank savings on more GPUs are on paper in memory_table.", "",
        "| release (`--model`) | mode | batch per GPU | samples/s | peak GPU memory (GiB) | status |",
        "|---|---|---|---|---|---|",
    ]
    for release, mode, result in rows:
        lines.append(f"| {release} | {mode} | {setting.batch} x {setting.seq_len} -> {setting.pred_len} | "
                     f"{figure(result['samples_per_s'], 1) or '-'} | {figure(result['peak_gib'], 2) or '-'} | "
                     f"{result['status']} |")
    return "\n".join(lines) + "\n"


def pending_document(releases, modes=tuple(MODES)):
    """The stored page before a GPU measured it: every cell pending, the GPU's setting stated."""
    rows = [(r, m, {"status": PENDING, "samples_per_s": None, "peak_gib": None, "seconds": 0})
            for r in releases for m in modes]
    published = {name: value[1] for name, value in shapes(True).items()}
    command = f"--pending --write --releases {','.join(releases)}"
    return document(rows, Setting(True), published, f"Not measured yet: every cell is {PENDING} "
                    "(scripts/gpu_check.sh --part finetune measures it)", command=command)


def store(text, folder):
    """`text` as folder/fine_tuning_table.json + .csv (benchmarks/results_page.py's format); the results page
    rewritten when `folder` is benchmarks/results."""
    from benchmarks import results_page

    folder.mkdir(parents=True, exist_ok=True)
    markdown = folder / f"{NAME}.md"
    markdown.write_text(text)
    results_page.add(markdown, replace=True)
    if folder.resolve() == RESULTS.resolve():
        results_page.main(["write"])
    print(f"stored as {folder / NAME}.json and {NAME}.csv", file=sys.stderr)


def choice(names, known, what):
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        raise SystemExit(f"fine_tuning_table: --{what} takes names of {', '.join(known)} "
                         f"({', '.join(unknown) or 'none given'} unknown)")
    return chosen


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", default=None, help="comma-separated --model names (default: every release)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--batch", type=int, default=None, help="windows per GPU (default 16; 4 in a dry run)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps a cell (default 3 x --window)")
    parser.add_argument("--window", type=int, default=None, help="steps a logged window (default 5; 1 dry run)")
    parser.add_argument("--cell_timeout", type=float, default=150.0, help="seconds one cell may take")
    parser.add_argument("--deadline_s", type=float, default=None,
                        help="start no cell past this many seconds (the rest: 'not run: no time left')")
    parser.add_argument("--write", action="store_true", help="store the GPU table (refused without CUDA)")
    parser.add_argument("--results_dir", type=Path, default=RESULTS, help="where --write stores it")
    parser.add_argument("--pending", action="store_true", help="no run: the table of cells pending a GPU")
    args = parser.parse_args(argv)
    known = tuple(shapes(False))
    try:
        releases = choice(args.releases or ",".join(known), known, "releases")
        modes = choice(args.modes, tuple(MODES), "modes")
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    for name in ("batch", "steps", "window"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            print(f"fine_tuning_table: --{name} must be a positive number", file=sys.stderr)
            return 2
    import torch

    gpu = torch.cuda.is_available()
    if args.write and not gpu and not args.pending:
        print(f"fine_tuning_table: --write stores the GPU table, and torch sees no CUDA device here: run it on a GPU "
              f"machine (scripts/gpu_check.sh --part finetune), or without --write for a {DRY}", file=sys.stderr)
        return 2
    if args.pending:
        text = pending_document(releases, modes)
        print(text)
        if args.write:
            store(text, args.results_dir)
        return 0
    setting = Setting(gpu, args.batch, args.steps, args.window)
    if setting.steps < setting.window:
        print("fine_tuning_table: --steps must be at least --window", file=sys.stderr)
        return 2
    found = shapes(gpu)
    published = {name: found[name][1] for name in releases}
    started, rows = time.perf_counter(), []
    print(f"# {device_line(gpu)}; {setting.describe()}", flush=True)
    for release in releases:
        for mode in modes:
            left = None if args.deadline_s is None else args.deadline_s - (time.perf_counter() - started)
            if left is not None and left < 20:
                result = {"status": "not run: no time left", "samples_per_s": None, "peak_gib": None, "seconds": 0}
            else:
                timeout = args.cell_timeout if left is None else min(args.cell_timeout, left - 5)
                result = run_cell(release, mode, found[release][0], setting, timeout)
            rows.append((release, mode, result))
            print(cell_line(release, mode, setting, result), flush=True)
    text = document(rows, setting, published, device_line(gpu))
    print(text)
    if args.write:
        store(text, args.results_dir)
    return 1 if any(failed(result) for _, _, result in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
