"""Peak host memory (RSS) per rank of FSDP2 fine-tuning on the CPU, measured: the experiment's own training steps
(Exp_Forecast.train_step under --fsdp, Adam, gloo) on 1, 2 and 4 processes for a TimerXL of a few hundred
million parameters, each rank's peak resident set (getrusage's ru_maxrss) from its start to the end of the last
step: the interpreter and its libraries, the model as built (whole, before FSDP2 shards it), the shards of the
weights, gradients and Adam's state, one block's gathered weights, the activations.

    python -m benchmarks.fsdp_rss                  # measure and print (about 8 minutes on 2 cores)
    python -m benchmarks.fsdp_rss --write          # also store benchmarks/results/fsdp_rss.{json,csv}
    python -m benchmarks.fsdp_rss --e_layers 2 --d_model 256 --malloc lean   # a small model, one allocator policy

Two allocator policies, each on 1, 2 and 4 processes: glibc's defaults ("default"), under which memory freed
inside a step mostly stays in the heap (the threshold above which glibc maps a block apart, and returns it on
free, rises to the size of the first large blocks freed: the model's own, as FSDP2 shards it), and "lean", glibc's
MALLOC_MMAP_THRESHOLD_=65536, under which every tensor of 64 KiB or more is mapped apart and returned when freed,
so the resident set follows what is alive. run.py's --keep_freed_memory (its default) is the opposite choice,
for speed: it keeps everything freed below 32 MiB.

Evaluation and checkpoints are left out: saving gathers the whole state onto rank 0's host memory (one tensor at a
time on a GPU, but the dictionary whole), which this measures nothing of. The processes run one world size at a
time; a figure taken beside other jobs is still a peak (memory is not shared), but its seconds are not timings."""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "fsdp_rss"
WORLD_SIZES = (1, 2, 4)
BOUND = 0.35  # at 4 processes, at most this share of the 1-process peak


def model_args(e_layers, d_model):
    """run.py's arguments of the measured run: TimerXL, d_ff 4 x d_model, one token of 96 steps per window."""
    return ["--model", "TimerXL", "--d_model", d_model, "--d_ff", 4 * d_model, "--n_heads", 16, "--e_layers", e_layers,
            "--seq_len", 96, "--input_token_len", 96, "--output_token_len", 96, "--pred_len", 96, "--label_len", 0,
            "--synthetic_rows", 1400, "--synthetic_channels", 1, "--global_batch_size", 4, "--dropout", 0.0,
            "--fsdp", "--ddp", "--num_threads", 1, "--no_plots", "--quiet"]


def worker(argv, steps):
    """One rank: the experiment as run.py builds it, `steps` training steps, then every rank's peak RSS (MiB) and
    parameter count printed by rank 0 as one JSON line."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from data_provider.data_factory import data_provider
    from exp.exp_forecast import Exp_Forecast
    from exp.settings import fill_defaults, resolve_args
    from utils import distributed
    from utils.arguments import parse_args

    args = fill_defaults(parse_args([str(a) for a in argv]))
    device = distributed.setup(args.ddp, args.use_gpu, args.gpu, args.dist_timeout, args.num_threads)
    resolve_args(args, distributed.world_size())
    exp = Exp_Forecast(args, device)
    loader = data_provider(args, "train", device)[1]
    optimizer = exp.make_optimizer()
    parameters = sum(p.numel() for p in exp.raw_model.parameters())  # DTensors: their global sizes
    started = time.perf_counter()
    exp.model.train()
    for step, micro_batches in enumerate(loader.steps(0)):
        if step == steps:
            break
        exp.train_step(micro_batches, optimizer)
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    peaks = distributed.gather_objects(peak_mib)
    if distributed.is_main():
        print("RESULT " + json.dumps({"world_size": distributed.world_size(), "parameters": parameters,
                                      "peak_rss_mib": peaks, "steps": steps, "seconds": seconds}), flush=True)
    distributed.cleanup()


MALLOC = {"default": {}, "lean": {"MALLOC_MMAP_THRESHOLD_": "65536"}}


def measure(e_layers, d_model, steps, malloc="default", world_sizes=WORLD_SIZES):
    """{world size: the worker's record}, each world size launched by torchrun in turn under the allocator policy
    `malloc` (a key of MALLOC)."""
    records = {}
    for world in world_sizes:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
                   "-m", "benchmarks.fsdp_rss", "--worker", "--steps", str(steps), "--", *map(str, model_args(e_layers, d_model))]
        proc = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **MALLOC[malloc]})
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"{world} processes failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        records[world] = json.loads(lines[-1][len("RESULT "):])
    return records


def table(records):
    """Rows: world size, parameters, the largest rank's peak RSS (MiB), its share of the 1-process peak."""
    one = max(records[min(records)]["peak_rss_mib"])
    return [{"processes": world, "parameters": r["parameters"], "peak_rss_mib_per_rank": [round(p) for p in r["peak_rss_mib"]],
             "largest_rank_mib": round(max(r["peak_rss_mib"])), "share_of_1_process": round(max(r["peak_rss_mib"]) / one, 3)}
            for world, r in sorted(records.items())]


def markdown(results, verdicts, options):
    """The stored result: a title, what was run, one table of every policy and world size."""
    rows = ["| malloc | processes | parameters | peak RSS per rank (MiB) | largest rank (MiB) | of 1 process |",
            "|---|---|---|---|---|---|"]
    for policy, table_rows in results.items():
        for row in table_rows:
            rows.append(f"| {policy} | {row['processes']} | {row['parameters'] / 1e6:.0f}M | "
                        f"{' '.join(map(str, row['peak_rss_mib_per_rank']))} | {row['largest_rank_mib']} | "
                        f"{row['share_of_1_process']:.3f} |")
    verdict = "; ".join(f"{policy}: {'met' if met else 'not met'}" for policy, met in verdicts.items())
    command = "python -m benchmarks.fsdp_rss --write" + (f" --e_layers {options.e_layers}" if options.e_layers != 40 else "")
    return "\n".join([
        "# Peak host memory per rank, FSDP2 fine-tuning on the CPU", "",
        f"Generated by `{command}`: TimerXL (d_model {options.d_model}, d_ff {4 * options.d_model}, "
        f"{options.e_layers} blocks), {options.steps} training steps of the experiment under `--fsdp` (gloo, global "
        "batch 4, Adam), each rank's ru_maxrss from its start; evaluation and checkpoints left out. malloc default: "
        "glibc's defaults; lean: MALLOC_MMAP_THRESHOLD_=65536 (every tensor of 64 KiB or more handed back when "
        f"freed). Bound at 4 processes: at most {BOUND} of the 1-process peak ({verdict}).", "", *rows, ""])


def store(results, verdicts, options):
    from benchmarks import results_page

    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{NAME}.md"
    path.write_text(markdown(results, verdicts, options))
    results_page.add(path, replace=True)
    results_page.main(["write"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--e_layers", type=int, default=40)
    parser.add_argument("--d_model", type=int, default=1024)
    parser.add_argument("--malloc", choices=("both", *MALLOC), default="both")
    parser.add_argument("--write", action="store_true", help="store the result in benchmarks/results")
    parser.add_argument("run_args", nargs="*")
    options = parser.parse_args(argv)
    if options.worker:
        return worker(options.run_args, options.steps)
    policies = list(MALLOC) if options.malloc == "both" else [options.malloc]
    results, verdicts = {}, {}
    for policy in policies:
        rows = results[policy] = table(measure(options.e_layers, options.d_model, options.steps, policy))
        for row in rows:
            print(f"malloc {policy}, {row['processes']} processes, {row['parameters'] / 1e6:.0f}M parameters: peak RSS "
                  f"per rank {row['peak_rss_mib_per_rank']} MiB, largest {row['largest_rank_mib']} MiB = "
                  f"{row['share_of_1_process']:.3f} of 1 process", flush=True)
        four = next((r for r in rows if r["processes"] == 4), None)
        if four is not None:
            verdicts[policy] = four["share_of_1_process"] <= BOUND
            print(f"malloc {policy}, 4 processes: {four['share_of_1_process']:.3f} of the 1-process peak, bound {BOUND}: "
                  + ("met" if verdicts[policy] else "not met"), flush=True)
    if options.write:
        store(results, verdicts, options)
    return 0 if any(verdicts.values()) or not verdicts else 1


if __name__ == "__main__":
    sys.exit(main())
