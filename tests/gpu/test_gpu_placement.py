"""One GPU per process, or one line saying why not: more processes than a machine's GPUs, or processes shown
the same GPU, stop every process with the fix named, never NCCL's 'Duplicate GPU detected' traceback (what a
1-GPU H100 machine gave the CPU suite's 2-process runs before the check)."""
import sys

import torch

from gpu_helpers import JOB_TIMEOUT
from helpers import assert_one_error_line, output_args, run_command

ARGS = ["--synthetic_rows", "2000", "--train_epochs", "1", "--no_plots"]


def _ddp_run(tmp_path, nproc, extra_env=None):
    return run_command([sys.executable, "run.py", "--ddp", "--nproc_per_node", str(nproc), *ARGS,
                        *map(str, output_args(tmp_path))], timeout=JOB_TIMEOUT, extra_env=extra_env)


def test_more_processes_than_gpus_is_one_line(tmp_path):
    gpus = torch.cuda.device_count()
    proc = _ddp_run(tmp_path, gpus + 1, extra_env={"CUDA_VISIBLE_DEVICES": None})
    assert_one_error_line(proc, f"runs {gpus + 1} processes but shows {gpus} GPU(s)")
    assert not (tmp_path / "results").exists()


def test_processes_shown_the_same_gpu_is_one_line(tmp_path):
    proc = _ddp_run(tmp_path, 2, extra_env={"CUDA_VISIBLE_DEVICES": "0"})
    assert_one_error_line(proc, "two processes of this job share one GPU")
    assert not (tmp_path / "results").exists()
