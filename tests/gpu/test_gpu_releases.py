"""Every release (tests/test_foundation.py's RELEASES, its tests' folder) on 2 GPUs under NCCL, as users run it:
zero-shot on 2 processes as on 1 at the same --eval_batch_size: every window's errors (window_errors.csv) bit for
bit, since each process evaluates whole batches dealt out in order, so every batch holds the windows it holds on
one process (the same shapes, so the same kernels on identical GPUs; docs/foundation.md#how-they-run-here), and
the metrics to float64's last digits (their sums group by process); and a bf16 fine-tuning step on 2 processes
with finite losses. scripts/gpu_check.sh runs this file first where 2 GPUs are present."""
import math

import numpy as np
import pytest
import torch

from gpu_helpers import run_gpu, window_errors
from helpers import assert_ok, records, write_etth1_shaped
from test_foundation import RELEASES, SCORES, TUNE, needs, released_folder, run_args

pytestmark = pytest.mark.gpus(2)
EVAL_BATCH = 5  # 20 test windows: 4 batches on 1 process, 2 + 2 on 2 (a short last batch on neither)


@pytest.fixture(scope="module")
def etth1(tmp_path_factory):
    return write_etth1_shaped(tmp_path_factory.mktemp("etth1"))


@pytest.mark.parametrize("name", list(RELEASES))
def test_a_release_scores_alike_on_1_and_2_gpus_and_fine_tunes_under_bf16(name, etth1, tmp_path):
    row = needs(RELEASES[name])
    folder = released_folder(row, tmp_path / "release", **({"edit_config": row.tune_folder} if row.tune_folder
                                                             else {}))
    argv = [*run_args(row, etth1, folder), "--eval_batch_size", EVAL_BATCH]
    zero_shot = [*argv, "--is_training", 0]
    assert_ok(run_gpu(tmp_path / "one", *zero_shot))
    assert_ok(run_gpu(tmp_path / "two", *zero_shot, "--ddp", nproc=2))
    one, two = records(tmp_path / "one")[-1], records(tmp_path / "two")[-1]
    assert two["world_size"] == 2 and one["world_size"] == 1
    alone, shared = (window_errors(tmp_path / run, record["setting"]) for run, record in (("one", one), ("two", two)))
    assert alone.shape == shared.shape and np.array_equal(alone, shared), f"{name}: window errors differ"
    for key in SCORES:
        assert two.get(key) == pytest.approx(one.get(key), rel=1e-12), f"{name} zero-shot {key}"
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16 (compute capability < 8.0): the fine-tuning step needs one")
    tuned = [*argv, *TUNE, *row.tune, "--train_steps", 1, "--use_amp", "--amp_dtype", "bf16", "--ddp"]
    assert_ok(run_gpu(tmp_path / "bf16", *tuned, nproc=2))
    record = records(tmp_path / "bf16")[-1]
    assert record["args"]["amp_dtype"] == "bf16" and record["stopped_step"] == 1
    for entry in record["history"]:
        assert all(math.isfinite(entry[key]) for key in ("train_loss", "vali_loss")), entry
    assert math.isfinite(record["mse"]), record["mse"]
