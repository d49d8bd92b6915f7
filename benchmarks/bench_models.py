"""How close each model's training step comes to what the hardware can do, side by side in one run.

    python benchmarks/bench_models.py                                  # every model, eager fp32, ETTh1-96
    python benchmarks/bench_models.py --variants eager,compile,amp --tslib /path/to/Time-Series-Library
    python benchmarks/bench_models.py --models TiDE TimeMixer --scaled --rounds 5

For every model the registry finds, at its ETTh1 script's settings for horizon 96 (read by running
scripts/long_term_forecast/ETT_script/<Model>_ETTh1.sh with a stand-in `python` that records run.py's
arguments, so the table follows the scripts), on the first --steps training batches held in memory:

- step time: one optimizer step (forward, backward, Adam) as Exp_Forecast.train_step takes it, the
  median over --rounds interleaved rounds (every model and variant once per round, so a noisy machine
  slows all columns alike) of each round's median step;
- FLOPs per step: torch.utils.flop_counter over one step's forward and backward (matrix products and
  convolutions; element-wise work is not counted), and the achieved rate against the dense GEMM rate
  measured in the same rounds (a 2048^3 fp32 product on the CPU, 8192^3 on a GPU; bf16 for --use_amp);
- products alone: the step's matrix products, convolutions and attention calls replayed by themselves at
  the shapes and strides they had (ProductsAlone): what the step would take if nothing else cost anything,
  the ceiling for models whose products are too small or skinny for the square GEMM rate;
- variants: `eager` (fp32, dropout masks keyed by the sample as in training), `compile` (--compile), `amp`
  (--use_amp, bf16), `unkeyed` (eager with masks from the global generator: what keying costs), `baseline`
  (the model of another checkout of this repository, --baseline: before and after a speed change), and `tslib`: TSLib's own
  implementation of the model from the checkout --tslib gives (imported from there, nothing copied),
  built from the same arguments and trained on the same batches with TSLib's loop body and its Adam;
- epoch shares (eager): the data path's share of a training step (fetching and gathering a batch
  against computing on it) and evaluation's share of an epoch, with the test split scored at every
  epoch (TSLib) and with --test_every_epoch false; evaluation is timed on the first batches of the
  validation split and scaled to its length and the test split's;
- --scaled: a second row at a larger setting for the models whose script step is tiny (SCALED);
- --ablate FLAGS ...: the eager step again with each string of run.py flags appended (`--dropout 0`,
  `--use_norm 0`), a column each: what a part of the model costs, measured in the same rounds;
- --breakdown: each eager step timed call by call (call_breakdown): products, element-wise work and copies
  over tensors of 4 MiB or more and smaller, views, the optimizer; where a step's time goes beyond its products.

Device-agnostic: on a CUDA machine the same command fills the GPU table (the device is synchronised
before every reading). The markdown table is printed and written to --out.
"""
import argparse
import importlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode, flop_registry

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.outputs import add_output_arguments  # noqa: E402
from benchmarks.checkouts import packages_from  # noqa: E402
from data_provider.data_factory import data_provider  # noqa: E402
from data_provider.global_batches import GlobalStep  # noqa: E402
from exp.exp_forecast import Exp_Forecast  # noqa: E402
from exp.forward import forward  # noqa: E402
from exp.settings import fill_defaults, resolve_args  # noqa: E402
from models import available_models  # noqa: E402
from utils.arguments import parse_args, str2bool  # noqa: E402
from utils.errors import UserError, require  # noqa: E402
from utils.files import atomic_write  # noqa: E402
from utils.tools import keep_freed_memory  # noqa: E402

SCRIPTS = REPO / "scripts" / "long_term_forecast" / "ETT_script"
ETTH1 = REPO.parent / "shared" / "datasets" / "ETT-small"
# A larger setting for models whose script step is a fraction of a GFLOP (the hardware then idles on
# per-operator overhead): wider layers and bigger batches, the data and horizon unchanged.
SCALED = {
    "DLinear": ["--batch_size", "2048"],
    "NLinear": ["--batch_size", "2048"],
    "iTransformer": ["--d_model", "512", "--d_ff", "2048", "--batch_size", "128"],
    "TSMixer": ["--d_model", "512", "--batch_size", "256"],
    "TimeMixer": ["--d_model", "64", "--d_ff", "128", "--batch_size", "512"],
}
VARIANTS = ("eager", "compile", "amp", "unkeyed", "baseline", "tslib")


# ------------------------------------------------------------------ the scripts' arguments
def script_arguments(model):
    """run.py's arguments in <model>_ETTh1.sh for its training run at horizon 96, as the script itself
    assembles them: it runs with a stand-in `python` first on PATH that records `run.py` calls and
    passes every other call (the protocol-C scripts' `python -c`) to this interpreter."""
    script = SCRIPTS / f"{model}_ETTh1.sh"
    require(script.is_file(), f"{model} has no {script.relative_to(REPO)}: give it one, or leave it out of --models")
    with tempfile.TemporaryDirectory() as folder:
        shim, capture = Path(folder) / "python", Path(folder) / "calls.jsonl"
        record = "import json, os, sys; open(os.environ['TSL_CAPTURE'], 'a').write(json.dumps(sys.argv[1:]) + '\\n')"
        shim.write_text(f'#!/bin/sh\nif [ "$1" = run.py ]; then shift; exec "{sys.executable}" -c "{record}" "$@"; fi\n'
                        f'exec "{sys.executable}" "$@"\n')
        shim.chmod(0o755)
        env = dict(os.environ, PATH=f"{folder}{os.pathsep}{os.environ['PATH']}", PRED_LENS="96", TSL_CAPTURE=str(capture))
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
        require(done.returncode == 0 and capture.is_file(), f"{script.name} did not run: {done.stderr.strip()[-500:]}")
        calls = [json.loads(line) for line in capture.read_text().splitlines()]
    training = [argv for argv in calls if _flag(argv, "--is_training", "1") == "1"]
    require(training, f"{script.name} starts no training run")
    return training[0]


def _flag(argv, name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


def data_arguments(root):
    """ETTh1 from `root` when it is there, else the built-in data at ETTh1's size (7 channels, hourly)."""
    if (Path(root) / "ETTh1.csv").is_file():
        return ["--data", "ETTh1", "--root_path", str(root), "--data_path", "ETTh1.csv"], "ETTh1"
    return ["--data", "synthetic", "--synthetic_rows", "17420", "--synthetic_channels", "7"], "synthetic (ETTh1's size)"


# ------------------------------------------------------------------ building what is timed
def experiment(argv, device):
    args = fill_defaults(parse_args(argv))
    resolve_args(args, 1)
    return Exp_Forecast(args, device)


def first_batches(args, device, steps, split="train", full_inputs=False):
    """The first `steps` batches of a split, on the device (with every input TSLib's loop reads if
    `full_inputs`: its models take the decoder input and both time features whatever they use)."""
    if full_inputs:
        args = args.replace(model_inputs=("x_enc", "x_mark_enc", "x_dec", "x_mark_dec"))
    _, loader = data_provider(args, split, device)
    batches = []
    for batch in loader:
        batches.append(tuple(t.to(device) if torch.is_tensor(t) else t for t in batch))
        if len(batches) == steps:
            break
    return batches, loader


class OursStep:
    """One Exp_Forecast.train_step per call, cycling through the batches, as training takes it: a GlobalStep
    whose dropout masks follow the samples (layers.dropout), or with `keyed` False masks from the global
    generator (the `unkeyed` variant: what keying the masks costs)."""

    def __init__(self, argv, device, steps, keyed=True):
        self.exp = experiment(argv, device)
        self.batches, self.loader = first_batches(self.exp.args, device, steps)
        self.optimizer = self.exp.make_optimizer()
        self.exp.model.train()
        self.exp.masks_follow_samples = self.exp.masks_follow_samples and keyed
        self.i = 0

    def __call__(self):
        batch = self.batches[self.i % len(self.batches)]
        self.i += 1
        samples = batch[0].shape[0]
        self.exp.train_step(GlobalStep([batch], samples, epoch=0, firsts=[self.i * samples]), self.optimizer)


def tslib_configs(args):
    """TSLib's `configs` from ours: the same names (TSLib's scripts run here unchanged), plus the
    defaults of TSLib's run.py for what this codebase has no argument for."""
    configs = SimpleNamespace(**vars(args))
    for name, value in {"task_name": "long_term_forecast", "factor": 1, "embed": "timeF", "freq": "h",
                        "distil": True, "moving_avg": 25, "channel_independence": 1, "decomp_method": "moving_avg",
                        "use_norm": 1, "down_sampling_layers": 0, "down_sampling_window": 1,
                        "down_sampling_method": None, "seg_len": 96, "expand": 2, "d_conv": 4,
                        "num_class": 1}.items():
        if getattr(configs, name, None) is None:
            setattr(configs, name, value)
    return configs


def model_class_from(root, name):
    """models/<name>.py's Model from the checkout `root` (TSLib's, or another of this repository), or None."""
    root = Path(root)
    path = root / "models" / f"{name}.py"
    if not path.is_file():
        return None
    with packages_from(root):
        try:
            module = importlib.import_module(f"models.{name}")
        except ImportError as missing:  # TSLib's layers import its requirements (reformer_pytorch, ...)
            require(False, f"{path} needs {missing.name or missing}: pip install the requirements of {root} "
                           f"(its requirements.txt), or leave that variant out")
    require(Path(module.__file__).resolve() == path.resolve(), f"imported {module.__file__}, not {path}")
    return module.Model


class BaselineStep(OursStep):
    """OursStep with the model of another checkout of this repository (--baseline: an earlier commit, e.g.
    `git worktree add /tmp/base 4c91fbb`), built from the same arguments and seed: a model's speed work is
    measured against the code before it, on the same batches, in the same rounds."""

    def __init__(self, model_class, argv, device, steps):
        super().__init__(argv, device, steps, keyed=False)
        torch.manual_seed(self.exp.args.seed)
        self.exp.raw_model = self.exp.model = model_class(self.exp.args).to(device).train()
        self.optimizer = self.exp.make_optimizer()


class TslibStep:
    """TSLib's exp_long_term_forecasting.train loop body on the same batches: decoder input of
    label_len known steps then zeros, outputs[:, -pred_len:, f_dim:], MSE, backward, its Adam."""

    def __init__(self, model_class, argv, device, steps):
        args = experiment(argv, device).args
        torch.manual_seed(args.seed)
        self.model = model_class(tslib_configs(args)).float().to(device).train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.learning_rate)
        self.batches, _ = first_batches(args, device, steps, full_inputs=True)
        self.args, self.i = args, 0
        self.f_dim = -1 if args.features == "MS" else 0

    def __call__(self):
        x, y, x_mark, y_mark = self.batches[self.i % len(self.batches)][:4]
        self.i += 1
        pred_len, label_len = self.args.pred_len, self.args.label_len
        self.optimizer.zero_grad()
        dec_inp = torch.cat([y[:, :label_len], torch.zeros_like(y[:, -pred_len:])], dim=1).float()
        if x_mark.shape[-1] == 0:  # a script without calendar features (--embed none): TSLib's models take None
            x_mark = y_mark = None
        outputs = self.model(x, x_mark, dec_inp, y_mark)[:, -pred_len:, self.f_dim:]
        loss = torch.nn.functional.mse_loss(outputs, y[:, -pred_len:, self.f_dim:])
        loss.backward()
        self.optimizer.step()


def profile_top(step, device, top):
    """The `top` operators of one step by their own time (CPU, or the GPU's kernel time), with their
    share of the step: where the time goes beyond the matrix products."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(3):
            step()
        synchronizer(device)()
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in profiler.key_averages() if getattr(e, attribute) > 0]
    total = sum(getattr(e, attribute) for e in events)
    events.sort(key=lambda e: getattr(e, attribute), reverse=True)
    return [(e.key, 100 * getattr(e, attribute) / total, e.count // 3) for e in events[:top]]


def step_flops(step):
    """Matrix-product and convolution FLOPs of one forward + backward (the optimizer's element-wise
    update is not counted)."""
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


class _RecordProducts(TorchDispatchMode):
    """Every call of an operator the FLOP counter counts (matrix products, convolutions, attention),
    with the layout of its tensor arguments, so the same calls can be replayed on their own."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._overloadpacket in flop_registry:
            self.calls.append((func, *tree_map(_layout, (args, kwargs))))
        return func(*args, **kwargs)


class _Layout(NamedTuple):
    """A recorded tensor argument: what a fresh tensor needs to stand in for it."""
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device


def _layout(value):
    return _Layout(tuple(value.shape), value.stride(), value.dtype, value.device) if torch.is_tensor(value) else value


class ProductsAlone:
    """One step's matrix products, convolutions and attention calls, each on fresh tensors of the
    shapes and strides it had in the step, one after another: what the step would take if everything
    else (element-wise work, copies, the optimizer, Python) cost nothing. For a model of small or
    skinny products this, not the square GEMM rate, is the hardware's ceiling."""

    REPEATS = 4

    def __init__(self, step):
        recorder = _RecordProducts()
        with recorder:
            step()
        self.calls = [(func, *tree_map(self._tensor, (args, kwargs), is_leaf=lambda v: isinstance(v, _Layout)))
                      for func, args, kwargs in recorder.calls]

    @staticmethod
    def _tensor(value):
        if not isinstance(value, _Layout):
            return value
        shape, stride, dtype, device = value
        size = 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
        storage = torch.randn(size if all(shape) else 0, device=device).to(dtype)
        return storage.as_strided(shape, stride) if all(shape) else torch.empty(shape, dtype=dtype, device=device)

    def __call__(self):
        """The calls, each REPEATS times in a row (its operands then in cache, as in the step, where each
        product mostly reads what the operation before it wrote): time / REPEATS is one step's products."""
        with torch.no_grad():
            for func, args, kwargs in self.calls:
                for _ in range(self.REPEATS):
                    func(*args, **kwargs)


class _TimeCalls(TorchDispatchMode):
    """Wall time of every ATen call, each followed by a device sync, summed by category and by call."""

    LARGE = 4 << 20  # bytes: above L2 on the CPUs measured here, so an element-wise pass streams from L3 or memory

    def __init__(self, sync):
        super().__init__()
        self.sync = sync
        self.categories, self.calls, self.counts = {}, {}, {}

    @classmethod
    def category(cls, func, tensors):
        if func._overloadpacket in flop_registry:
            return "products"
        if func.is_view:
            return "views"
        name = func._overloadpacket.__name__
        if "adam" in name or name.startswith("_foreach"):
            return "optimizer"
        largest = max((t.numel() * t.element_size() for t in tensors), default=0)
        return "element-wise and copies, 4 MiB or more" if largest >= cls.LARGE else "element-wise and copies, smaller"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.sync()
        seconds = time.perf_counter() - start
        tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a]) if torch.is_tensor(t)]
        category = self.category(func, tensors)
        self.categories[category] = self.categories.get(category, 0.0) + seconds
        shapes = [list(t.shape) for t in tensors] if len(tensors) <= 4 else f"({len(tensors)} tensors)"
        call = f"{func._overloadpacket.__name__} {shapes}"
        self.calls[call] = self.calls.get(call, 0.0) + seconds
        self.counts[call] = self.counts.get(call, 0) + 1
        return out


def call_breakdown(step, sync, steps=5, top=6):
    """Where `steps` steps' time goes, call by call: each ATen call timed on its own (a TorchDispatchMode),
    summed into products, element-wise work and copies (over tensors of 4 MiB or more, and smaller), views
    and the optimizer; with the `top` dearest calls. Per step, in seconds: (time under the timer, categories
    as (name, seconds) from the largest, calls as (call, seconds, count))."""
    timer = _TimeCalls(sync)
    start = time.perf_counter()
    with timer:
        for _ in range(steps):
            step()
    elapsed = (time.perf_counter() - start) / steps
    categories = sorted(((k, v / steps) for k, v in timer.categories.items()), key=lambda kv: -kv[1])
    calls = sorted(((k, v / steps, timer.counts[k] // steps) for k, v in timer.calls.items()), key=lambda c: -c[1])
    return elapsed, categories, calls[:top]


def gemm(device, dtype):
    """A square product the size of which keeps the device busy, and its FLOPs."""
    n = 8192 if device.type == "cuda" else 2048
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    return (lambda: a @ b), 2 * n ** 3


# ------------------------------------------------------------------ timing
def synchronizer(device):
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def median_seconds(fn, calls, sync):
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        sync()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def data_seconds(loader, batches, sync):
    """Median seconds to produce one training batch on the device (the loader's own gather)."""
    seconds, it = [], iter(loader)
    for _ in range(batches):
        started = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        sync()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def evaluation_seconds(exp, device, batches):
    """Seconds of one validation pass and one test pass, from the first `batches` evaluation batches
    of each split scaled to the split's length."""
    sync, totals = synchronizer(device), []
    for split in ("val", "test"):
        _, loader = data_provider(exp.args, split, device)
        model = exp.raw_model
        model.eval()
        seconds, seen = 0.0, 0
        with torch.no_grad():
            for batch in loader:
                started = time.perf_counter()
                forward(model, batch, exp.args, split, device)
                sync()
                seconds += time.perf_counter() - started
                seen += 1
                if seen == batches:
                    break
        totals.append(seconds / seen * len(loader))
        model.train()
    return totals


# ------------------------------------------------------------------ the table
def render(rows, meta):
    lines = [f"# Training step per model: {meta['device']}, torch {meta['torch']}, {meta['threads']} threads",
             "",
             f"Data: {meta['data']}; each model at its ETTh1 script's settings for horizon 96 (scaled rows: "
             f"`SCALED` in bench_models.py). One optimizer step (forward, backward, Adam) on the first {meta['steps']} "
             f"training batches, median over {meta['rounds']} interleaved rounds of each round's median; "
             f"GEMM rate: a {meta['gemm_n']}^3 product in the same rounds, fp32 {meta['gemm_fp32']:.0f} GFLOP/s"
             + (f", bf16 {meta['gemm_bf16']:.0f} GFLOP/s" if meta.get("gemm_bf16") else "")
             + ". FLOPs: matrix products and convolutions of forward + backward (torch.utils.flop_counter). "
             "data: the loader's share of a step; eval: validation + test passes against one epoch of training "
             "(and validation alone, --test_every_epoch false); "
             "products alone: the step's matrix products, convolutions and attention calls replayed on their own "
             "at their shapes and strides (ProductsAlone), their time and its share of the eager step: the "
             "ceiling for models of small or skinny products, where the square GEMM rate is out of reach.",
             "",
             "| model | setting | GFLOP / step | eager ms | GFLOP/s | % of GEMM peak | products alone ms (% of step) | "
             + " | ".join(f"{v} ms" for v in meta["variants"] if v != "eager")
             + (" | " if len(meta["variants"]) > 1 else "") + "data % | eval % (val only) |",
             "|---|---|---|---|---|---|---|" + "---|" * (len(meta["variants"]) - 1) + "---|---|"]
    for row in rows:
        eager = row["ms"].get("eager")
        rate = row["gflop"] / eager if eager else float("nan")  # seconds per step
        cells = [row["model"], row["setting"], f"{row['gflop']:.3g}", _ms(eager), f"{rate:.0f}",
                 f"{100 * rate / meta['gemm_fp32']:.0f} %"]
        alone = row["ms"].get("alone")
        cells.append(f"{_ms(alone)} ({100 * alone / eager:.0f} %)" if alone and eager else "n/a")
        for variant in meta["variants"]:
            if variant == "eager":
                continue
            ms = row["ms"].get(variant)
            cells.append("n/a" if ms is None else f"{_ms(ms)} ({eager / ms:.2f}x)" if eager else _ms(ms))
        cells.append(f"{row['data_share']:.1f} %" if row.get("data_share") is not None else "")
        cells.append(f"{row['eval_share']:.1f} % ({row['val_share']:.1f} %)" if row.get("eval_share") is not None else "")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Columns after eager: that variant's ms per step and eager's time over it (above 1x: faster "
              "than our eager step; for `tslib`, how many times faster ours is"
              + ("; for `eager --flags` (--ablate), how much slower the step is with what those flags leave out"
                 if any(v.startswith("eager ") for v in meta["variants"]) else "") + ")."]
    profiled = [row for row in rows if row.get("profile")]
    if profiled:
        lines += ["", "## Where an eager step's time goes (torch.profiler: each operator's own time, share of the "
                  "step, calls per step)", ""]
        for row in profiled:
            ops = "; ".join(f"`{name}` {share:.0f} % ({calls})" for name, share, calls in row["profile"])
            lines.append(f"- {row['model']} ({row['setting']}): {ops}")
    broken_down = [row for row in rows if row.get("breakdown")]
    if broken_down:
        lines += ["", "## An eager step call by call (--breakdown: every ATen call timed on its own, 5 steps; each call also "
                  "pays the timer's Python dispatch, so the step under the timer is longer than its eager ms)", ""]
        for row in broken_down:
            elapsed, categories, calls = row["breakdown"]
            total = sum(seconds for _, seconds in categories)
            shares = "; ".join(f"{name} {_ms(seconds)} ms ({100 * seconds / total:.0f} %)" for name, seconds in categories)
            dearest = "; ".join(f"`{call}` {_ms(seconds)} ms ({count})" for call, seconds, count in calls)
            lines.append(f"- {row['model']} ({row['setting']}), {_ms(elapsed)} ms a step under the timer: {shares}. "
                         f"Dearest calls (calls a step): {dearest}")
    return "\n".join(lines) + "\n"


def _ms(value):
    if value is None:
        return "n/a"
    return f"{value * 1e3:.3g}" if value < 1 else f"{value * 1e3:.0f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=None, help="default: every model with an ETTh1 script")
    parser.add_argument("--variants", default="eager", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--tslib", default=None, help="a Time-Series-Library checkout (for the tslib variant)")
    parser.add_argument("--baseline", default=None,
                        help="another checkout of this repository, e.g. an earlier commit (for the baseline variant)")
    parser.add_argument("--root_path", default=str(ETTH1), help="folder of ETTh1.csv (else the built-in data)")
    parser.add_argument("--steps", type=int, default=12, help="timed steps per model and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scaled", action="store_true", help="also the SCALED settings")
    parser.add_argument("--no_shares", action="store_true", help="skip the data and evaluation shares")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also list each model's N most expensive operators (torch.profiler, eager step)")
    parser.add_argument("--ablate", nargs="+", default=[], metavar="FLAGS",
                        help="also time the eager step with each of these strings of run.py flags appended, e.g. "
                             "--ablate '--dropout 0' '--use_norm 0': a column each, eager's time over it above 1x "
                             "when the part left out costs time")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time each model's eager step call by call: products, element-wise work and "
                             "copies over large and small tensors, views, the optimizer, and the dearest calls")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--keep_freed_memory", type=str2bool, default=True,
                        help="as run.py's (default true); false: glibc's own malloc settings, as before run.py set "
                             "them (a process-wide setting: compare the two in separate runs)")
    add_output_arguments(parser, "bench_models.md", workdir=None)
    opts = parser.parse_args()
    if os.path.exists(opts.out) and not opts.overwrite:
        parser.error(f"{opts.out} exists; pass --overwrite to replace it")
    variants = [v for v in opts.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "eager" not in variants:
        parser.error(f"--variants must include eager and name only {', '.join(VARIANTS)}; got {opts.variants}")
    if "tslib" in variants and not opts.tslib:
        parser.error("the tslib variant needs --tslib /path/to/Time-Series-Library")
    if "baseline" in variants and not opts.baseline:
        parser.error("the baseline variant needs --baseline /path/to/an/earlier/checkout")
    ablations = {f"eager {flags.strip()}": shlex.split(flags) for flags in opts.ablate}
    if any(not argv or not argv[0].startswith("--") for argv in ablations.values()):
        parser.error(f"--ablate takes strings of run.py flags, e.g. --ablate '--dropout 0'; got {opts.ablate}")
    variants += list(ablations)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    if opts.keep_freed_memory:
        keep_freed_memory()
    device = torch.device(opts.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sync = synchronizer(device)
    data_argv, data_name = data_arguments(opts.root_path)
    models = opts.models or [m for m in available_models() if (SCRIPTS / f"{m}_ETTh1.sh").is_file()]
    gpu_flag = ["--use_gpu", "true" if device.type == "cuda" else "false", "--no_plots", "--quiet"]

    # every (model, setting) and its callable per variant
    cases = []
    for model in models:
        argv = script_arguments(model)
        settings = [("script", [])] + ([("scaled", SCALED[model])] if opts.scaled and model in SCALED else [])
        for setting, extra in settings:
            full = [*argv, *data_argv, *gpu_flag, *extra]
            label = f"{setting}: batch {_flag(full, '--batch_size', '32')}"
            steps = {"eager": OursStep(full, device, opts.steps)}
            if "compile" in variants:
                steps["compile"] = OursStep([*full, "--compile"], device, opts.steps)
            if "amp" in variants:
                steps["amp"] = OursStep([*full, "--use_amp"], device, opts.steps)
            for name, flags in ablations.items():
                steps[name] = OursStep([*full, *flags], device, opts.steps)
            if "unkeyed" in variants:
                steps["unkeyed"] = OursStep(full, device, opts.steps, keyed=False)
            if "baseline" in variants:
                model_class = model_class_from(opts.baseline, model)
                if model_class is not None:
                    steps["baseline"] = BaselineStep(model_class, full, device, opts.steps)
            if "tslib" in variants:
                model_class = model_class_from(opts.tslib, model)
                if model_class is not None:
                    steps["tslib"] = TslibStep(model_class, full, device, opts.steps)
            for name, step in steps.items():  # warm-up: allocator, kernels, the compiler
                for _ in range(3):
                    step()
                sync()
                print(f"{model} {setting} {name}: ready", flush=True)
            gflop = step_flops(steps["eager"]) / 1e9
            alone = ProductsAlone(steps["eager"])
            cases.append({"model": model, "setting": label, "gflop": gflop, "steps": steps, "alone": alone,
                          "times": {}})

    fp32_gemm, gemm_flops = gemm(device, torch.float32)
    bf16_gemm = gemm(device, torch.bfloat16)[0] if "amp" in variants else None
    gemm_rates = {"fp32": [], "bf16": []}
    for round_ in range(opts.rounds):
        gemm_rates["fp32"].append(gemm_flops / median_seconds(fp32_gemm, 5, sync) / 1e9)
        if bf16_gemm is not None:
            gemm_rates["bf16"].append(gemm_flops / median_seconds(bf16_gemm, 5, sync) / 1e9)
        for case in cases:
            # every other round in reverse: the variant timed second in a round ran 8-39 % faster in five
            # runs (TSMixer, the same code under two names), so a fixed order would favour one column
            order = list(case["steps"].items())
            for name, step in order[::-1] if round_ % 2 else order:
                seconds = median_seconds(step, opts.steps, sync)
                case["times"].setdefault(name, []).append(seconds)
                print(f"round {round_ + 1} {case['model']} {case['setting']} {name}: {seconds * 1e3:.2f} ms", flush=True)
            seconds = median_seconds(case["alone"], max(3, opts.steps // 2), sync) / ProductsAlone.REPEATS
            case["times"].setdefault("alone", []).append(seconds)

    rows = []
    for case in cases:
        row = {"model": case["model"], "setting": case["setting"], "gflop": case["gflop"],
               "ms": {name: statistics.median(times) for name, times in case["times"].items()}}
        if not opts.no_shares:
            eager = case["steps"]["eager"]
            fetch = data_seconds(eager.loader, opts.steps, sync)
            step = row["ms"]["eager"]
            val, test = evaluation_seconds(eager.exp, device, 4)
            train_epoch = len(eager.loader) * (fetch + step)
            row["data_share"] = 100 * fetch / (fetch + step)
            row["eval_share"] = 100 * (val + test) / (train_epoch + val + test)
            row["val_share"] = 100 * val / (train_epoch + val)
        if opts.profile:
            row["profile"] = profile_top(case["steps"]["eager"], device, opts.profile)
        if opts.breakdown:
            row["breakdown"] = call_breakdown(case["steps"]["eager"], sync)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items()}), flush=True)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    meta = {"device": f"{name} ({device.type})", "torch": torch.__version__, "threads": torch.get_num_threads(),
            "data": data_name, "steps": opts.steps, "rounds": opts.rounds, "variants": variants,
            "gemm_n": 8192 if device.type == "cuda" else 2048, "gemm_fp32": statistics.median(gemm_rates["fp32"]),
            "gemm_bf16": statistics.median(gemm_rates["bf16"]) if gemm_rates["bf16"] else None}
    table = render(rows, meta)
    print(table)
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(opts.out, lambda f: f.write(table), binary=False)
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    try:
        main()
    except UserError as problem:
        sys.exit(f"error: {problem}")
