"""Where one training epoch's time goes: data, forward, backward, optimizer, evaluation.

    python lab/profile_step.py                              # DLinear and TimerXL on ETTh1, 1 process
    torchrun --nproc_per_node 2 lab/profile_step.py --ddp   # the same under DDP (backward includes all-reduce)

Each phase is timed with perf_counter around synchronous CPU work (CUDA is synchronised
before each reading), over one epoch after a warm-up epoch.
"""
import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_train import DATA_ARGS, MODEL_ARGS  # noqa: E402
from data_provider.data_factory import data_provider  # noqa: E402
from exp.exp_forecast import Exp_Forecast  # noqa: E402
from exp.forward import forward  # noqa: E402
from exp.settings import resolve_args  # noqa: E402
from utils.arguments import parse_args  # noqa: E402
from utils import distributed  # noqa: E402
from utils.metrics import batch_loss  # noqa: E402


def profile(model, data, ddp):
    args = parse_args(DATA_ARGS[data] + MODEL_ARGS[model] + (["--ddp"] if ddp else []))
    resolve_args(args, distributed.env_world_size())
    exp = Exp_Forecast(args, distributed.setup(args.ddp, args.use_gpu, args.gpu, args.dist_timeout, args.num_threads))
    _, loader = data_provider(args, "train", exp.device)
    _, vali_loader = data_provider(args, "val", exp.device)
    _, test_loader = data_provider(args, "test", exp.device)
    optimizer = exp.make_optimizer()
    sync = torch.cuda.synchronize if exp.device.type == "cuda" else (lambda: None)
    for epoch in range(2):  # the first epoch warms up, the second is measured
        seconds = defaultdict(float)
        loader.set_epoch(epoch)
        batches = iter(loader)
        while True:
            mark = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            seconds["data"] += time.perf_counter() - mark
            mark = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            with exp.autocast():
                pred, true = forward(exp.model, batch, args, "train", exp.device)
                loss = batch_loss(pred.float(), true, args.loss)
            sync()
            seconds["forward"] += time.perf_counter() - mark
            mark = time.perf_counter()
            loss.backward()
            sync()
            seconds["backward (+ DDP all-reduce)" if distributed.is_dist() else "backward"] += time.perf_counter() - mark
            mark = time.perf_counter()
            optimizer.step()
            sync()
            seconds["optimizer"] += time.perf_counter() - mark
    mark = time.perf_counter()
    exp.evaluate(vali_loader, "val")
    seconds["validation"] = time.perf_counter() - mark
    mark = time.perf_counter()
    exp.evaluate(test_loader, "test")
    seconds["test"] = time.perf_counter() - mark
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="DLinear,TimerXL")
    parser.add_argument("--data", default="ETTh1")
    parser.add_argument("--ddp", action="store_true")
    opts = parser.parse_args()
    for model in opts.models.split(","):
        seconds = profile(model, opts.data, opts.ddp)
        train = sum(v for k, v in seconds.items() if k not in ("validation", "test"))
        if distributed.is_main():
            print(f"\n{model} on {opts.data}, {distributed.world_size()} process(es): training epoch {train:.3f} s")
            for phase, value in seconds.items():
                print(f"  {phase:<28} {value:7.3f} s  {value / train:6.1%} of the training epoch")
    distributed.cleanup()


if __name__ == "__main__":
    main()
