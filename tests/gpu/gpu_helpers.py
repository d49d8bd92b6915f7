"""What the GPU tier's tests share: small model configurations, real (fresh-interpreter) runs on GPUs, and
reading what a run wrote (metrics.json, window_errors.csv, checkpoints)."""
import json
import math
import os
import sys

import numpy as np
import pytest
import torch

from helpers import REPO, SMALL_TIMERXL, output_args, run_cli, run_command

JOB_TIMEOUT = 600  # seconds per job: GPU start-up (CUDA, nccl) and a cold torch.compile are slow
ROWS = 2000
# the built-in data, a direct model's window (96 in, 24 out: 120 rows), small enough for seconds per epoch
DATA = ["--data", "synthetic", "--seq_len", 96, "--label_len", 48, "--pred_len", 24]
SMALL = ["--d_model", 32, "--d_ff", 64, "--n_heads", 2, "--e_layers", 1]
_MODEL_ARGS = {
    "DLinear": ["--model", "DLinear"],
    "PatchTST": ["--model", "PatchTST", *SMALL],  # BatchNorm (running statistics) and dropout
    "TimerXL": [*SMALL_TIMERXL, "--input_token_len", 24, "--output_token_len", 24],  # a token model, dropout
    "TimesNet": ["--model", "TimesNet", *SMALL, "--top_k", 2, "--num_kernels", 2],  # FFT, batch-dependent periods
}
MODEL_NAMES = tuple(_MODEL_ARGS)
METRIC_KEYS = ("mse", "mae", "rmse", "mape", "mspe", "vali_loss")


def model_args(name, rows=ROWS):
    """run.py arguments of a small `name` on `rows` rows of the built-in data."""
    return [*_MODEL_ARGS[name], *DATA, "--synthetic_rows", rows]


def run_gpu(folder, *args, nproc=None):
    """`python run.py ...` (nproc None: one process, GPU 0) or `torchrun --nproc_per_node nproc run.py ...`
    (one GPU per process, nccl), real interpreters, outputs under `folder`."""
    return run_cli(folder, *args, nproc=nproc, fresh=True, timeout=JOB_TIMEOUT)


def launch(folder, *args, nproc=2, max_restarts=0, extra_env=None):
    """`python -m utils.launch --standalone --nproc_per_node N --max_restarts R run.py --ddp ...` (torchrun
    with the same arguments), outputs under `folder`, no pictures."""
    cmd = [sys.executable, "-m", "utils.launch", "--standalone", "--nproc_per_node", str(nproc),
           "--max_restarts", str(max_restarts), "run.py", "--ddp", *map(str, args), "--no_plots",
           *map(str, output_args(folder))]
    return run_command(cmd, timeout=JOB_TIMEOUT, extra_env=extra_env)


def injected(folder, source, **variables):
    """Environment that makes every interpreter started with it run `source` as its sitecustomize.py (written
    to `folder`): a fault injected from outside the code under test. `variables` are added to it, with
    TSL_REPO (the repository, for the injected code's imports)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(source)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "TSL_REPO": str(REPO), **{k: str(v) for k, v in variables.items()}}


def metrics_json(folder):
    """The metrics.json of the one setting a test ran under `folder` (its latest run's record)."""
    found = sorted((folder / "results").glob("*/metrics.json"))
    assert len(found) == 1, f"expected one metrics.json under {folder / 'results'}, found {found}"
    return json.loads(found[0].read_text())


def window_errors(folder, setting):
    """window_errors.csv (exp.outputs.save_window_errors): [windows, 3] of (window, mse, mae)."""
    return np.loadtxt(folder / "results" / setting / "window_errors.csv", delimiter=",", skiprows=1, ndmin=2)


def checkpoint_state(folder, setting, name="checkpoint.pth"):
    return torch.load(folder / "checkpoints" / setting / name, map_location="cpu", weights_only=True)


def epochs(record):
    """(epoch, train, vali, test loss, learning rate) of every epoch in a record's history."""
    return [(h["epoch"], h["train_loss"], h["vali_loss"], h["test_loss"], h["lr"]) for h in record["history"]]


def assert_same_run(result, reference, exact=True):
    """The same epochs with the same losses and rates, and the same final metrics: bit for bit when `exact`,
    else within rel 1e-5."""
    got, want = epochs(result), epochs(reference)
    assert [e[0] for e in got] == [e[0] for e in want]
    for g, w in zip(got, want):
        assert (g == w) if exact else (g == pytest.approx(w, rel=1e-5)), f"epoch {g[0]}: {g} != {w}"
    for key in METRIC_KEYS:
        if exact:
            assert result[key] == reference[key], f"{key}: {result[key]!r} != {reference[key]!r}"
        else:
            assert result[key] == pytest.approx(reference[key], rel=1e-5), key


def is_finite_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def snapshot(module):
    """Every parameter of `module`, copied."""
    return {name: p.detach().clone() for name, p in module.named_parameters()}
