"""The window loaders (data_provider.windows, as data_provider builds them): training batches are the
global batches' windows stacked (data_provider.global_batches), the same with loader workers, and
--train_drop_last drops the last short global batch on every rank alike; a model that reads no time
features gets none."""
import sys

import pytest
import torch

from data_provider.data_factory import data_provider
from exp.forward import forward
from helpers import make_args, make_experiment, run_on_ranks


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("rank, world", [(0, 1), (1, 3)])
def test_loader_batches_are_the_global_batches_windows_stacked(rank, world, drop_last):
    """Index-tensor batches: GlobalBatches' micro-batches of this rank, equal to stacked per-window items,
    and the same batches when workers build them; with drop_last, the last short global batch dropped."""
    from data_provider.global_batches import GlobalBatches
    from data_provider.windows import TrainLoader

    args = make_args("--batch_size", 16, "--synthetic_rows", 1200)
    args.autoregressive = False
    dataset, _ = data_provider(args, "train")

    def loader(workers):
        sampler = GlobalBatches(len(dataset), 7, 16, 1, rank, world, drop_last=drop_last)
        made = TrainLoader(dataset, sampler, workers)
        made.set_epoch(3)
        return made, sampler

    fast, sampler = loader(0)
    assert len(dataset) % (16 * world), "the epoch must end on a short global batch for drop_last to matter"
    expected_order = [micro.tolist() for step in sampler.steps() for micro in step]
    assert [i.tolist() for i in fast.batch_indices()] == expected_order
    assert (len(expected_order[-1]) == 16) == drop_last
    assert len(expected_order) == -(-len(dataset) // (16 * world)) - drop_last
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
    """This rank's micro-batch sizes, step by step."""
    from data_provider.data_factory import data_provider

    args = make_args(*argv, "--ddp")
    args.autoregressive = False
    _, loader = data_provider(args, "train")
    return [[batch[0].shape[0] for batch in step] for step in loader.steps()]


def test_train_drop_last_accepts_exactly_one_full_batch():
    from utils.errors import UserError

    args = make_args("--synthetic_rows", 1500, "--train_drop_last")
    args.autoregressive = False
    windows = len(data_provider(args, "train")[0])
    args.batch_size = windows  # one full batch: trains
    assert len(data_provider(args, "train")[1]) == 1
    args.batch_size = windows + 1  # none: refused
    with pytest.raises(UserError, match="leaves no training batch"):
        data_provider(args, "train")


def test_train_drop_last_drops_the_last_short_global_batch_on_every_rank():
    """Uneven parts (3 ranks): every rank runs the same number of steps, the ranks' parts of the short last
    global batch differ by at most one window, and --train_drop_last drops that step on every rank."""
    argv = ["--batch_size", 64, "--synthetic_rows", 1200]
    kept = run_on_ranks(_train_batch_sizes, 3, argv)
    dropped = run_on_ranks(_train_batch_sizes, 3, [*argv, "--train_drop_last"])
    last = [sum(steps[-1]) for steps in kept]
    assert max(last) < 64 and max(last) - min(last) <= 1, "the epoch must end on a short global batch"
    for rank in range(3):
        assert len(kept[rank]) == len(kept[0]) and kept[rank][:-1] == [[64]] * (len(kept[0]) - 1)
        assert dropped[rank] == kept[rank][:-1]


def test_loader_skips_time_features_of_a_model_that_reads_none():
    """inputs_used = ("x_enc",): batches carry None for both marks and the same x and y as otherwise."""
    exp = make_experiment(make_args("--model", "DLinear", "--batch_size", 8, "--synthetic_rows", 1200))
    assert exp.args.model_inputs == ("x_enc",)
    lean = next(iter(data_provider(exp.args, "val")[1]))
    exp.args = exp.args.replace(model_inputs=("x_enc", "x_mark_enc", "x_dec", "x_mark_dec"))
    full = next(iter(data_provider(exp.args, "val")[1]))
    assert lean[2] is None and lean[3] is None and full[2].shape[-1] > 0
    for a, b in zip(lean[:2], full[:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    pred_lean, true_lean = forward(exp.raw_model, lean, exp.args, "val", exp.device)
    # the marks are given, and not passed on
    pred_full, true_full = forward(exp.raw_model, full, exp.args, "val", exp.device)
    torch.testing.assert_close(pred_lean, pred_full, rtol=0, atol=0)
    torch.testing.assert_close(true_lean, true_full, rtol=0, atol=0)


@pytest.mark.parametrize("subset", [1.0, 0.5], ids=["windows", "few-shot selection"])
def test_an_epochs_batch_indices_live_where_the_split_does(subset):
    """A split kept on the GPU got each batch's indices from the host: a blocking copy every step.
    On the meta device (the CPU's stand-in for a GPU), every batch's index tensor and the batch
    itself are where the split is, so only the epoch's order crossed over, once."""
    args = make_args("--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24,
                     "--subset_rand_ratio", subset)
    make_experiment(args)
    dataset, loader = data_provider(args, "train")
    dataset.to("meta")
    assert dataset.device == torch.device("meta")
    batches = loader.batch_indices()
    assert len(batches) == len(loader) > 1
    assert {indices.device.type for indices in batches} == {"meta"}
    assert {part.device.type for batch in loader for part in batch if part is not None} == {"meta"}


@pytest.mark.parametrize("sampler", ["shard", "a plain order"])
def test_batch_positions_are_the_batch_indices_on_the_host(sampler):
    """Evaluation reads each window's host-side key (sampled quantiles, a model's own draws) from
    batch_positions: the very windows of batch_indices, as host arrays, also when the split lives on the
    device (meta here), so no index crosses back from a GPU."""
    import numpy as np

    args = make_args("--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24,
                     "--eval_batch_size", 7)
    make_experiment(args)
    dataset, loader = data_provider(args, "test")
    if sampler == "a plain order":
        loader.sampler = list(range(3, len(dataset)))[::-1]
    want = [indices.numpy() for indices in loader.batch_indices()]
    dataset.to("meta")
    got = list(loader.batch_positions())
    assert len(got) == len(want) > 2 and all(isinstance(p, np.ndarray) and p.dtype == np.int64 for p in got)
    assert all(np.array_equal(p, w) for p, w in zip(got, want))
    assert np.array_equal(np.concatenate(list(loader.batch_positions(start=10))), np.concatenate(want)[10:])


@pytest.fixture
def a_gpu_with(monkeypatch):
    """A CUDA device whose free memory the test sets; moving a split there is recorded, not done."""
    import data_provider.data_factory as factory
    from data_provider.windows import WindowDataset, WindowSelection

    gpu = {"free": 0, "moved": []}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (gpu["free"], 80 * 2**30))
    for cls in (WindowDataset, WindowSelection):
        monkeypatch.setattr(cls, "to", lambda self, device: gpu["moved"].append(self.split) or self)
    factory._placement_cache.clear()
    yield gpu
    factory._placement_cache.clear()


@pytest.mark.parametrize("mode, workers, free_mib, on_gpu", [
    ("auto", 0, 1000, True),   # the 1500-row data (~0.1 MiB) fits a quarter of the free memory
    ("auto", 0, 0.2, False),   # it does not: batches are gathered in host memory
    ("auto", 2, 1000, False),  # loader workers gather in host memory
    ("never", 0, 1000, False),
    ("always", 0, 0.2, True),
])
def test_where_the_splits_live_on_a_gpu(a_gpu_with, mode, workers, free_mib, on_gpu, caplog):
    """Every rank copied train, val and test whole to its GPU (a large corpus ran out of memory), and
    the only escape, --num_workers, gathered batches in pageable memory. --data_on_device decides, and
    workers feeding a GPU pin their batches."""
    a_gpu_with["free"] = int(free_mib * 2**20)
    args = make_args("--synthetic_rows", 1500, "--data_on_device", mode, "--num_workers", workers)
    make_experiment(args)
    gpu = torch.device("cuda", 0)
    with caplog.at_level("INFO", logger="tsl"):
        loaders = [data_provider(args, flag, gpu)[1] for flag in ("train", "val", "test")]
    assert a_gpu_with["moved"] == (["train", "val", "test"] if on_gpu else [])
    logged = [r.getMessage() for r in caplog.records if "--data_on_device auto" in r.getMessage()]
    if mode == "auto" and workers == 0:  # decided once, and said
        from data_provider.data_factory import prepared_data

        mib = prepared_data(args).nbytes() / 2**20
        assert len(logged) == 1 and logged[0].startswith(
            f"data {'on' if on_gpu else 'off'} the GPU (--data_on_device auto): {mib:.1f} MiB against "
            f"{free_mib:.0f} MiB free on cuda:0"), logged
    else:
        assert logged == []
    for loader in loaders:
        pinned = loader._worker_loader.pin_memory if loader._worker_loader is not None else False
        assert pinned is (workers > 0 and not on_gpu)


@pytest.mark.parametrize("eval_batch, expected", [(["--eval_batch_size", 7], 7), ([], 4 * 8)], ids=["given", "default"])
def test_validation_and_test_batches_take_eval_batch_size(eval_batch, expected):
    """--eval_batch_size, and without it the documented default: 4 x --batch_size (no gradients kept)."""
    args = make_args("--synthetic_rows", 1500, "--batch_size", 8, *eval_batch)
    make_experiment(args)
    sizes = {flag: data_provider(args, flag)[1].batch_size for flag in ("train", "val", "test")}
    assert sizes == {"train": 8, "val": expected, "test": expected}


def test_data_on_device_never_as_typed_does_not_ask_the_gpu(monkeypatch):
    """--data_on_device never, as a command line gives it (a string parsed at run time, not the
    interned literal of the code), keeps the data off the GPU before anything asks CUDA (this
    machine has none: torch.cuda.mem_get_info would raise)."""
    import shlex

    import data_provider.data_factory as factory
    from data_provider.data_factory import keeps_data_on_device

    monkeypatch.setattr(factory, "_placement_cache", {})  # no earlier test's decision stands in
    args = make_args(*shlex.split("--synthetic_rows 1500 --data_on_device never"))
    make_experiment(args)
    assert args.data_on_device == "never" and args.data_on_device is not sys.intern("never")
    assert keeps_data_on_device(args, torch.device("cuda", 0)) is False


def test_a_selections_single_item_is_its_window_and_out_of_range_is_refused():
    """WindowSelection[i] (torch's DataLoader without __getitems__ asks for items one by one) is window
    indices[i] of its base; a position outside [0, len) is an IndexError, never another window."""
    from data_provider.windows import WindowSelection

    args = make_args("--synthetic_rows", 600, "--seq_len", 48, "--label_len", 24, "--pred_len", 24)
    base, _ = data_provider(args, "train")
    chosen = WindowSelection(base, [5, 9, 30])
    for i, window in enumerate((5, 9, 30)):
        for got, want in zip(chosen[i], base[window]):
            assert (got is None and want is None) or torch.equal(got, want)
    for outside in (3, -1):
        with pytest.raises(IndexError):
            chosen[outside]
