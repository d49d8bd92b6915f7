"""The fast path changes speed, never results: AMP, torch.compile, the batched gather, fused steps."""
import pytest
import torch

from data_provider.data_factory import data_provider
from exp.forward import forward
from helpers import assert_ok, make_args, make_experiment, records, run_cli, run_on_ranks
from utils.errors import UserError


def test_bf16_amp_trains_to_nearly_the_fp32_result(tmp_path):
    argv = ["--train_epochs", 2, "--synthetic_rows", 2500]
    assert_ok(run_cli(tmp_path, *argv))
    assert_ok(run_cli(tmp_path, *argv, "--use_amp"))
    fp32, amp = records(tmp_path)
    assert amp["mse"] == pytest.approx(fp32["mse"], rel=0.02)
    assert amp["args"]["use_amp"] is True


def test_compiled_training_saves_plain_checkpoints(tmp_path):
    assert_ok(run_cli(tmp_path, "--train_epochs", 1, "--synthetic_rows", 1500, "--compile"))
    compiled = records(tmp_path)[-1]
    state = torch.load(tmp_path / "checkpoints" / compiled["setting"] / "checkpoint.pth", weights_only=True)
    assert sorted(state) == ["Linear_Seasonal.bias", "Linear_Seasonal.weight", "Linear_Trend.bias", "Linear_Trend.weight"]
    assert_ok(run_cli(tmp_path, "--train_epochs", 1, "--synthetic_rows", 1500))
    assert records(tmp_path)[-1]["mse"] == pytest.approx(compiled["mse"], rel=1e-4)


def test_fp16_is_refused_on_cpu():
    with pytest.raises(UserError, match="--amp_dtype fp16 needs a GPU"):
        make_experiment(make_args("--use_amp", "--amp_dtype", "fp16", "--use_gpu", "false"))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("rank, world", [(0, 1), (1, 3)])
def test_loader_batches_are_distributed_samplers_windows_stacked(rank, world, drop_last):
    """Index-tensor batches: DistributedSampler's order and shard, equal to stacked per-window items,
    and the same batches when workers build them; with drop_last, BatchSampler's drop_last batches."""
    from torch.utils.data import BatchSampler, DistributedSampler

    from data_provider.windows import WindowLoader

    args = make_args("--batch_size", 16, "--synthetic_rows", 1200)
    args.autoregressive = False
    dataset, _ = data_provider(args, "train")

    def loader(workers):
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=7, drop_last=False)
        made = WindowLoader(dataset, sampler, 16, workers, drop_last)
        made.set_epoch(3)
        return made, sampler

    fast, sampler = loader(0)
    assert len(sampler) % 16, "the shard must end on a short batch for drop_last to matter"
    expected_order = list(BatchSampler(sampler, 16, drop_last=drop_last))
    assert [i.tolist() for i in fast.batch_indices()] == expected_order
    assert (len(expected_order[-1]) == 16) == drop_last
    batches = list(fast)
    assert len(batches) == len(fast) == len(expected_order)
    for order, batch in zip(expected_order, batches):
        singles = [dataset[i] for i in order]
        for part, stacked in enumerate(batch):
            torch.testing.assert_close(stacked, torch.stack([s[part] for s in singles]), rtol=0, atol=0)
            assert stacked.is_contiguous()
    worker_batches = list(loader(2)[0])
    assert len(worker_batches) == len(batches)
    for fast_batch, worker_batch in zip(batches, worker_batches):
        for a, b in zip(fast_batch, worker_batch):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def _train_batch_sizes(rank, world, argv):
    from data_provider.data_factory import data_provider

    args = make_args(*argv, "--ddp")
    args.autoregressive = False
    _, loader = data_provider(args, "train")
    return [batch[0].shape[0] for batch in loader]


def test_train_drop_last_gives_every_rank_the_same_full_batches():
    """Uneven shards (3 ranks): DistributedSampler pads every rank to one count, so every rank
    drops the same short batch and runs the same number of DDP steps."""
    argv = ["--batch_size", 64, "--synthetic_rows", 1200]
    kept = run_on_ranks(_train_batch_sizes, 3, argv)
    dropped = run_on_ranks(_train_batch_sizes, 3, [*argv, "--train_drop_last"])
    assert kept[0][-1] < 64, "the shards must end on a short batch for the test to mean anything"
    for rank in range(3):
        assert kept[rank] == kept[0] and dropped[rank] == kept[0][:-1]


def test_loader_skips_time_features_of_a_model_that_reads_none():
    """inputs_used = ("x_enc",): batches carry None for both marks and the same x and y as otherwise."""
    exp = make_experiment(make_args("--model", "DLinear", "--batch_size", 8, "--synthetic_rows", 1200))
    assert exp.args.model_inputs == ("x_enc",)
    lean = next(iter(data_provider(exp.args, "val")[1]))
    exp.args.model_inputs = ("x_enc", "x_mark_enc", "x_dec", "x_mark_dec")
    full = next(iter(data_provider(exp.args, "val")[1]))
    assert lean[2] is None and lean[3] is None and full[2].shape[-1] > 0
    for a, b in zip(lean[:2], full[:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    pred_lean, true_lean = forward(exp.raw_model, lean, exp.args, "val", exp.device)
    # the marks are given, and not passed on
    pred_full, true_full = forward(exp.raw_model, full, exp.args, "val", exp.device)
    torch.testing.assert_close(pred_lean, pred_full, rtol=0, atol=0)
    torch.testing.assert_close(true_lean, true_full, rtol=0, atol=0)
