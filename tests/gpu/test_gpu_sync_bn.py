"""--sync_bn on 2 GPUs over nccl: BatchNorm's running statistics are those of the global batch, as one GPU
with twice the batch computes them."""
import pytest
import torch

from gpu_helpers import checkpoint_state, metrics_json, model_args, run_gpu
from helpers import assert_ok, run_on_ranks

PER_RANK_BATCH = 8
WORLD = 2
SPAN = 96 + 24  # rows of one direct-model window: --seq_len 96, then --pred_len 24 (gpu_helpers.DATA)


def _rows_with_whole_global_batches(start=2000):
    """(rows, training windows) of the built-in data nearest below `start` rows whose training windows fill
    whole global batches of WORLD x PER_RANK_BATCH: DistributedSampler then pads nothing, and every global
    batch of the 2 ranks is the very batch the 1-process run takes (rank r gets indices[r::2] of the same
    permutation)."""
    from data_provider.splits import split_ends

    for rows in range(start, start - 1000, -1):
        windows = split_ends("synthetic", rows)[0] - SPAN + 1  # the training split starts at row 0
        if windows % (WORLD * PER_RANK_BATCH) == 0:
            return rows, windows
    raise AssertionError("no row count fits")


def _batchnorm_statistics(state):
    return {k: v for k, v in state.items() if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}


@pytest.mark.gpus(2)
def test_sync_bn_statistics_on_two_gpus_equal_one_gpu_with_twice_the_batch(tmp_path):
    """PatchTST trained one epoch (dropout 0, learning rate 0) with --sync_bn on 2 GPUs x batch 8 saves the
    BatchNorm running statistics (rtol 1e-4) that 1 GPU x batch 16 saves, and without --sync_bn it does not."""
    rows, windows = _rows_with_whole_global_batches()
    argv = [*model_args("PatchTST", rows=rows), "--dropout", 0, "--learning_rate", 0, "--train_epochs", 1]
    runs = {"1 GPU x 16": (tmp_path / "one", [*argv, "--batch_size", WORLD * PER_RANK_BATCH], None),
            "2 GPUs x 8, --sync_bn": (tmp_path / "sync", [*argv, "--batch_size", PER_RANK_BATCH, "--sync_bn"], WORLD),
            "2 GPUs x 8, local statistics": (tmp_path / "local", [*argv, "--batch_size", PER_RANK_BATCH], WORLD)}
    stats = {}
    for name, (folder, run_argv, nproc) in runs.items():
        assert_ok(run_gpu(folder, *run_argv, nproc=nproc))
        record = metrics_json(folder)
        assert record["train_windows"] == windows, name  # whole global batches, as computed above
        assert record["world_size"] == (nproc or 1), name
        stats[name] = _batchnorm_statistics(checkpoint_state(folder, record["setting"]))
    assert metrics_json(tmp_path / "sync")["args"]["sync_bn"] is True

    reference, synced, local = stats["1 GPU x 16"], stats["2 GPUs x 8, --sync_bn"], stats["2 GPUs x 8, local statistics"]
    assert any(k.endswith("running_mean") for k in reference), f"PatchTST has no BatchNorm? {sorted(reference)}"
    assert sorted(synced) == sorted(reference)
    for key, value in reference.items():
        if key.endswith("num_batches_tracked"):  # the same number of (global) batches
            assert synced[key].item() == value.item() == windows // (WORLD * PER_RANK_BATCH), key
            continue
        initial = torch.zeros_like(value) if key.endswith("running_mean") else torch.ones_like(value)
        assert not torch.allclose(value, initial), f"{key} never moved from its initial value"
        torch.testing.assert_close(synced[key], value, rtol=1e-4, atol=1e-6, msg=lambda m, key=key: f"{key}: {m}")
    # the control: rank 0's own half-batch statistics are not the global batch's, so the check above can fail
    assert any(not torch.allclose(local[k], v, rtol=1e-4, atol=1e-6) for k, v in reference.items()
               if not k.endswith("num_batches_tracked"))


def _batchnorm_statistics_of_a_half(rank, world, full_batch):
    from utils.ddp import wrap_ddp

    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6)).to(device)
    raw, ddp = wrap_ddp(module, device, sync_bn=True)  # the experiment's own wrapping
    assert isinstance(raw[1], torch.nn.SyncBatchNorm)
    ddp.train()
    ddp(full_batch.chunk(world)[rank].to(device))
    return raw[1].running_mean.cpu().numpy(), raw[1].running_var.cpu().numpy()


def test_sync_bn_statistics_over_two_ranks_equal_the_full_batch():
    """The experiment's own wrapping (utils.ddp.wrap_ddp, sync_bn=True) on 2 processes gives each
    rank the running statistics of the full batch (PyTorch's SyncBatchNorm runs only on GPU tensors)."""
    full_batch = torch.randn(16, 4, generator=torch.Generator().manual_seed(1)) * 3 + 1
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6))
    reference.train()
    reference(full_batch)
    for mean, var in run_on_ranks(_batchnorm_statistics_of_a_half, 2, full_batch):
        mean, var = torch.from_numpy(mean), torch.from_numpy(var)
        torch.testing.assert_close(mean, reference[1].running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(var, reference[1].running_var, rtol=1e-5, atol=1e-6)
