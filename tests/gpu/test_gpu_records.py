"""What a GPU run records in metrics.json: every rank's peak GPU memory, overall and per epoch, and --tf32."""
import pytest

from gpu_helpers import is_finite_number, metrics_json, model_args, run_gpu
from helpers import assert_ok


def _per_rank_mib(value, ranks):
    return isinstance(value, list) and len(value) == ranks and all(is_finite_number(v) and v > 0 for v in value)


@pytest.mark.gpus(2)
def test_ddp_run_records_every_ranks_peak_gpu_memory(tmp_path):
    """metrics.json of a 2-GPU DDP run holds peak_gpu_mib, one positive MiB figure per rank, and so does every
    epoch of its history; a run without --tf32 records args.tf32 false."""
    assert_ok(run_gpu(tmp_path, *model_args("PatchTST"), "--train_epochs", 2, nproc=2))
    record = metrics_json(tmp_path)
    assert record["world_size"] == 2
    assert _per_rank_mib(record.get("peak_gpu_mib"), 2), record.get("peak_gpu_mib")
    assert [h["epoch"] for h in record["history"]] == [1, 2]
    for entry in record["history"]:
        assert _per_rank_mib(entry.get("peak_gpu_mib"), 2), entry
    assert record["args"]["tf32"] is False


def test_tf32_is_recorded_in_the_run_arguments(tmp_path):
    """A 1-GPU run with --tf32 records args.tf32 true in metrics.json."""
    assert_ok(run_gpu(tmp_path, *model_args("DLinear"), "--train_epochs", 1, "--tf32"))
    record = metrics_json(tmp_path)
    assert record["args"]["tf32"] is True
