"""Shared test helpers: run the CLI as a user would, and run functions on several gloo ranks."""
import json
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
ETTH1 = REPO.parent / "shared" / "datasets" / "ETT-small" / "ETTh1.csv"
EXCHANGE = REPO.parent / "shared" / "datasets" / "exchange_rate" / "exchange_rate.txt.gz"
# A TimerXL small enough for CPU tests (dropout 0.1 stays on, so RNG state matters).
SMALL_TIMERXL = ["--model", "TimerXL", "--d_model", 32, "--d_ff", 64, "--n_heads", 2, "--e_layers", 1]
ETTH1_ARGS = ["--data", "ETTh1", "--root_path", str(ETTH1.parent), "--data_path", ETTH1.name]


def write_etth1_shaped(folder):
    """An ETTh1-shaped file (20 months of hours, the ETT columns) at folder/ETTh1.csv: the real one may
    be absent, and ETTh1's fixed split borders need exactly this length."""
    from data_provider.synthetic import make_synthetic

    frame = make_synthetic(rows=14400, channels=7, seed=1)
    frame.columns = ["date", "HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / "ETTh1.csv", index=False)
    return folder


def subprocess_env():
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    env.pop("LOCAL_RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def output_args(folder):
    """--checkpoints and --results_dir inside `folder`, where run_cli puts them and records() reads."""
    return ["--checkpoints", folder / "checkpoints", "--results_dir", folder / "results"]


def run_cli(tmp_path, *args, nproc=None, timeout=240, outputs=True, plots=False):
    """`python run.py ...`, or under torchrun with `nproc` workers. Returns CompletedProcess.
    Pictures are skipped (--no_plots) unless `plots`: drawing them costs about a second."""
    cmd = [sys.executable]
    if nproc is not None:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd += ["run.py", *map(str, args)] + ([] if plots else ["--no_plots"])
    if outputs:
        cmd += map(str, output_args(tmp_path))
    return subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=timeout)


def run_command(cmd, timeout=240, extra_env=None):
    env = subprocess_env()
    env.update(extra_env or {})
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def records(tmp_path):
    """Every record appended to results.jsonl, oldest first."""
    path = tmp_path / "results" / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank, world_size, port, fn, args, queue):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        queue.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()
        # skip interpreter teardown, where gloo threads can abort a finished rank (see
        # utils.distributed.exit_process); flush the queue's feeder thread first
        queue.close()
        queue.join_thread()
        os._exit(0)


def run_on_ranks(fn, world_size, *args, timeout=120):
    """Run fn(rank, world_size, *args) on `world_size` gloo processes; list of results by rank.

    fn must be a module-level function (it is pickled by reference)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    ctx_procs = mp.start_processes(_rank_entry, args=(world_size, free_port(), fn, args, queue),
                                   nprocs=world_size, join=False, start_method="spawn")
    results = {}
    for _ in range(world_size):
        rank, ok, value = queue.get(timeout=timeout)
        if not ok:
            for process in ctx_procs.processes:
                process.kill()
            raise AssertionError(f"rank {rank} failed:\n{value}")
        results[rank] = value
    while not ctx_procs.join(timeout=timeout):
        pass
    return [results[r] for r in range(world_size)]


def make_args(*argv):
    """Parsed run.py arguments with the defaults other arguments decide (exp.settings.fill_defaults),
    as the data functions read them; make_experiment resolves the rest."""
    from exp.settings import fill_defaults
    from utils.arguments import parse_args

    return fill_defaults(parse_args(list(map(str, argv))))


def make_experiment(args):
    """Exp_Forecast as run.py builds it: `args` resolved in place for this process group's size,
    on the device utils.distributed.setup gives (a test's own process group is already there)."""
    from exp.exp_forecast import Exp_Forecast
    from exp.settings import resolve_args
    from utils import distributed

    resolve_args(args, distributed.world_size())
    return Exp_Forecast(args, distributed.setup(args.ddp, args.use_gpu, args.gpu, args.dist_timeout, args.num_threads))
