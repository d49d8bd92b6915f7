"""Scaling up: gradient accumulation, global batch and learning-rate scaling, SyncBatchNorm.

(--zero, the sharded optimizer state, is in test_zero.py.)
"""
import math
import time

import numpy as np
import pytest
import torch

from helpers import SMALL_TIMERXL, assert_ok, make_args, make_experiment, records, run_cli, run_on_ranks

# dropout 0: the four ways of taking a step below must see the very same function
TIMERXL = [*SMALL_TIMERXL, "--dropout", 0, "--synthetic_rows", 1500, "--num_threads", 1, "--learning_rate", 1e-3]
WINDOWS = 32


# ---------------------------------------------------------------- gradient accumulation
def _flat(tensors):
    # numpy: tensors would cross the result queue as shared memory, gone once the rank exits
    return torch.cat([t.detach().flatten().double() for t in tensors]).numpy()


def _one_optimizer_step(exp, batch_size, world, rank):
    """One Exp_Forecast.train_step over this rank's share of windows 0..31, cut into micro-batches."""
    from data_provider.data_factory import data_provider

    dataset, _ = data_provider(exp.args, "train")
    share = WINDOWS // world
    starts = torch.arange(rank * share, (rank + 1) * share)
    micro_batches = [dataset.__getitems__(chunk) for chunk in starts.split(batch_size)]
    assert len(micro_batches) == exp.args.accumulation_steps
    optimizer = exp.make_optimizer()
    initial = _flat(exp.raw_model.parameters())
    exp.model.train()
    exp.train_step(micro_batches, optimizer)
    # train_step zeroes gradients before the group, so .grad still holds the step's gradient
    grads = _flat(p.grad for p in exp.raw_model.parameters())
    norm = exp.last_grad_norm  # the norm before clipping, with --clip_grad
    return {"initial": initial, "weights": _flat(exp.raw_model.parameters()), "grads": grads,
            "norm": (norm if norm is not None else torch.zeros(())).double().reshape(1).numpy()}


def _as_tensors(results):
    return [{k: torch.from_numpy(v) for k, v in result.items()} for result in results]


def _configurations(rank, world, configs, extra=()):
    """On every rank: one optimizer step per (batch_size, accumulation_steps), each from fresh weights."""
    results = []
    for batch_size, accumulation in configs:
        argv = [*TIMERXL, "--batch_size", batch_size, "--accumulation_steps", accumulation, *extra]
        exp = make_experiment(make_args(*argv, *(["--ddp"] if world > 1 else [])))
        results.append(_one_optimizer_step(exp, batch_size, world, rank))
    if world > 1:  # no_sync finds the experiment's DDP, also under a compile wrapper
        assert _no_sync_state(exp.model) == _no_sync_state(_Compiled(exp.model)) == (False, True, True)
    return results


def test_accumulation_and_ddp_take_the_same_step_as_one_large_batch():
    started = time.time()
    # (i) 1 process x batch 32, (iii) 1 process x batch 16 x 2 micro-batches: no process group at all
    single = _configurations(0, 1, [(32, 1), (16, 2)])
    # (ii) 2 processes x batch 16, (iv) 2 processes x batch 8 x 2 micro-batches: DDP over gloo
    ranks = run_on_ranks(_configurations, 2, [(16, 1), (8, 2)])
    single, ranks = _as_tensors(single), [_as_tensors(r) for r in ranks]
    reference = single[0]
    cases = {"1 x 16 x 2 accumulation": single[1], "2 DDP x 16": ranks[0][0], "2 DDP x 8 x 2 accumulation": ranks[0][1],
             "rank 1 of 2 DDP x 16": ranks[1][0], "rank 1 of 2 DDP x 8 x 2 accumulation": ranks[1][1]}
    update = (reference["weights"] - reference["initial"]).abs().max()
    assert update > 1e-4  # the step moved the weights
    gaps = {}
    for name, case in cases.items():
        assert torch.equal(case["initial"], reference["initial"]), name  # the same starting point
        # Relative to the whole vector: float32 summation order differs between the four, and
        # Adam's first step (about lr x sign(grad)) amplifies that noise in weights whose
        # gradient is nearly 0, so a near-zero weight can differ by more than 1e-6 of itself.
        weight_gap = float((case["weights"] - reference["weights"]).norm() / reference["weights"].norm())
        # The gradient itself too: Adam's first step ignores its scale, so a wrong 1/N would hide
        grad_gap = float((case["grads"] - reference["grads"]).norm() / reference["grads"].norm())
        assert weight_gap < 1e-6 and grad_gap < 1e-6, f"{name}: weights {weight_gap:.2e}, gradients {grad_gap:.2e}"
        gaps[name] = (weight_gap, grad_gap)
    print(f"largest weight update {update:.3e}; relative gaps (weights, gradients) {gaps}; "
          f"{time.time() - started:.1f}s")


def test_gradient_clipping_is_the_same_on_any_world_size_and_accumulation():
    """--clip_grad clips the global norm of the step's gradient: the all-reduced one under DDP (with --zero
    too), the added-up one under accumulation, so every rank and every split of the batch clips alike and
    logs the same norm. (After fp16's unscaling: tests/gpu/test_gpu_amp.py.)"""
    clip = ["--clip_grad", 0.05]
    single = _as_tensors(_configurations(0, 1, [(32, 1), (16, 2)], clip))
    ranks = [_as_tensors(r) for r in run_on_ranks(_configurations, 2, [(16, 1)], clip)]
    # --zero shards only Adam's state: every rank still holds the whole all-reduced gradient and clips alike
    zero = [_as_tensors(r) for r in run_on_ranks(_configurations, 2, [(16, 1)], [*clip, "--zero"])]
    reference = single[0]
    assert reference["norm"].item() > 0.05  # the case under test: the gradient is clipped
    assert reference["grads"].norm().item() == pytest.approx(0.05, rel=1e-5)
    cases = {"1 x 16 x 2 accumulation": single[1], "rank 0 of 2": ranks[0][0], "rank 1 of 2": ranks[1][0],
             "rank 0 of 2 --zero": zero[0][0], "rank 1 of 2 --zero": zero[1][0]}
    for name, case in cases.items():
        assert case["norm"].item() == pytest.approx(reference["norm"].item(), rel=1e-5), name
        grad_gap = float((case["grads"] - reference["grads"]).norm() / reference["grads"].norm())
        assert grad_gap < 1e-5, f"{name}: gradients {grad_gap:.2e}"


class _Compiled(torch.nn.Module):
    """Stands in for torch.compile's OptimizedModule, which keeps the module as _orig_mod
    (a real torch.compile costs seconds of imports)."""

    def __init__(self, inner):
        super().__init__()
        self._orig_mod = inner


def _no_sync_state(model):
    """(flag inside no_sync, flag with skip=False, flag after) of the DDP in `model`."""
    from utils.ddp import ddp_module, no_sync

    ddp = ddp_module(model)
    with no_sync(model):
        inside = ddp.require_backward_grad_sync
    with no_sync(model, skip=False):
        unskipped = ddp.require_backward_grad_sync
    return inside, unskipped, ddp.require_backward_grad_sync


def test_micro_batches_of_a_step_and_no_sync_without_ddp():
    import contextlib

    from data_provider.global_batches import GlobalBatches
    from utils import ddp

    def micro_sizes(n, batch_size, accumulation):
        return [[len(m) for m in step] for step in GlobalBatches(n, 0, batch_size, accumulation).steps()]

    assert micro_sizes(16, 3, 3) == [[3, 3, 3], [2, 2, 3]]  # a short last step, cut as evenly as possible
    assert micro_sizes(2, 3, 3) == [[1, 1]]  # and never into an empty micro-batch
    assert micro_sizes(4, 1, 1) == [[1], [1], [1], [1]]
    model = torch.nn.Linear(2, 2)
    assert isinstance(ddp.no_sync(model), contextlib.nullcontext)
    assert ddp.ddp_module(_Compiled(_Compiled(model))) is None


# ---------------------------------------------------------------- global batch and learning-rate scaling
@pytest.mark.parametrize("scaling, expected", [("none", 1e-3), ("linear", 4e-3), ("sqrt", 2e-3)])
def test_learning_rate_scaling_arithmetic(scaling, expected):
    from utils.tools import global_batch_size, learning_rate_for_epoch, scaled_learning_rate

    args = make_args("--batch_size", 16, "--accumulation_steps", 4, "--lr_scaling", scaling,
                     "--learning_rate", 1e-3, "--lradj", "type1")
    assert global_batch_size(args, 2) == 128  # 16 x 2 processes x 4 micro-batches
    assert scaled_learning_rate(args, 128) == pytest.approx(expected)  # against --base_batch_size 32
    assert scaled_learning_rate(args, 32) == pytest.approx(1e-3)  # the base batch keeps the rate
    args.scaled_learning_rate = scaled_learning_rate(args, 128)
    assert [learning_rate_for_epoch(args, e) for e in (1, 3)] == pytest.approx([expected, expected / 2])


def test_global_batch_and_scaled_rate_are_logged_and_recorded(tmp_path):
    # 2 processes x batch 8 x 2 micro-batches = 32 windows a step; sqrt scaling against 16: x sqrt(2)
    proc = run_cli(tmp_path, "--synthetic_rows", 1500, "--num_threads", 1, "--train_epochs", 1, "--batch_size", 8,
                   "--accumulation_steps", 2, "--lr_scaling", "sqrt", "--base_batch_size", 16,
                   "--learning_rate", 1e-3, "--ddp", nproc=2, timeout=120)
    assert_ok(proc)
    lr = 1e-3 * math.sqrt(2)
    assert (f"global batch 32 (8 x 2 processes x 2 accumulation steps), learning rate {lr:g} "
            f"(--lr_scaling sqrt: 0.001 at batch 16)") in proc.stdout
    record = records(tmp_path)[-1]
    assert record["args"]["global_batch_size"] == 32
    assert record["args"]["scaled_learning_rate"] == pytest.approx(lr)
    assert record["history"][0]["lr"] == pytest.approx(lr)
    # the step counter counts optimizer steps: ceil(micro-batches per rank / 2)
    state = torch.load(tmp_path / "checkpoints" / record["setting"] / "last.pth", weights_only=True)
    micro_batches = math.ceil(math.ceil(record["train_windows"] / 2) / 8)
    assert state["global_step"] == math.ceil(micro_batches / 2)


@pytest.mark.parametrize("scaling", ["none", "linear", "sqrt"])
def test_the_opening_line_names_the_scaling_in_use(scaling):
    from exp.exp_forecast import training_summary
    from exp.settings import resolve_args

    args = resolve_args(make_args("--synthetic_rows", 1500, "--lr_scaling", scaling, "--base_batch_size", 16), 1)
    line = training_summary(args, "s", 100)
    assert (f"(--lr_scaling {scaling}: 0.0001 at batch 16)" in line) == (scaling != "none"), line


# ---------------------------------------------------------------- SyncBatchNorm
PATCHTST = ["--model", "PatchTST", "--d_model", 16, "--d_ff", 32, "--n_heads", 2, "--e_layers", 1,
            "--synthetic_rows", 1500, "--num_threads", 1]


def _converted_patchtst(rank, world, device):
    from models import get_model_class
    from utils import ddp

    args = make_args(*PATCHTST)
    args.enc_in = args.dec_in = args.c_out = 7
    plain = get_model_class("PatchTST")(args)
    expected = {k: tuple(v.shape) for k, v in plain.state_dict().items()}
    converted = ddp.convert_sync_batchnorm(plain, device)
    layers = [type(m).__name__ for m in converted.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    state = converted.state_dict()
    get_model_class("PatchTST")(args).load_state_dict(state, strict=True)  # a plain model takes the file
    return layers, {k: tuple(v.shape) for k, v in state.items()} == expected


def test_sync_bn_conversion_keeps_plain_batchnorm_keys():
    # the conversion the experiment applies under DDP (GPUs: SyncBatchNorm; the CPU: GlobalBatchNorm), and what it saves
    for layers, same_keys in run_on_ranks(_converted_patchtst, 2, "cuda"):
        assert layers == ["SyncBatchNorm"] and same_keys
    for layers, same_keys in run_on_ranks(_converted_patchtst, 2, "cpu"):
        assert layers == ["GlobalBatchNorm"] and same_keys
    from utils import ddp

    plain = torch.nn.Sequential(torch.nn.BatchNorm1d(3))
    assert ddp.convert_sync_batchnorm(plain) is plain  # no process group: unchanged


def _global_batchnorm_step(rank, world, x, weights, local):
    from utils import ddp, distributed

    torch.manual_seed(0)
    layer = ddp.GlobalBatchNorm.convert(torch.nn.Sequential(torch.nn.BatchNorm1d(4, momentum=None)))
    with torch.no_grad():
        layer[0].weight.uniform_(0.5, 1.5)
        layer[0].bias.uniform_(-1, 1)
    first, last = distributed.shard_range(len(x), rank, world)
    part = x[first:last].clone().requires_grad_(True)
    with ddp.local_batch_norm(layer, local):
        for _ in range(2):  # two steps: the running statistics' update, cumulative average (momentum None)
            out = layer(part)
            (out * weights[first:last]).sum().backward()
    grads = [t.grad.numpy().copy() for t in (layer[0].weight, layer[0].bias)]
    return (out.detach().numpy(), part.grad.numpy(), grads,
            layer[0].running_mean.numpy().copy(), layer[0].running_var.numpy().copy())


@pytest.mark.parametrize("world", [2, 3])
def test_global_batchnorm_on_the_cpu_is_batchnorm_over_every_ranks_batch(world):
    """torch.nn.SyncBatchNorm does not run on the CPU; GlobalBatchNorm, which --sync_bn uses there, gives each
    rank its rows of what plain BatchNorm gives the whole batch in one process: output, input gradient,
    running statistics, and parameter gradients summed over the ranks (DDP then averages them). Uneven
    parts (7 rows on 3 ranks) included; with local_batch_norm each rank normalises alone."""
    torch.manual_seed(1)
    x, weights = torch.randn(7, 4, 5) * 3 + 1, torch.randn(7, 4, 5)
    (out, x_grad, grads, mean, var), = run_on_ranks(_global_batchnorm_step, 1, x, weights, False)
    ranks = run_on_ranks(_global_batchnorm_step, world, x, weights, False)
    np.testing.assert_allclose(np.concatenate([r[0] for r in ranks]), out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.concatenate([r[1] for r in ranks]), x_grad, rtol=1e-4, atol=1e-5)
    for i in range(2):
        np.testing.assert_allclose(sum(r[2][i] for r in ranks), grads[i], rtol=1e-4, atol=1e-5)
    for r in ranks:
        np.testing.assert_allclose(r[3], mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r[4], var, rtol=1e-5, atol=1e-6)
    local = run_on_ranks(_global_batchnorm_step, world, x, weights, True)
    assert not np.allclose(np.concatenate([r[0] for r in local]), out, atol=1e-3)


def test_tst_schedule_is_torchs_one_cycle_as_a_function_of_the_step():
    from utils.tools import one_cycle_learning_rate

    total = 37 * 3
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.01, total_steps=total, pct_start=0.2)
    for step in range(total):
        assert one_cycle_learning_rate(0.01, step, total) == pytest.approx(scheduler.get_last_lr()[0], rel=1e-9), step
        optimizer.step()
        scheduler.step()


def test_tst_run_records_the_per_step_rate(tmp_path):
    assert_ok(run_cli(tmp_path, "--train_epochs", 2, "--synthetic_rows", 1500, "--lradj", "TST",
                      "--learning_rate", 0.01))
    history = records(tmp_path)[-1]["history"]
    # OneCycle: the rate has warmed up past its start (0.01 / 25) by the end of epoch 1 and is
    # near its floor after the last step
    assert history[0]["lr"] > 0.01 / 25 and history[-1]["lr"] < 1e-5


@pytest.mark.parametrize("lradj", ["type1", "cosine", "TST"])
def test_warmup_ramps_every_schedule_linearly_over_its_first_steps(lradj):
    """--warmup_steps W multiplies the schedule's rate by (step + 1) / W for the first W optimizer steps,
    whatever --lradj is (a function of the step, so a resumed run continues it exactly)."""
    from utils.tools import LearningRateSchedule

    def rates(warmup):
        args = make_args("--lradj", lradj, "--learning_rate", 0.01, "--train_epochs", 3, "--warmup_steps", warmup)
        args.scaled_learning_rate = args.learning_rate
        schedule = LearningRateSchedule(args, steps_per_epoch=10)
        return [schedule.rate(1 + step // 10, step) for step in range(30)]

    plain, warm = rates(0), rates(8)
    assert warm[:8] == pytest.approx([plain[k] * (k + 1) / 8 for k in range(8)], rel=1e-12)
    assert warm[8:] == plain[8:]


def _all_reduce_passes(rank, world, accumulation):
    """Gradient all-reduce calls (one per DDP bucket) in one optimizer step over `accumulation` micro-batches."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from data_provider.data_factory import data_provider

    exp = make_experiment(make_args(*TIMERXL, "--ddp", "--batch_size", 4, "--accumulation_steps", accumulation))
    calls = []

    def counting(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)

    exp.model.register_comm_hook(None, counting)
    dataset, _ = data_provider(exp.args, "train")
    micro_batches = [dataset.__getitems__(torch.arange(4 * i, 4 * i + 4)) for i in range(accumulation)]
    exp.model.train()
    exp.train_step(micro_batches, exp.make_optimizer())
    return len(calls)


def test_accumulation_all_reduces_once_per_optimizer_step():
    """Only the last micro-batch's backward all-reduces (DDP no_sync before it): 3 micro-batches cost the
    communication of one."""
    one, three = (run_on_ranks(_all_reduce_passes, 2, accumulation) for accumulation in (1, 3))
    assert one == three and one[0] > 0
