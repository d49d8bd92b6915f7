"""Training-speed benchmark: the conventional pipeline vs ours vs the compute floor, side by side.

    python benchmarks/bench_train.py                       # DLinear + TimerXL, ETTh1 + synthetic
    python benchmarks/bench_train.py --models DLinear --data ETTh1 --epochs 6

Every configuration runs in its own process (clean peak memory, no warm caches shared):
  (a) conventional: a per-window Dataset returning numpy slices, DataLoader collation
      (num_workers 0 and 2), TSLib's step (casts, decoder input, output and target slices,
      loss.item() every batch) and, for DLinear, TSLib's formulation (replicate padding +
      AvgPool1d decomposition, two linear heads, the output sliced to pred_len);
  (b) ours: run.py's data path and Exp_Forecast's training epoch, fp32 and --use_amp;
  (c) floor: our model's forward, backward and optimizer step on batches already in memory;
  and (a)/(b) again as 2-process DDP under torchrun.
Seconds per epoch are medians over the epochs after the first (warm-up). Writes
benchmarks/results/bench_train_<device>_<models>.md (an existing one only with --overwrite, checked
before anything runs) and prints the same table.
"""
import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: make the repository's packages importable
from utils.files import atomic_write  # noqa: E402

ETTH1 = REPO.parent / "shared" / "datasets" / "ETT-small"
DATA_ARGS = {
    "ETTh1": ["--data", "ETTh1", "--root_path", str(ETTH1), "--data_path", "ETTh1.csv"],
    "synthetic": ["--data", "synthetic", "--synthetic_rows", "17420"],  # ETTh1's length
}
MODEL_ARGS = {
    "DLinear": ["--model", "DLinear"],
    "TimerXL": ["--model", "TimerXL", "--d_model", "256", "--d_ff", "512", "--n_heads", "4", "--e_layers", "1",
                "--input_token_len", "24", "--output_token_len", "24"],
    # PatchTST_ETTh1.sh at horizon 96; compute-bound, so time it with --max_batches on a CPU
    "PatchTST": ["--model", "PatchTST", "--e_layers", "1", "--n_heads", "2", "--d_model", "512", "--d_ff", "2048",
                 "--patch_len", "16", "--stride", "8"],
}


# ------------------------------------------------------------------ the conventional pipeline
class PerWindowDataset:
    """TSLib's Dataset_ETT_hour.__getitem__: numpy slices of one window, collated by the loader."""

    def __init__(self, values, marks, x_len, y_offset, y_len):
        self.values, self.marks = values, marks
        self.x_len, self.y_offset, self.y_len = x_len, y_offset, y_len

    def __len__(self):
        return len(self.values) - max(self.x_len, self.y_offset + self.y_len) + 1

    def __getitem__(self, i):
        x_end, y_start = i + self.x_len, i + self.y_offset
        y_end = y_start + self.y_len
        return self.values[i:x_end], self.values[y_start:y_end], self.marks[i:x_end], self.marks[y_start:y_end]


def tslib_dlinear(configs):
    """DLinear as TSLib writes it: pad by repetition, AvgPool1d, two nn.Linear heads."""
    import torch
    from torch import nn

    class MovingAvg(nn.Module):
        def __init__(self, kernel_size):
            super().__init__()
            self.kernel_size = kernel_size
            self.avg = nn.AvgPool1d(kernel_size=kernel_size, stride=1, padding=0)

        def forward(self, x):
            front = x[:, 0:1, :].repeat(1, (self.kernel_size - 1) // 2, 1)
            end = x[:, -1:, :].repeat(1, (self.kernel_size - 1) // 2, 1)
            x = torch.cat([front, x, end], dim=1)
            return self.avg(x.permute(0, 2, 1)).permute(0, 2, 1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.moving_avg = MovingAvg(configs.moving_avg)
            self.Linear_Seasonal = nn.Linear(configs.seq_len, configs.pred_len)
            self.Linear_Trend = nn.Linear(configs.seq_len, configs.pred_len)

        def forward(self, x, *_):
            trend = self.moving_avg(x)
            seasonal = x - trend
            out = self.Linear_Seasonal(seasonal.permute(0, 2, 1)) + self.Linear_Trend(trend.permute(0, 2, 1))
            return out.permute(0, 2, 1)[:, -configs.pred_len:, :]  # TSLib's Model.forward slices its output

    return Model()


def tslib_forward(model, batch, args, device):
    """The per-batch lines of TSLib's Exp_Long_Term_Forecast.train: casts and moves, the decoder
    input, the forward, and the slices of output and target (f_dim), whatever the model reads."""
    import torch

    x, y, x_mark, y_mark = (t.float().to(device) for t in batch)
    dec_inp = torch.zeros_like(y[:, -args.pred_len:, :]).float()
    dec_inp = torch.cat([y[:, :args.label_len, :], dec_inp], dim=1).float().to(device)
    outputs = model(x, x_mark, dec_inp, y_mark)
    f_dim = -1 if args.features == "MS" else 0
    return outputs[:, -args.pred_len:, f_dim:], y[:, -args.pred_len:, f_dim:].to(device)


# ------------------------------------------------------------------ one measurement (own process)
def _peak_memory_mb(device):
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _FirstBatches:
    """The first `limit` optimizer steps of a TrainLoader's epoch (one micro-batch each: the benchmark does
    not accumulate), for timing compute-bound models on a slow device; the loader's other attributes as they are."""

    def __init__(self, loader, limit):
        self.loader, self.limit = loader, limit

    def __getattr__(self, name):  # sampler, dataset, set_epoch
        return getattr(self.loader, name)

    @property
    def steps_per_epoch(self):
        return min(self.loader.steps_per_epoch, self.limit)

    def steps(self, start=0):
        return itertools.islice(self.loader.steps(start), self.limit)

    def __iter__(self):
        return (batch for step in self.steps() for batch in step)

    def __len__(self):
        return min(len(self.loader), self.limit)


def measure(kind, argv, epochs, max_batches=0):
    """Seconds per training epoch (list), validation+test seconds, windows, peak memory.

    With max_batches, each epoch stops after that many batches and its time is scaled to the
    full epoch (evaluation is then not timed)."""
    import torch

    from data_provider.data_factory import data_provider
    from exp.exp_forecast import Exp_Forecast
    from exp.forward import forward, on_device
    from exp.settings import resolve_args
    from utils.arguments import parse_args
    from utils import distributed
    from utils.checkpoint import TrainingState

    args = parse_args(argv + (["--ddp"] if distributed.launched_by_torchrun() else []))
    resolve_args(args, distributed.env_world_size())
    exp = Exp_Forecast(args, distributed.setup(args.ddp, args.use_gpu, args.gpu, args.dist_timeout, args.num_threads))
    device = exp.device
    dataset, loader = data_provider(args, "train")
    _, vali_loader = data_provider(args, "val")
    _, test_loader = data_provider(args, "test")
    optimizer = exp.make_optimizer()
    times = []
    full_batches = len(loader)
    if max_batches:
        loader = _FirstBatches(loader, max_batches)
    scale = full_batches / len(loader)

    if kind.startswith("conventional"):
        from torch.utils.data import DataLoader, DistributedSampler

        workers = int(kind.rsplit("nw", 1)[1])
        window = dataset.window
        # float64 arrays, as TSLib's datasets hold them after StandardScaler.transform
        per_window = PerWindowDataset(dataset.data.double().numpy(), dataset.marks.double().numpy(), window.x_len,
                                      window.y_offset, window.y_len)
        sampler = DistributedSampler(per_window, seed=args.seed) if distributed.is_dist() else None
        conv_loader = DataLoader(per_window, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler,
                                 num_workers=workers, persistent_workers=workers > 0)
        model = exp.model
        if args.model == "DLinear":
            model = tslib_dlinear(args).to(device)
            if distributed.is_dist():
                model = torch.nn.parallel.DistributedDataParallel(model)
            optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
        for epoch in range(epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            started = time.perf_counter()
            losses = []
            for batch in itertools.islice(conv_loader, len(loader)):  # TSLib's loop, casts and all
                optimizer.zero_grad()
                if args.autoregressive:  # OpenLTM's token loop is ours: only the data path differs
                    pred, true = forward(model, tuple(t.float().to(device) for t in batch), args, "train", device)
                else:
                    pred, true = tslib_forward(model, batch, args, device)
                loss = torch.nn.functional.mse_loss(pred, true)
                losses.append(loss.item())
                loss.backward()
                optimizer.step()
            _sync(device)
            times.append((time.perf_counter() - started) * scale)
    elif kind == "floor":
        batches = [on_device(batch, device) for batch in loader]
        model = exp.model
        for _ in range(epochs):
            started = time.perf_counter()
            for batch in batches:
                optimizer.zero_grad(set_to_none=True)
                with exp.autocast():
                    pred, true = forward(model, batch, args, "train", device)
                    loss = torch.nn.functional.mse_loss(pred.float(), true)
                exp.backward(loss)
                exp.optimizer_step(optimizer)
            _sync(device)
            times.append((time.perf_counter() - started) * scale)
    else:  # ours
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            started = time.perf_counter()
            exp.train_epoch(loader, TrainingState(exp.raw_model, optimizer, stopper=None))  # no schedule, no evaluation
            _sync(device)
            times.append((time.perf_counter() - started) * scale)

    started = time.perf_counter()
    if max_batches:
        pass  # a partial epoch: evaluation is not timed
    elif kind.startswith("conventional"):  # TSLib's vali/test: per-window loaders, a .item() per batch
        for split_loader in (vali_loader, test_loader):
            split = split_loader.dataset
            conv = DataLoader(PerWindowDataset(split.data.double().numpy(), split.marks.double().numpy(),
                                               window.x_len, window.y_offset, window.y_len),
                              batch_size=args.batch_size, shuffle=False, num_workers=workers)
            model.eval()
            with torch.no_grad():
                for batch in conv:
                    if args.autoregressive:
                        pred, true = forward(model, tuple(t.float().to(device) for t in batch), args, "val", device)
                    else:
                        pred, true = tslib_forward(model, batch, args, device)
                    torch.nn.functional.mse_loss(pred, true).item()
            model.train()
    else:
        exp.evaluate(vali_loader, "val")
        exp.evaluate(test_loader, "test")
    _sync(device)
    eval_seconds = float("nan") if max_batches else time.perf_counter() - started
    return {"epoch_seconds": times, "eval_seconds": eval_seconds, "train_windows": len(dataset),
            "peak_mb": _peak_memory_mb(device), "device": str(device),
            "world_size": distributed.world_size()}


# ------------------------------------------------------------------ orchestration
def run_one(kind, argv, epochs, nproc, max_batches=0):
    payload = json.dumps({"kind": kind, "argv": argv, "epochs": epochs, "max_batches": max_batches})
    cmd = [sys.executable]
    if nproc > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd += [str(Path(__file__).resolve()), "--one", payload]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} {argv} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[0][len("RESULT "):])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="DLinear,TimerXL")
    parser.add_argument("--data", default="ETTh1,synthetic")
    parser.add_argument("--epochs", type=int, default=4, help="timed epochs; the first is a warm-up")
    parser.add_argument("--kinds", default="conventional-nw0,conventional-nw2,ours-fp32,ours-amp,floor")
    parser.add_argument("--ddp_kinds", default="conventional-nw0,ours-fp32", help="also run these on 2 processes")
    parser.add_argument("--rounds", type=int, default=2,
                        help="run the whole plan this many times, interleaved, and pool the epochs: "
                             "slow spells of a shared machine then hit every configuration alike")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"),
                        help="folder for bench_train_<device>_<models>.md")
    parser.add_argument("--overwrite", action="store_true", help="replace that file when it exists (it is committed)")
    parser.add_argument("--max_batches", type=int, default=0,
                        help="time only this many batches per epoch and scale to the full epoch (slow models)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)

    if opts.one:  # a worker: measure one configuration and print it
        job = json.loads(opts.one)
        result = measure(job["kind"], job["argv"], job["epochs"], job.get("max_batches", 0))
        if int(os.environ.get("RANK", 0)) == 0:
            print("RESULT " + json.dumps(result), flush=True)
        from utils import distributed

        distributed.cleanup()
        return

    out = output_path(opts.out, opts.models)
    if out.exists() and not opts.overwrite:  # before the benchmark runs, not after
        raise SystemExit(f"error: {out} exists; add --overwrite to replace it, or --out another folder")
    rows = []
    for data in opts.data.split(","):
        if data == "ETTh1" and not (ETTH1 / "ETTh1.csv").exists():
            print("skipping ETTh1: ../shared/datasets/ETT-small/ETTh1.csv not found")
            continue
        for model in opts.models.split(","):
            base = DATA_ARGS[data] + MODEL_ARGS[model]
            plan = [(k, 1) for k in opts.kinds.split(",") if k] + [(k, 2) for k in opts.ddp_kinds.split(",") if k]
            results = {}
            for round_ in range(opts.rounds):
                for kind, nproc in plan:
                    argv = base + (["--use_amp"] if kind == "ours-amp" else [])
                    result = run_one(kind, argv, opts.epochs, nproc, opts.max_batches)
                    timed = result["epoch_seconds"][1:] or result["epoch_seconds"]
                    pooled = results.setdefault((kind, nproc), dict(result, timed=[], evals=[]))
                    pooled["timed"] += timed
                    pooled["evals"].append(result["eval_seconds"])
                    pooled["median"] = statistics.median(pooled["timed"])
                    pooled["eval_seconds"] = statistics.median(pooled["evals"])
                    pooled["peak_mb"] = max(pooled["peak_mb"], result["peak_mb"])
                    print(f"{data} {model} {kind} x{nproc} round {round_ + 1}: {statistics.median(timed):.3f} s/epoch "
                          f"(epochs {', '.join(f'{t:.3f}' for t in result['epoch_seconds'])})", flush=True)
            rows.append((data, model, results))
    device = next(iter(rows[0][2].values()))["device"] if rows else "cpu"
    table = render(rows, opts.epochs, opts.rounds, device)
    if opts.max_batches:
        table = table.replace("; eval = ", f"; only the first {opts.max_batches} batches of each epoch are timed and "
                              "scaled to the full epoch (eval not timed); eval = ", 1)
    print(table)
    atomic_write(out, lambda f: f.write(table), binary=False)
    print(f"wrote {out}")


def output_path(folder, models):
    """bench_train_<cuda|cpu>_<models>.md: the device every configuration trains on (a GPU when one is seen)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return Path(folder, f"bench_train_{device}_{models.replace(',', '_')}.md")


def render(rows, epochs, rounds, device):
    import torch

    lines = [f"# Training speed: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"torch {torch.__version__}, device {device}",
             "",
             f"ETTh1-sized series (17420 rows), 96 -> 96, batch 32 per process; seconds per training epoch are "
             f"medians of {epochs - 1} epochs after a warm-up x {rounds} interleaved rounds; eval = one validation + "
             f"one test pass (median over rounds).",
             ""]
    for data, model, results in rows:
        reference = results.get(("conventional-nw0", 1))
        ours = results.get(("ours-fp32", 1))
        floor = results.get(("floor", 1))
        lines += [f"## {model} on {data}", "",
                  "| pipeline | processes | s / epoch | samples / s | eval s | peak MB | (a) nw0 / this | this / (c) |",
                  "|---|---|---|---|---|---|---|---|"]
        for (kind, nproc), r in results.items():
            speedup = f"{reference['median'] / r['median']:.2f}x" if reference else ""
            over_floor = f"{r['median'] / floor['median']:.2f}x" if floor else ""
            lines.append(f"| {LABELS[kind]} | {nproc} | {r['median']:.3f} | {r['train_windows'] / r['median']:.0f} | "
                         f"{r['eval_seconds']:.3f} | {r['peak_mb']:.0f} | {speedup} | {over_floor} |")
        if reference and ours and floor:
            lines += ["", f"(a)/(b) = {reference['median'] / ours['median']:.2f}x, (b)/(c) = "
                      f"{ours['median'] / floor['median']:.2f}x, eval / train epoch (b) = "
                      f"{ours['eval_seconds'] / ours['median']:.0%}"]
        lines.append("")
    return "\n".join(lines)


LABELS = {
    "conventional-nw0": "(a) per-window Dataset + collate, num_workers 0",
    "conventional-nw2": "(a) per-window Dataset + collate, num_workers 2",
    "ours-fp32": "(b) ours, fp32",
    "ours-amp": "(b) ours, --use_amp (bf16)",
    "floor": "(c) floor: model step on in-memory batches",
}

if __name__ == "__main__":
    main()
