"""Peak memory and time of a Timer-XL training step with attention dropout, sample-keyed and not.

    python lab/bench_attention_dropout.py                 # 1 280 tokens, the table to results/
    python lab/bench_attention_dropout.py --tokens 640 --batch_size 2
    python lab/bench_attention_dropout.py --release_step MODEL     # keyed attention's paths in a release's step

One optimizer step as Exp_Forecast.train_step takes it (bench_models.OursStep), univariate synthetic data,
--input_token_len 24 so that --tokens tokens are seq_len = 24 x tokens steps, dropout 0.1. Variants, each in
a fresh process:

- `keyed`: what the CPU runs in training (layers.dropout.KeyedDropout.attend): layers.keyed_attention, the
  weights formed a query block of a sample at a time, bool masks from layers.dropout's keyed draws, drawn
  again in backward (formed whole instead, [B, H, S, S] with a float32 mask, it took 436 MiB here);
- `per_sample`: what a GPU runs: PyTorch's scaled_dot_product_attention with dropout_p, once per sample
  under the sample's seed (on a GPU the flash or memory-efficient kernel; on the CPU its math path);
- `fused`: masks from the global generator, one scaled_dot_product_attention call with dropout_p
  (what training under --compile, or a model that declares randomness_follows_sample = False, runs);
- `no_dropout`: --dropout 0, for scale. On the CPU every variant forms the weights: its flash kernel takes no
  dropout and no mask that needs a gradient (Timer-XL's learned variable bias is one).

`--release_step MODEL` (attention_paths): a training step of --model MODEL built at TSLib's sizes with a base
release's layer counts (12 + 12 layers, 12 heads; --d_model 64; Chronos-Bolt's --model for
lab/results/bench_attention_dropout_release_cpu.md), 32 windows, horizon 96, each keyed attention path against
the unkeyed step: SDPA calls and aten ops of one step, and the median over interleaved rounds of each round's
median step. `--device cuda` measures what a GPU runs (there keyed attention takes the fused path).

Peak: the process's VmHWM during the steps after a warm-up step (reset by /proc/self/clear_refs), less its
VmRSS just before, with glibc's mmap threshold fixed at 64 KiB so that freed tensors leave the resident
memory: the step's own peak. Time: the median of --steps steps.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_models import OursStep  # noqa: E402
from layers import dropout as dropout_module  # noqa: E402

VARIANTS = ("keyed", "per_sample", "fused", "no_dropout")


def memory_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(variant, tokens, batch_size, steps, d_model, n_heads):
    """In this process: the step's peak memory above the memory before it (MiB), and its median time (s)."""
    torch.set_num_threads(1)
    dropout_module.KeyedDropout.per_sample_attention = variant == "per_sample"
    argv = ["--model", "TimerXL", "--data", "synthetic", "--features", "S", "--synthetic_rows", 24 * tokens * 2,
            "--seq_len", 24 * tokens, "--input_token_len", 24, "--output_token_len", 24, "--d_model", d_model,
            "--d_ff", 2 * d_model, "--n_heads", n_heads, "--e_layers", 1, "--batch_size", batch_size,
            "--dropout", 0.0 if variant == "no_dropout" else 0.1, "--num_threads", 1, "--use_gpu", "false"]
    step = OursStep([str(a) for a in argv], torch.device("cpu"), 2, keyed=variant != "fused")
    step()  # warm-up: allocator pools, the optimizer's state
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to VmRSS
    before = memory_kib("VmRSS")
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"peak_mib": (memory_kib("VmHWM") - before) / 1024, "step_s": statistics.median(times)}


def script_step_times(models, rounds, steps, data_root):
    """Each model's step at its ETTh1 script's settings (bench_models.script_arguments): keyed attention as
    the CPU runs it, per sample (a GPU's path), and plain (masks from the global generator, F.dropout and
    SDPA's dropout_p: the unkeyed step), alternating in this process: the median over rounds of each round's
    median step (s)."""
    from benchmarks.bench_models import data_arguments, script_arguments

    data, _ = data_arguments(data_root)
    times = {}
    for model in models:
        argv = [*script_arguments(model), *data, "--num_threads", "1", "--use_gpu", "false"]
        keyed_step = OursStep(argv, torch.device("cpu"), steps)
        plain_step = OursStep(argv, torch.device("cpu"), steps, keyed=False)
        medians = {"keyed": [], "per_sample": [], "plain": []}
        for _ in range(rounds):
            for variant in medians:
                dropout_module.KeyedDropout.per_sample_attention = variant == "per_sample"
                step = plain_step if variant == "plain" else keyed_step
                step()
                taken = []
                for _ in range(steps):
                    start = time.perf_counter()
                    step()
                    taken.append(time.perf_counter() - start)
                medians[variant].append(statistics.median(taken))
        dropout_module.KeyedDropout.per_sample_attention = None
        times[model] = {variant: statistics.median(values) for variant, values in medians.items()}
    return times


ATTENTION_PATHS = {  # keyed attention's paths: (KeyedDropout.per_sample_attention, .fused_attention)
    "blocks": (False, False),  # a sample's query blocks, its masks from its generator (the CPU's)
    "per_sample": (True, None),  # one SDPA per sample under its seed
    "fused": (False, True),  # query blocks over all samples, masks hashed (what other devices run)
}
RELEASE_STEP = ["--data", "synthetic", "--features", "S", "--synthetic_rows", 3000,
                "--pred_len", 96, "--label_len", 0, "--d_model", 64, "--d_ff", 128, "--e_layers", 12, "--d_layers", 12,
                "--n_heads", 12, "--dropout", 0.1, "--batch_size", 32]


def _counted(step):
    """(SDPA calls, aten ops other than views) of one call of `step`."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchFunctionMode):
        sdpa = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.sdpa += func is torch.nn.functional.scaled_dot_product_attention
            return func(*args, **(kwargs or {}))

    class Ops(TorchDispatchMode):
        FREE = {"view", "unsqueeze", "expand", "_unsafe_view", "alias", "detach", "as_strided", "t", "transpose",
                "slice", "select", "permute", "squeeze"}
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += func.overloadpacket.__name__ not in self.FREE
            return func(*args, **(kwargs or {}))

    with Calls() as calls, Ops() as ops:
        step()
    return calls.sdpa, ops.ops


def attention_paths(argv, device, rounds=3, steps=3, paths=tuple(ATTENTION_PATHS)):
    """{variant: (SDPA calls a step, aten ops a step, median step in s)} for the unkeyed step ("plain") and each
    keyed attention path, one model per keyedness, the variants alternating round by round in this process."""
    keyed = OursStep([str(a) for a in argv], device, steps)
    plain = OursStep([str(a) for a in argv], device, steps, keyed=False)
    variants = {"plain": (plain, (None, None)), **{path: (keyed, ATTENTION_PATHS[path]) for path in paths}}
    layer = dropout_module.KeyedDropout
    counts, medians = {}, {name: [] for name in variants}
    try:
        for name, (step, (layer.per_sample_attention, layer.fused_attention)) in variants.items():
            step()  # warm-up
            counts[name] = _counted(step)
        for _ in range(rounds):
            for name, (step, (layer.per_sample_attention, layer.fused_attention)) in variants.items():
                taken = []
                for _ in range(steps):
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    step()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    taken.append(time.perf_counter() - start)
                medians[name].append(statistics.median(taken))
    finally:
        layer.per_sample_attention = layer.fused_attention = None
    return {name: (*counts[name], statistics.median(medians[name])) for name in variants}


def release_step_table(model, device, seq_len, rounds, steps):
    argv = ["--model", model, *RELEASE_STEP, "--seq_len", seq_len, "--num_threads", torch.get_num_threads(),
            "--use_gpu", str(device.type == "cuda").lower()]
    paths = tuple(ATTENTION_PATHS) if device.type == "cpu" else ("per_sample", "fused")
    found = attention_paths(argv, device, rounds, steps, paths)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows = [f"| {name} | {sdpa} | {ops} | {seconds * 1e3:.1f} | {seconds / found['plain'][2]:.2f} |"
            for name, (sdpa, ops, seconds) in found.items()]
    return "\n".join([
        f"# {model} training step (base's layer counts), keyed attention's paths, {device.type}",
        "",
        f"`python lab/bench_attention_dropout.py --release_step {model} --seq_len {seq_len} --rounds {rounds} "
        f"--steps {steps} --device {device.type}`: "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} "
        f"thread(s), 1-minute load average {load:.1f} at the end; 32 windows, horizon 96; median of {rounds} "
        f"interleaved rounds of {steps} steps.",
        "",
        "| variant | SDPA calls a step | aten ops a step | step (ms) | / plain |",
        "|---|---|---|---|---|",
        *rows, ""])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release_step", metavar="MODEL", help="keyed attention's paths in a step of this --model")
    parser.add_argument("--seq_len", type=int, default=512, help="with --release_step")
    parser.add_argument("--device", default="cpu", help="with --release_step")
    parser.add_argument("--tokens", type=int, default=1280)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--d_model", type=int, default=64)
    parser.add_argument("--n_heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--scripts", nargs="*", default=["Timer", "TimerXL"],
                        help="models whose ETTh1 script step is timed keyed against per sample (none: skip)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data_root", default=str(REPO.parent / "shared" / "datasets" / "ETT-small"))
    parser.add_argument("--variant", choices=VARIANTS, help="measure one variant in this process (JSON out)")
    parser.add_argument("--out", default=str(REPO / "lab" / "results" / "bench_attention_dropout_cpu.md"))
    args = parser.parse_args()
    if args.release_step:
        torch.set_num_threads(1)
        table = release_step_table(args.release_step, torch.device(args.device), args.seq_len, args.rounds, args.steps)
        print(table)
        if args.out != parser.get_default("out"):
            Path(args.out).write_text(table)
        return
    shape = (args.tokens, args.batch_size, args.steps, args.d_model, args.n_heads)
    if args.variant:
        print(json.dumps(measure(args.variant, *shape)))
        return
    rows = []
    for variant in VARIANTS:
        command = [sys.executable, __file__, "--variant", variant, "--tokens", str(args.tokens), "--batch_size",
                   str(args.batch_size), "--steps", str(args.steps), "--d_model", str(args.d_model),
                   "--n_heads", str(args.n_heads)]
        # glibc's allocator keeps freed blocks of up to 32 MiB for reuse (its mmap threshold grows with them), so a
        # process's resident memory would hold the warm-up's freed tensors: a fixed threshold unmaps every one
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
        done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
        result = json.loads(done.stdout.splitlines()[-1])
        rows.append(f"| {variant} | {result['peak_mib']:.0f} | {result['step_s']:.2f} |")
        print(rows[-1], flush=True)
    torch.set_num_threads(1)
    script_rows = []
    for model, seconds in script_step_times(args.scripts, args.rounds, 5, args.data_root).items():
        script_rows.append(f"| {model} | {seconds['keyed'] * 1e3:.1f} | {seconds['per_sample'] * 1e3:.1f} | "
                           f"{seconds['plain'] * 1e3:.1f} | {seconds['keyed'] / seconds['plain']:.2f} |")
        print(script_rows[-1], flush=True)
    weights = args.batch_size * args.n_heads * args.tokens**2 * 4 / 2**20
    table = "\n".join([
        f"# Timer-XL training step with attention dropout, {args.tokens} tokens",
        "",
        f"`python lab/bench_attention_dropout.py --tokens {args.tokens} --batch_size {args.batch_size} "
        f"--d_model {args.d_model} --n_heads {args.n_heads} --steps {args.steps}`: "
        f"{platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, 1 thread. One [B, H, S, S] float32 tensor is {weights:.0f} MiB here.",
        "",
        "| variant | step's peak above its start (MiB) | step (s) |",
        "|---|---|---|",
        *rows, "",
        "At each model's ETTh1 script settings (horizon 96, 1 thread), a step with keyed attention as the CPU",
        "runs it (query blocks), per sample (a GPU's path) and plain (unkeyed masks: F.dropout and SDPA's",
        f"dropout_p), alternating in one process, median of {args.rounds} rounds of 5 steps:",
        "",
        "| model | keyed, query blocks (ms) | per sample (ms) | plain (ms) | keyed / plain |",
        "|---|---|---|---|---|",
        *script_rows, ""])
    Path(args.out).write_text(table)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
