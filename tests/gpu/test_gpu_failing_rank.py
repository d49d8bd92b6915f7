"""Nothing hangs on GPUs: a rank that raises mid-training ends the whole nccl job promptly, its own error
printed first, before nccl's watchdog has anything to say."""
import sys
import time

import pytest

from gpu_helpers import JOB_TIMEOUT, injected
from helpers import output_args, run_command
from test_failing_ranks import FAULT  # rank 1 raises at its third step, stamping the time in TSL_FAULT_STAMP

DIST_TIMEOUT = 5
START_UP = 60  # seconds for imports, CUDA contexts, nccl communicators and the data, before the fault fires


@pytest.mark.gpus(2)
def test_a_raising_rank_ends_the_whole_gpu_job_promptly(tmp_path):
    """Rank 1 of `run.py --ddp --nproc_per_node 2 --dist_timeout 5` on 2 GPUs raising at its third training step
    ends the job non-zero within dist_timeout + 10 s of the fault (plus start-up from the launch), with the
    RuntimeError's traceback first and no nccl "Watchdog" timeout."""
    stamp = tmp_path / "fault_at"
    started = time.time()
    proc = run_command([sys.executable, "run.py", "--ddp", "--nproc_per_node", "2", "--dist_timeout", str(DIST_TIMEOUT),
                        "--synthetic_rows", "2000", "--no_plots", *map(str, output_args(tmp_path))],
                       timeout=JOB_TIMEOUT, extra_env=injected(tmp_path / "inject", FAULT, TSL_FAULT_STAMP=stamp))
    ended = time.time()
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert stamp.is_file(), f"the injected fault never fired:\n{proc.stderr[-3000:]}"
    after_fault = ended - float(stamp.read_text())
    assert after_fault < DIST_TIMEOUT + 10, f"{after_fault:.1f}s from the fault to the job's end"
    assert ended - started < DIST_TIMEOUT + 10 + START_UP, f"{ended - started:.1f}s from the launch"
    first_error = proc.stderr.index("RuntimeError: injected fault on rank 1")
    assert "Traceback" in proc.stderr[:first_error], proc.stderr[-3000:]  # the error's own traceback
    assert first_error < proc.stderr.index("worker(s) failed"), proc.stderr[-3000:]
    assert "Watchdog" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
