"""Distributed helpers and exact evaluation, on real gloo process groups of 1, 2 and 3 ranks."""
import math

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from helpers import SMALL_TIMERXL, make_args, make_experiment, run_on_ranks


def _collectives(rank, world):
    from utils import distributed

    return {
        "sum": distributed.all_reduce_sum([rank + 1.0, 0.5]),
        "any_last": distributed.any_rank(rank == world - 1),
        "any_none": distributed.any_rank(False),
        "gathered": distributed.gather_objects(rank * 10),
        "gathered_on_main": distributed.gather_on_main(f"rank {rank}"),
        "broadcast": distributed.broadcast_object(f"from {rank}"),
        "is_main": distributed.is_main(),
    }


def test_collective_helpers_on_three_ranks():
    results = run_on_ranks(_collectives, 3)
    for rank, result in enumerate(results):
        assert result["sum"] == [6.0, 1.5]
        assert result["any_last"] is True and result["any_none"] is False
        assert result["gathered"] == [0, 10, 20]
        assert result["gathered_on_main"] == (["rank 0", "rank 1", "rank 2"] if rank == 0 else None)
        assert result["broadcast"] == "from 0"
        assert result["is_main"] == (rank == 0)


def _evaluate(rank, world, argv):
    """Build the experiment on this rank and evaluate val and test without training."""
    from data_provider.data_factory import data_provider

    args = make_args(*argv, "--ddp")
    exp = make_experiment(args)
    assert isinstance(exp.model, DistributedDataParallel) or world == 1

    # Evaluation must never run the DDP wrapper: make its forward explode while evaluating.
    def forbidden(*a, **k):
        raise AssertionError("evaluation ran through the DDP wrapper")

    original = DistributedDataParallel.forward
    DistributedDataParallel.forward = forbidden
    try:
        _, vali_loader = data_provider(args, "val")
        _, test_loader = data_provider(args, "test")
        vali = exp.vali(vali_loader)
        test = exp.evaluate(test_loader, "test").metrics()
    finally:
        DistributedDataParallel.forward = original
    return {"vali": vali, "test": test, "test_batches": len(test_loader)}


CASES = {
    "DLinear": ["--model", "DLinear", "--eval_batch_size", 301],
    "TimerXL": [*SMALL_TIMERXL, "--input_token_len", 24, "--output_token_len", 48, "--test_pred_len", 60, "--eval_batch_size", 128],
}


@pytest.mark.parametrize("case", CASES)
def test_evaluation_is_identical_for_world_sizes_1_2_3(case):
    reference = run_on_ranks(_evaluate, 1, CASES[case])[0]
    assert math.isfinite(reference["vali"])
    for world in (2, 3):
        results = run_on_ranks(_evaluate, world, CASES[case])
        if case == "DLinear" and world == 3:
            # 905 test windows in batches of 301 (the fourth of 2), dealt 2 / 1 / 1: ranks run different batch counts
            assert [r["test_batches"] for r in results] == [2, 1, 1]
        for result in results:
            assert result["vali"] == pytest.approx(reference["vali"], rel=1e-6)
            for name in ("mse", "mae", "rmse", "mape", "mspe"):
                assert result["test"][name] == pytest.approx(reference["test"][name], rel=1e-6), name
        # every rank holds the very same global numbers, bit for bit
        assert len({r["vali"] for r in results}) == 1


def test_error_sums_match_numpy_reference():
    from utils.metrics import ErrorSums

    pred, true = torch.randn(5, 7, 3), torch.randn(5, 7, 3) + 3
    sums = ErrorSums()
    sums.update(pred[:2], true[:2])
    sums.update(pred[2:], true[2:])
    metrics = sums.metrics()
    p, t = pred.double().numpy(), true.double().numpy()
    assert metrics["mse"] == pytest.approx(((p - t) ** 2).mean())
    assert metrics["mae"] == pytest.approx(abs(p - t).mean())
    assert metrics["rmse"] == pytest.approx(((p - t) ** 2).mean() ** 0.5)
    assert metrics["mape"] == pytest.approx(abs((p - t) / t).mean())
    assert metrics["mspe"] == pytest.approx((((p - t) / t) ** 2).mean())


def test_torchrun_workers_split_the_cores_and_keep_at_least_one(monkeypatch):
    from utils import distributed, threads

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "cgroup_cores", lambda: None)
    before = torch.get_num_threads()
    try:
        for cores, local, expected in ((8, 2, 4), (2, 3, 1)):  # more workers than cores: one thread each
            monkeypatch.setattr(threads, "affinity", lambda: list(range(cores)))  # (utils.threads' rule)
            monkeypatch.setattr(threads, "_torch_default", lambda: cores)
            monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
            distributed._set_threads(0)
            assert torch.get_num_threads() == expected, (cores, local)
        distributed._set_threads(3)  # --num_threads wins
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_a_loaded_optimizer_state_keeps_this_optimizers_kernel():
    # a state saved by a --zero run (foreach kernel) resumed without --zero (fused), and back
    from utils import ddp

    def adam(**kernel):
        weight = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.Adam([weight], lr=1e-3, **kernel)
        weight.sum().backward()
        optimizer.step()
        return optimizer

    for saved_kernel, kernel in (({"foreach": True}, {"fused": True}), ({"fused": True}, {"foreach": True})):
        optimizer = adam(**kernel)
        ddp.load_optimizer_state(optimizer, adam(**saved_kernel).state_dict())
        group = optimizer.param_groups[0]
        assert (bool(group["fused"]), bool(group["foreach"])) == (bool(kernel.get("fused")), bool(kernel.get("foreach")))



@pytest.fixture
def fake_gpus(monkeypatch):
    """CUDA as a machine with `gpus["visible"]` GPUs would answer; the devices set and the process groups
    started are recorded instead of happening."""
    from utils import distributed

    gpus = {"visible": 1, "set": [], "groups": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus["visible"])
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: gpus["set"].append(torch.device(device)))
    monkeypatch.setattr(distributed, "_init_process_group", lambda cuda, device, timeout: gpus["groups"].append(device))
    monkeypatch.setattr(distributed, "_set_threads", lambda threads: None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return gpus


@pytest.mark.parametrize("visible, local_rank, processes, expected", [
    (1, 3, 4, 0),  # one GPU shown to each process (SLURM --gpus-per-task=1 sets CUDA_VISIBLE_DEVICES): its only one
    (2, 1, 2, 1),  # one process per GPU: its LOCAL_RANK's
    (8, 0, 1, 0),
])
def test_a_ddp_process_computes_on_its_local_gpu(fake_gpus, monkeypatch, visible, local_rank, processes, expected):
    """A process whose LOCAL_RANK is past the GPUs it sees (one GPU per task) got set_device(LOCAL_RANK):
    a raw "invalid device ordinal"."""
    from utils import distributed

    fake_gpus["visible"] = visible
    if visible == 1:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
    device = distributed.setup(True, True, None, 60, 1)
    assert device == torch.device("cuda", expected)
    assert fake_gpus["set"] == [device] and fake_gpus["groups"] == [device]


@pytest.mark.parametrize("local_rank", [0, 3])
def test_more_processes_than_gpus_stop_every_process_of_the_machine(fake_gpus, monkeypatch, local_rank):
    from utils import distributed
    from utils.errors import NodeError

    fake_gpus["visible"] = 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(NodeError, match=r"runs 4 processes but shows 2 GPU\(s\) \(CUDA_VISIBLE_DEVICES=4,5\); "
                                        r"start at most 2 per machine \(--nproc_per_node 2\)"):
        distributed.setup(True, True, None, 60, 1)
    assert fake_gpus["set"] == [] and fake_gpus["groups"] == []  # nothing touched a GPU or waited for peers


def test_without_a_local_world_size_a_process_counts_the_local_ranks_up_to_its_own(fake_gpus, monkeypatch):
    from utils import distributed
    from utils.errors import NodeError

    fake_gpus["visible"] = 2
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)  # a launcher that does not set it
    with pytest.raises(NodeError, match=r"LOCAL_RANK 2 has no GPU of its own on .*: it runs 3 processes but shows 2"):
        distributed.setup(True, True, None, 60, 1)


def test_gpu_picks_the_device_of_a_single_process_run(fake_gpus):
    """--gpu was parsed and never used: every single-process run computed on GPU 0."""
    from utils import distributed
    from utils.errors import UserError

    fake_gpus["visible"] = 2
    assert distributed.setup(False, True, None, 60, 1) == torch.device("cuda", 0)
    assert distributed.setup(False, True, 1, 60, 1) == torch.device("cuda", 1)
    assert fake_gpus["set"] == [torch.device("cuda", 0), torch.device("cuda", 1)]
    with pytest.raises(UserError, match=r"--gpu 2 is not a GPU of this machine: it shows 2 GPU\(s\), numbered 0 to 1; choose"):
        distributed.setup(False, True, 2, 60, 1)
    assert distributed.setup(False, False, 1, 60, 1) == torch.device("cpu")  # --use_gpu false


def test_peak_gpu_memory_is_every_ranks_and_absent_on_the_cpu(monkeypatch):
    """GPU runs record each rank's peak memory (history and metrics.json; tests/gpu checks a real run)."""
    from exp.exp_forecast import evaluation_line
    from exp.steps import StepPlan
    from helpers import make_args
    from utils import distributed
    from utils.tools import EarlyStopping

    asked = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: asked.append(device) or 1536 * 2**20)
    assert distributed.peak_gpu_mib(torch.device("cuda", 1)) == [1536.0] and asked == [torch.device("cuda", 1)]
    assert distributed.peak_gpu_mib(torch.device("cpu")) is None
    record = {"epoch": 1, "step": 10, "train_loss": 1.0, "vali_loss": 1.0, "test_loss": 1.0, "lr": 1e-4, "seconds": 1.0,
              "peak_gpu_mib": [1536.0, 1600.0]}
    args = make_args()
    line = evaluation_line(args, record, 10.0, EarlyStopping(3), True, StepPlan(args, steps_per_epoch=10))
    assert line.endswith("peak GPU memory 1600 MiB")


def _validation_subset(rank, world, argv):
    from data_provider.data_factory import data_provider

    args = make_args(*argv, "--ddp")
    exp = make_experiment(args)
    dataset, loader = data_provider(args, "val")
    shard = [int(i) for indices in loader.batch_indices() for i in dataset.indices[indices]]
    return exp.vali(loader), shard, len(dataset)


def test_a_validation_subset_is_the_same_windows_on_any_world_size():
    """--val_windows N: N validation windows of a huge split, chosen from --seed alone, so the loss is
    still exact across world sizes (1, 2, 3)."""
    argv = ["--val_windows", 40, "--synthetic_rows", 3000]
    (reference, ids, n), = run_on_ranks(_validation_subset, 1, argv)
    assert n == 40 and ids == sorted(set(ids))  # distinct windows, in time order
    whole = make_args("--synthetic_rows", 3000)
    from data_provider.data_factory import data_provider
    from exp.settings import resolve_args

    resolve_args(whole, 1)
    assert max(ids) < len(data_provider(whole, "val")[0]) and max(ids) > 40  # drawn from the whole split
    for world in (2, 3):
        results = run_on_ranks(_validation_subset, world, argv)
        assert [i for _, shard, _ in results for i in shard] == ids  # the same windows, shared out
        assert all(loss == pytest.approx(reference, rel=1e-6) for loss, _, _ in results)


def test_optimizer_state_bytes_count_every_state_tensor():
    """Adam keeps exp_avg and exp_avg_sq per parameter and a step counter: 10 + 10 fp32 values and one."""
    from utils import ddp

    weight = torch.nn.Parameter(torch.ones(10))
    optimizer = torch.optim.Adam([weight], lr=1e-3, fused=True)
    weight.sum().backward()
    optimizer.step()
    step = optimizer.state[weight]["step"]
    assert ddp.optimizer_state_bytes(optimizer) == 2 * 10 * 4 + step.numel() * step.element_size()


def test_window_errors_before_the_reduction_are_this_ranks_own():
    from utils.metrics import ErrorSums

    sums = ErrorSums(keep_windows=True)
    pred, true = torch.zeros(3, 4, 2), torch.arange(24.0).reshape(3, 4, 2)
    sums.update(pred, true)
    expected = torch.stack([true.square().mean((1, 2)), true.abs().mean((1, 2))], dim=1).double()
    torch.testing.assert_close(sums.window_errors(), expected)


def _raise_from_a_check(rank, world, on):
    from utils import distributed
    from utils.errors import UserError

    def check():
        if rank == 0:
            raise UserError("rank 0 cannot read the file")
        return None

    try:
        distributed.raise_on_every_rank(check, on=on)
    except UserError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("on", ["main", "all"])
def test_a_check_that_raises_stops_every_rank_with_its_message(on):
    """A check may raise UserError instead of returning the message (a loader does): caught on its rank
    and shared, so the other ranks raise it too instead of waiting in the collective."""
    assert run_on_ranks(_raise_from_a_check, 2, on, timeout=60) == ["rank 0 cannot read the file"] * 2


def test_two_processes_on_a_one_gpu_machine_are_refused_before_nccl(fake_gpus, monkeypatch):
    """torchrun --nproc_per_node 2 on a machine with one GPU (no CUDA_VISIBLE_DEVICES): both processes took
    GPU 0 and NCCL failed on every rank with 'Duplicate GPU detected' and a traceback (seen on an H100)."""
    from utils import distributed
    from utils.errors import NodeError

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(NodeError, match=r"runs 2 processes but shows 1 GPU\(s\); start at most 1 per machine"):
        distributed.setup(True, True, None, 60, 1)
    assert fake_gpus["set"] == [] and fake_gpus["groups"] == []


def test_nccls_duplicate_gpu_refusal_becomes_one_line(monkeypatch):
    """CUDA_VISIBLE_DEVICES=0 exported for both processes: each sees one GPU, so only NCCL can tell they are
    the same one; its error (this text on torch 2.11, CUDA 13) becomes a NodeError naming the fix."""
    import torch.distributed as dist

    from utils import distributed
    from utils.errors import NodeError

    def nccl_refuses(**options):
        raise dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1234, invalid usage, NCCL version 2.27.7\n"
                                    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
                                    "Last error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 60")

    monkeypatch.setattr(dist, "init_process_group", nccl_refuses)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    with pytest.raises(NodeError, match=r"two processes of this job share one GPU on .* each process needs a GPU "
                                        r"of its own") as raised:
        distributed._init_process_group(True, torch.device("cuda", 0), 60)
    assert "\n" not in str(raised.value)
    monkeypatch.setattr(dist, "init_process_group",
                        lambda **options: (_ for _ in ()).throw(dist.DistBackendError("NCCL timeout")))
    with pytest.raises(dist.DistBackendError, match="NCCL timeout"):  # any other failure is not renamed
        distributed._init_process_group(True, torch.device("cuda", 0), 60)
