"""--zero: the optimizer state sharded between ranks (ZeroRedundancyOptimizer), saved whole."""
import shutil

import pytest
import torch

from helpers import assert_ok, make_args, make_experiment, records, run_cli, run_on_ranks

DLINEAR = ["--model", "DLinear", "--synthetic_rows", 1500, "--num_threads", 1, "--learning_rate", 1e-3,
           "--lradj", "constant", "--ddp"]  # run_cli's nproc=2: workers forked warm, as torchrun sets them


def _epoch_losses(record):
    return [(h["epoch"], h["train_loss"], h["vali_loss"], h["test_loss"]) for h in record["history"]]


def test_zero_run_saves_the_whole_state_and_resumes_with_and_without_zero(tmp_path):
    first = tmp_path / "first"
    proc = run_cli(first, *DLINEAR, "--train_epochs", 1, "--zero", nproc=2, timeout=120)
    assert_ok(proc)
    record = records(first)[-1]
    sharded_bytes = record["optimizer_state_bytes"]
    assert len(sharded_bytes) == 2 and all(b > 0 for b in sharded_bytes)
    shares = ", ".join(f"{b / 2**20:.2f} MiB" for b in sharded_bytes)
    assert f"optimizer state per rank: {shares} (sharded, --zero)" in proc.stdout, proc.stdout

    # last.pth holds the consolidated state: every parameter's moments, not rank 0's shard
    from models.DLinear import Model

    args = make_args("--model", "DLinear")
    args.enc_in = 7
    params = list(Model(args).parameters())
    last = torch.load(first / "checkpoints" / record["setting"] / "last.pth", weights_only=True)
    state = last["optimizer"]
    assert sorted(state["state"]) == list(range(len(params)))
    for index, param in enumerate(params):
        moments = state["state"][index]
        assert moments["exp_avg"].shape == param.shape and moments["exp_avg_sq"].abs().sum() > 0
        assert float(moments["step"]) == last["global_step"] > 0

    # continue for a second epoch: sharded again, and unsharded from the same file
    resumed = {}
    for name, extra in (("with_zero", ["--zero"]), ("without_zero", [])):
        shutil.copytree(first, tmp_path / name)
        proc = run_cli(tmp_path / name, *DLINEAR, "--train_epochs", 2, "--resume", *extra, nproc=2,
                       timeout=120)
        assert_ok(proc)
        assert "resumed from" in proc.stdout
        resumed[name] = records(tmp_path / name)[-1]
    with_zero, without_zero = resumed["with_zero"], resumed["without_zero"]
    assert [e for e, *_ in _epoch_losses(with_zero)] == [1, 2]
    # the same Adam from the same moments: equal up to the kernels' rounding (foreach vs fused)
    for a, b in zip(_epoch_losses(with_zero), _epoch_losses(without_zero)):
        assert a == pytest.approx(b, rel=1e-5)
    assert with_zero["mse"] == pytest.approx(without_zero["mse"], rel=1e-5)
    # unsharded, each rank holds all of it: the sum of the shards (Adam's step counters aside)
    whole = without_zero["optimizer_state_bytes"]
    assert whole[0] == whole[1] == pytest.approx(sum(sharded_bytes), rel=0.01)
    assert with_zero["optimizer_state_bytes"] == sharded_bytes


def _optimizer_state_per_rank(rank, world):
    """Optimizer-state bytes on this rank after one training step, unsharded and with --zero."""
    from data_provider.data_factory import data_provider
    from utils import ddp

    measured = {}
    for zero in (False, True):
        argv = ["--model", "TimerXL", "--d_model", 256, "--n_heads", 4, "--e_layers", 2, "--batch_size", 4,
                "--synthetic_rows", 1500, "--num_threads", 1, "--ddp", *(["--zero"] if zero else [])]
        exp = make_experiment(make_args(*argv))
        optimizer = exp.make_optimizer()
        dataset, _ = data_provider(exp.args, "train")
        exp.model.train()
        exp.train_step([dataset.__getitems__(torch.arange(rank * 4, rank * 4 + 4))], optimizer)
        measured[zero] = ddp.optimizer_state_bytes(optimizer)
        measured[f"params {zero}"] = sum(p.numel() * p.element_size() for p in exp.raw_model.parameters())
    return measured


def test_zero_halves_the_optimizer_state_per_rank_for_timerxl():
    per_rank = run_on_ranks(_optimizer_state_per_rank, 2)
    params = per_rank[0]["params False"]
    for rank, measured in enumerate(per_rank):
        whole, shard = measured[False], measured[True]
        assert whole == pytest.approx(2 * params, rel=0.01)  # Adam: two moments per parameter
        ratio = shard / whole
        print(f"rank {rank}: optimizer state {whole / 2**20:.2f} MiB unsharded, {shard / 2**20:.2f} MiB "
              f"with --zero ({ratio:.3f})")
        assert 0.35 < ratio < 0.65
    assert sum(m[True] for m in per_rank) == pytest.approx(per_rank[0][False], rel=0.01)


def _optimizer_types(rank, world):
    from utils import ddp

    params = [torch.nn.Parameter(torch.zeros(3))]
    return (type(ddp.make_optimizer(params, torch.optim.Adam, lr=0.1)).__name__,
            type(ddp.make_optimizer(params, torch.optim.Adam, shard=True, lr=0.1)).__name__)


def test_an_optimizer_is_sharded_only_when_asked():
    """make_optimizer's default, under a process group too, is the plain optimizer: ZeroRedundancyOptimizer
    only with shard=True (--zero)."""
    assert run_on_ranks(_optimizer_types, 2) == [("Adam", "ZeroRedundancyOptimizer")] * 2
