"""Nothing hung: a rank that raises mid-training ends the whole DDP job promptly, its own error printed
first, and ranks that hold no validation window take part in evaluation with nothing."""
import sys
import time

import numpy as np
import pytest

from helpers import (REPO, assert_one_error_line, make_args, make_experiment, output_args as _outputs, run_command,
                     run_on_ranks)

# Rank 1 raises at its third training step (a stamp of the time in $TSL_FAULT_STAMP if set); every
# worker's destroy_process_group blocks, as NCCL's can while peers wait in a collective.
FAULT = '''
import os, sys, time
if "RANK" in os.environ:  # a worker: NCCL's shutdown, which may wait for peers stuck in a collective
    import torch.distributed
    torch.distributed.destroy_process_group = lambda *args, **kwargs: time.sleep(3600)
if os.environ.get("RANK") == "1":
    sys.path.insert(0, os.environ["TSL_REPO"])
    import exp.forward
    forward = exp.forward.forward
    calls = []
    def faulty(model, batch, args, stage, device):
        calls.append(stage)
        if calls.count("train") == 3:
            if os.environ.get("TSL_FAULT_STAMP"):  # when it fired, for tests that time the job's end
                with open(os.environ["TSL_FAULT_STAMP"], "w") as f:
                    f.write(str(time.time()))
            raise RuntimeError("injected fault on rank 1, third batch")
        return forward(model, batch, args, stage, device)
    exp.forward.forward = faulty  # before exp.exp_forecast imports it
'''


def test_a_raising_rank_ends_the_whole_job_promptly(tmp_path):
    """The raising rank leaves at once, without destroying its process group: under NCCL that shutdown
    can block while the other ranks wait in a collective (emulated: a destroy_process_group that never
    returns), and the job then ended only at the watchdog."""
    (tmp_path / "sitecustomize.py").write_text(FAULT)  # injected from outside the code under test
    started = time.time()
    proc = run_command([sys.executable, "run.py", "--ddp", "--nproc_per_node", "3", "--dist_timeout", "5",
                        *map(str, _outputs(tmp_path))], timeout=120,
                       extra_env={"PYTHONPATH": str(tmp_path), "TSL_REPO": str(REPO)})
    elapsed = time.time() - started
    assert proc.returncode != 0
    assert elapsed < 5 + 10 + 5, f"{elapsed:.1f}s"  # dist_timeout + 10 s, plus process start-up
    first_error = proc.stderr.index("RuntimeError: injected fault on rank 1")
    assert first_error < proc.stderr.index("worker(s) failed")
    assert "Watchdog" not in proc.stderr


def _evaluate_small(rank, world, argv):
    from data_provider.data_factory import data_provider

    args = make_args(*argv, "--ddp")
    exp = make_experiment(args)
    _, vali_loader = data_provider(args, "val")
    windows = exp.evaluate(vali_loader, "val", keep_windows=True).window_errors()  # rank 0: every rank's
    return exp.vali(vali_loader), len(vali_loader.sampler), None if windows is None else windows.numpy()


@pytest.mark.parametrize("rows, shards", [(970, [1, 1, 0]), (1000, [2, 2, 1])])
def test_ranks_without_windows_contribute_nothing(rows, shards):
    # 2 validation windows on 3 ranks, in batches of 1: one rank holds none; 5 windows: shares of 2 and 1, so
    # a mean of the ranks' means (or one that counts the empty rank) would differ from the single-process loss
    # (and the per-window errors of window_errors.csv: every window once, in order, none from the empty rank)
    argv = ["--synthetic_rows", rows, "--eval_batch_size", 1]
    (reference, n, windows), = run_on_ranks(_evaluate_small, 1, argv)
    assert n == sum(shards) == len(windows)
    results = run_on_ranks(_evaluate_small, 3, argv)
    assert [count for _, count, _ in results] == shards
    assert all(loss == pytest.approx(reference, rel=1e-6) for loss, _, _ in results)
    np.testing.assert_allclose(results[0][2], windows, rtol=1e-6)
    assert results[1][2] is None and results[2][2] is None


# Rank 0 made slow where a rank that leaves alone would get it killed before its line is out: building
# the model (rank 1 must wait for the agreement) or printing the line itself (rank 1 must wait for it).
SLOW_RANK_0 = {"build": '''
import os, sys, time
if os.environ.get("RANK") == "0":
    sys.path.insert(0, os.environ["TSL_REPO"])
    import exp.settings
    build_model = exp.settings.build_model
    def slow(args):
        time.sleep(3)
        return build_model(args)
    exp.settings.build_model = slow  # before exp.exp_basic imports it
''', "print": '''
import os, sys, time
if os.environ.get("RANK") == "0":
    class SlowErrors:
        def __init__(self, stream):
            self.stream = stream
        def write(self, text):
            if text.startswith("error:"):
                time.sleep(3)
            return self.stream.write(text)
        def __getattr__(self, name):
            return getattr(self.stream, name)
    sys.stderr = SlowErrors(sys.stderr)
'''}


@pytest.mark.parametrize("slow", sorted(SLOW_RANK_0))
def test_a_refusal_is_printed_however_slow_rank_0_is(tmp_path, slow):
    (tmp_path / "sitecustomize.py").write_text(SLOW_RANK_0[slow])  # injected from outside the code under test
    cmd = [sys.executable, "run.py", "--synthetic_rows", "1500", "--seq_len", "48", "--label_len", "24",
           "--pred_len", "24", "--model", "PatchTST", "--d_model", "30", "--ddp",
           "--nproc_per_node", "2", "--no_plots", "--checkpoints", str(tmp_path / "ck"), "--results_dir",
           str(tmp_path / "res")]
    proc = run_command(cmd, timeout=120, extra_env={"PYTHONPATH": str(tmp_path), "TSL_REPO": str(REPO)})
    assert_one_error_line(proc, "d_model (30) must be divisible by n_heads (8)")
