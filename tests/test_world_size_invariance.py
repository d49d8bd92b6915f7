"""One training run, however many processes share it: each epoch has one seeded order of the training
windows, optimizer step k takes its k-th chunk of batch_size x world_size x accumulation_steps windows
(data_provider.global_batches.GlobalBatches), each rank a contiguous part of it, and each micro-batch's
loss is weighted by its share of the whole chunk, so DDP's gradient average is the chunk's mean.

End to end: DLinear and NLinear (no dropout, no batch statistics) trained 3 epochs as 1 x 32, 2 x 16,
4 x 8 (batch_size x processes), 1 x 16 and 2 x 8 with 2 accumulation steps, and 1 x 24 against 3 x 8,
give the same per-epoch losses and test metrics (1e-6 relative). 835 training windows end every epoch
on a short chunk: 3 windows at a global batch of 32 (4 x 8: rank 0's part is empty; 2 x 16: parts of 1
and 2), 19 at 24 (3 x 8: parts of 6, 6 and 7)."""
import numpy as np
import pytest
import torch

from data_provider.global_batches import GlobalBatches, GlobalStep
from helpers import assert_ok, make_args, make_experiment, records, run_cli

ROWS = 1466  # -> 835 training windows at the default --seq_len 96 --pred_len 96
TRAIN_WINDOWS = 835
COMMON = ["--synthetic_rows", ROWS, "--train_epochs", 3, "--patience", 10, "--learning_rate", 0.005]
GLOBAL_32 = {  # name: (--batch_size, processes, --accumulation_steps)
    "1 x 32": (32, None, 1), "2 x 16": (16, 2, 1), "4 x 8": (8, 4, 1), "1 x 16 x 2": (16, None, 2),
    "2 x 8 x 2": (8, 2, 2)}
GLOBAL_24 = {"1 x 24": (24, None, 1), "3 x 8": (8, 3, 1)}
METRICS = ("mse", "mae", "rmse", "mape", "mspe", "vali_loss")


def _train(tmp_path, model, runs, *extra, windows=TRAIN_WINDOWS):
    results = {}
    for name, (batch_size, nproc, accumulation) in runs.items():
        folder = tmp_path / name.replace(" ", "")
        assert_ok(run_cli(folder, *COMMON, "--model", model, "--batch_size", batch_size,
                          "--accumulation_steps", accumulation, *extra, nproc=nproc, timeout=300))
        results[name] = records(folder)[-1]
        assert results[name]["train_windows"] == windows
        assert results[name]["world_size"] == (nproc or 1)
    return results


def _assert_same_training(results, train_rel=1e-6, eval_rel=1e-6):
    (reference_name, reference), *others = results.items()
    for name, record in others:
        assert len(record["history"]) == len(reference["history"]) == 3, name
        for epoch, (got, want) in enumerate(zip(record["history"], reference["history"]), 1):
            assert got["step"] == want["step"], (name, epoch)
            for key, rel in (("train_loss", train_rel), ("vali_loss", eval_rel)):
                assert got[key] == pytest.approx(want[key], rel=rel, abs=0), (
                    f"{name} vs {reference_name}, epoch {epoch} {key}")
        for key in METRICS:
            assert record[key] == pytest.approx(reference[key], rel=eval_rel, abs=0), f"{name} vs {reference_name}: {key}"


@pytest.mark.parametrize("model", ["DLinear", "NLinear"])
def test_the_same_global_batch_trains_the_same_model_on_any_number_of_processes(tmp_path, model):
    results = _train(tmp_path, model, GLOBAL_32)
    assert results["1 x 32"]["history"][0]["step"] == -(-TRAIN_WINDOWS // 32)  # ceil(n / G) steps an epoch
    _assert_same_training(results)


def test_a_global_batch_that_no_process_count_divides_trains_the_single_process_model(tmp_path):
    """--global_batch_size 32 on 3 processes: every step's parts hold 10, 11 and 11 windows, and the run
    is the 1 x 32 one (DLinear's ETTh1 figure in the README's reproduction table is this, on real data)."""
    results = {}
    for name, argv, nproc in (("1 x 32", ["--batch_size", 32], None),
                              ("3 x 32/3", ["--global_batch_size", 32, "--batch_size", 7], 3)):
        folder = tmp_path / name.replace(" ", "").replace("/", "_")
        assert_ok(run_cli(folder, *COMMON, "--model", "DLinear", *argv, nproc=nproc, timeout=300))
        results[name] = records(folder)[-1]
    assert results["3 x 32/3"]["world_size"] == 3
    _assert_same_training(results)


# Models with dropout (their scripts' rate, 0.1), small widths: masks follow the sample (layers.dropout), so
# the runs agree as closely as the models without dropout (measured: ~1e-8 relative)
DROPOUT_MODELS = {
    "iTransformer": ["--d_model", 32, "--d_ff", 64, "--e_layers", 2, "--n_heads", 4, "--learning_rate", 0.001],
    "TimerXL": ["--seq_len", 96, "--input_token_len", 24, "--output_token_len", 24, "--d_model", 32, "--d_ff", 64,
                "--e_layers", 2, "--n_heads", 4, "--use_norm", 1, "--valid_last", "--learning_rate", 0.001],
}
GLOBAL_32_REQUESTED = {name: GLOBAL_32[name] for name in ("1 x 32", "2 x 16", "4 x 8", "1 x 16 x 2")}


@pytest.mark.parametrize("model", sorted(DROPOUT_MODELS))
def test_dropout_models_train_the_same_on_any_number_of_processes(tmp_path, model):
    windows = {"TimerXL": 907}.get(model, TRAIN_WINDOWS)  # its --valid_last windows: seq_len + one token
    _assert_same_training(_train(tmp_path, model, GLOBAL_32_REQUESTED, "--dropout", 0.1, *DROPOUT_MODELS[model],
                                 windows=windows))


def test_batchnorm_with_sync_bn_trains_the_same_on_any_number_of_processes(tmp_path):
    """PatchTST (BatchNorm, dropout 0.1) with --sync_bn: each step's statistics are the global batch's (on the
    CPU through utils.ddp.GlobalBatchNorm), so 1 x 32, 2 x 16 and 4 x 8 take the same steps: training
    losses to 1e-6 (measured 2e-8), validation and test to 1e-4 (measured 5e-6 and 3e-7). Evaluation is the
    looser: the biases just before BatchNorm have a true gradient of zero (BatchNorm removes any constant
    shift), Adam turns their rounding noise into steps of +-lr, and those move the running means that
    evaluation normalises with; at learning rate 0.005 that reaches 1e-4 after one epoch, as between two
    1-process runs with 1 and 2 threads (without --sync_bn: training losses 1.6e-4 apart). 1462 rows give 832 training windows, 26
    whole global batches (a short last chunk whose ranks run different numbers of forwards normalises each
    rank's part alone). Accumulation changes the statistics (those of each micro-batch), as anywhere."""
    runs = {name: GLOBAL_32[name] for name in ("1 x 32", "2 x 16", "4 x 8")}
    common = ["--synthetic_rows", 1462, "--dropout", 0.1, "--sync_bn", "--d_model", 32, "--d_ff", 64, "--n_heads", 4,
              "--e_layers", 1, "--learning_rate", 0.0001]  # the script's rate
    _assert_same_training(_train(tmp_path, "PatchTST", runs, *common, windows=832), train_rel=1e-6, eval_rel=1e-4)


# A user's model file with plain nn.Dropout: the experiment converts its modules to sample-keyed ones
# (layers.dropout.KeyedDropout.convert). UNKEYABLE adds one whose input holds the channels first ([C, L, B]).
PLAIN_DROPOUT_MODEL = '''"""A user's MLP over time with plain nn.Dropout."""
from torch import nn

UNKEYABLE = {unkeyable}


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)

    def __init__(self, configs):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(configs.seq_len, configs.d_model), nn.GELU(), nn.Dropout(configs.dropout),
                                 nn.Linear(configs.d_model, configs.pred_len))
        self.channel_drop = nn.Dropout(configs.dropout) if UNKEYABLE else None

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        out = self.mlp(x_enc.transpose(1, 2)).transpose(1, 2)  # dropout on [B, C, d_model]
        if self.channel_drop is not None:  # on [C, pred_len, B]: no sample's rows in front
            out = self.channel_drop(out.permute(2, 1, 0)).permute(2, 1, 0)
        return out
'''
PLAIN_RUN = ["--model", "PlainDropout", "--synthetic_rows", 600, "--synthetic_channels", 3, "--seq_len", 48,
             "--label_len", 24, "--pred_len", 24, "--d_model", 32, "--dropout", 0.3, "--train_epochs", 3,
             "--patience", 10, "--learning_rate", 0.005, "--num_threads", 1, "--no_plots"]


def run_user_model(rank, world_size, model_file, argv):
    """On each rank of run_on_ranks: run.py's main with `--model PlainDropout` being the file's Model; rank 0's
    stdout (its log lines) and the exit code."""
    import contextlib
    import importlib.util
    import io
    from unittest import mock

    import run

    loader = importlib.util.spec_from_file_location("user_plain_dropout", model_file)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    out = io.StringIO()
    with (mock.patch("exp.settings.get_model_class", return_value=module.Model), contextlib.redirect_stdout(out),
          mock.patch("utils.distributed.cleanup")):  # run_on_ranks ends the process group itself
        code = run.main(list(map(str, argv)))
    return code, out.getvalue()


def _train_user_model(tmp_path, name, world_size, batch_size, unkeyable=False):
    from helpers import output_args, run_on_ranks

    model_file = tmp_path / "PlainDropout.py"
    model_file.write_text(PLAIN_DROPOUT_MODEL.format(unkeyable=unkeyable))
    folder = tmp_path / name
    argv = [*PLAIN_RUN, "--batch_size", batch_size, *output_args(folder)]
    results = run_on_ranks(run_user_model, world_size, str(model_file), argv, timeout=200)
    assert [code for code, _ in results] == [0] * world_size, results
    return records(folder)[-1], [log for _, log in results]


def test_a_plain_nn_dropout_model_trains_the_same_on_1_and_2_processes(tmp_path):
    """Its nn.Dropout is converted when the experiment builds it, so 1 x 16 and 2 x 8 draw the same masks and
    train alike (1e-6 relative, as the zoo's models; before the conversion 2 processes trained otherwise);
    metrics.json says the module was keyed."""
    runs = {"1 x 16": _train_user_model(tmp_path, "one", 1, 16), "2 x 8": _train_user_model(tmp_path, "two", 2, 8)}
    _assert_same_training({name: record for name, (record, _) in runs.items()})
    for record, logs in runs.values():
        assert record["dropout_keyed"] == {"mlp.2": True}
        assert not any("warning" in log for log in logs)


def test_a_dropout_that_cannot_be_keyed_is_named_once_and_the_run_goes_on(tmp_path):
    """A dropout on [C, pred_len, B] (3 rows, micro-batches of 8) cannot follow the samples: it falls back to
    ordinary dropout, rank 0 warns once naming it, the run finishes and metrics.json records which were exact."""
    record, (log, other) = _train_user_model(tmp_path, "two", 2, 8, unkeyable=True)
    warnings = [line for line in log.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: dropout channel_drop is not keyed by the sample")
    assert "(3, 24, 8)" in warnings[0] and not other.strip()
    assert record["dropout_keyed"] == {"mlp.2": True, "channel_drop": False}
    assert record["history"][-1]["step"] > 0 and record["mse"] > 0


def test_three_processes_with_uneven_parts_train_the_single_process_model(tmp_path):
    _assert_same_training(_train(tmp_path, "DLinear", GLOBAL_24))


# ---------------------------------------------------------------- the sampler
def _epoch(n, batch_size, accumulation, world, epoch=3, drop_last=False, constant_memory=False, seed=2021):
    """Every rank's steps of one epoch: [rank][step] -> GlobalStep of int lists."""
    ranks = []
    for rank in range(world):
        sampler = GlobalBatches(n, seed, batch_size, accumulation, rank, world, drop_last=drop_last,
                                constant_memory=constant_memory)
        sampler.set_epoch(epoch)
        steps = [GlobalStep([m.tolist() for m in step], step.windows,
                            None if step.stand_in is None else step.stand_in.tolist(), step.uneven)
                 for step in sampler.steps()]
        assert len(steps) == len(sampler), "len() is the number of steps the epoch gives"
        ranks.append(steps)
    return ranks


def _single_process_order(n, epoch=3, constant_memory=False, seed=2021):
    sampler = GlobalBatches(n, seed, batch_size=n, constant_memory=constant_memory)
    sampler.set_epoch(epoch)
    return sampler.order(0, n).tolist()


CASES = [(835, 8, 1), (835, 8, 2), (100, 5, 3), (7, 4, 1), (64, 8, 2), (1, 3, 2)]


@pytest.mark.parametrize("constant_memory", [False, True], ids=["in memory", "corpus"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n, batch_size, accumulation", CASES)
def test_every_window_once_an_epoch_and_step_k_is_chunk_k_of_the_one_order(n, batch_size, accumulation, world,
                                                                           constant_memory):
    """No padding, no repeats, the same number of steps on every rank, and the ranks' parts of step k,
    taken in rank order, are exactly the k-th chunk of the single-process order (contiguous parts: an
    interleaved split would give the same windows in another order)."""
    ranks = _epoch(n, batch_size, accumulation, world, constant_memory=constant_memory)
    order = _single_process_order(n, constant_memory=constant_memory)
    global_batch = batch_size * world * accumulation
    assert {len(steps) for steps in ranks} == {-(-n // global_batch)}
    taken = []
    for k in range(len(ranks[0])):
        chunk = order[k * global_batch:(k + 1) * global_batch]
        parts = [[w for micro in steps[k] for w in micro] for steps in ranks]
        assert [w for part in parts for w in part] == chunk, f"step {k}"
        assert {steps[k].windows for steps in ranks} == {len(chunk)}
        sizes = [len(part) for part in parts]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes), f"step {k}: parts {sizes}"
        for steps in ranks:
            micro_sizes = [len(micro) for micro in steps[k]]
            if len(chunk) == global_batch:
                assert micro_sizes == [batch_size] * accumulation, f"step {k}"
            elif micro_sizes:  # a short chunk: as even as possible, no empty micro-batch
                assert max(micro_sizes) - min(micro_sizes) <= 1 and min(micro_sizes) > 0, f"step {k}"
            assert (steps[k].stand_in is None) == bool(steps[k]), "a stand-in exactly when the part is empty"
            if steps[k].stand_in is not None:
                assert len(steps[k].stand_in) == 1 and steps[k].stand_in[0] in chunk
        forwards = {max(1, len(steps[k])) for steps in ranks}  # a stand-in pass is one forward
        assert all(steps[k].uneven == (len(forwards) > 1) for steps in ranks), f"step {k}"
        taken.extend(chunk)
    assert sorted(taken) == list(range(n))  # every window exactly once


@pytest.mark.parametrize("world", [1, 3])
def test_each_micro_batch_says_where_its_windows_sit_in_the_order(world):
    """GlobalStep.firsts, what dropout masks are keyed by: micro-batch i's windows are the order's windows
    from position firsts[i] on, and the epoch is the sampler's."""
    order = _single_process_order(100, epoch=2)
    for rank in range(world):
        sampler = GlobalBatches(100, 2021, 5, 3, rank, world)
        sampler.set_epoch(2)
        for step in sampler.steps():
            assert step.epoch == 2 and len(step.firsts) == len(step)
            for first, micro in zip(step.firsts, step):
                assert micro.tolist() == order[first:first + len(micro)]


def test_a_given_global_batch_is_cut_as_evenly_as_possible():
    order = _single_process_order(100)
    parts = []
    for rank in range(3):
        sampler = GlobalBatches(100, 2021, 11, 2, rank, 3, global_batch=32)
        sampler.set_epoch(3)
        parts.append([[m.tolist() for m in step] for step in sampler.steps()])
    assert len(parts[0]) == 4  # ceil(100 / 32)
    assert [[len(m) for m in steps[0]] for steps in parts] == [[5, 5], [5, 6], [5, 6]]  # 10, 11, 11
    assert [w for k in range(4) for steps in parts for m in steps[k] for w in m] == order


def test_in_memory_order_is_the_single_process_distributed_sampler_order():
    """A 1-process run keeps its trajectory: the order is DistributedSampler's with one replica."""
    from torch.utils.data import DistributedSampler

    for epoch in (0, 1, 5):
        reference = DistributedSampler(range(835), num_replicas=1, rank=0, shuffle=True, seed=2021)
        reference.set_epoch(epoch)
        for world in (1, 3):
            ranks = _epoch(835, 16, 2, world, epoch=epoch)
            flat = [w for k in range(len(ranks[0])) for steps in ranks for micro in steps[k] for w in micro]
            assert flat == list(reference), (epoch, world)


def test_corpus_order_is_the_feistel_permutation_and_costs_no_memory():
    from data_provider.permutation import FeistelPermutation, ShuffledShards, epoch_key

    ranks = _epoch(1000, 8, 2, 3, epoch=4, constant_memory=True, seed=7)
    flat = [w for k in range(len(ranks[0])) for steps in ranks for micro in steps[k] for w in micro]
    assert flat == FeistelPermutation(1000, epoch_key(7, 4))(np.arange(1000)).tolist()
    single = ShuffledShards(1000, 7)  # the same order ShuffledShards deals on one process
    single.set_epoch(4)
    assert flat == list(single)
    huge = GlobalBatches(10 ** 12, 1, 256, 2, rank=3, world_size=8, constant_memory=True)
    huge.set_epoch(5)
    first = next(huge.steps())
    assert [len(m) for m in first] == [256, 256] and huge._order is None  # no array of 1e12 windows
    assert len(huge) == -(-10 ** 12 // (256 * 8 * 2))


def test_drop_last_drops_the_last_short_global_chunk_only():
    kept, dropped = _epoch(835, 8, 1, 4), _epoch(835, 8, 1, 4, drop_last=True)
    for rank in range(4):
        assert len(kept[rank]) == 27 and kept[rank][-1].windows == 3
        assert [list(s) for s in dropped[rank]] == [list(s) for s in kept[rank][:-1]]
    exact = _epoch(64, 8, 2, 2, drop_last=True)  # whole chunks only: nothing to drop
    assert [len(steps) for steps in exact] == [2, 2]


@pytest.mark.parametrize("start", [0, 96, 200])
def test_drop_last_from_a_resumed_position_keeps_its_whole_global_batches(start):
    """From any position (a resume on another global batch need not land on this one's multiples), a
    --train_drop_last epoch takes every whole global batch left and drops only the short tail."""
    sampler = GlobalBatches(835, 2021, 8, 1, 0, 4, drop_last=True)  # G = 32
    sampler.set_epoch(1)
    steps = list(sampler.steps(start))
    assert len(steps) == sampler.steps_from(start) == (835 - start) // 32
    assert all(step.windows == 32 for step in steps)
    assert steps[-1].firsts[0] == start + ((835 - start) // 32 - 1) * 32


def test_a_resumed_epoch_continues_from_a_global_position():
    """A run resumed mid-epoch starts at the windows done (a multiple of the global batch): the same
    steps as the rest of the uninterrupted epoch."""
    for rank in range(3):
        sampler = GlobalBatches(835, 2021, 8, 2, rank, 3)
        sampler.set_epoch(2)
        whole = [[m.tolist() for m in s] for s in sampler.steps()]
        rest = [[m.tolist() for m in s] for s in sampler.steps(start=5 * 48)]
        assert rest == whole[5:] and sampler.steps_from(5 * 48) == len(whole) - 5


# ---------------------------------------------------------------- the loader and the step
@pytest.mark.parametrize("rank, world", [(0, 1), (0, 4), (3, 4)])
def test_loader_steps_are_the_samplers_windows_with_and_without_workers(rank, world):
    """Each micro-batch is its index tensor gathered, the stand-in too, and loader workers give the
    same steps (also from a resumed position)."""
    from data_provider.data_factory import data_provider
    from data_provider.windows import TrainLoader

    args = make_args("--batch_size", 8, "--synthetic_rows", ROWS)
    args.autoregressive = False
    dataset, _ = data_provider(args, "train")
    assert len(dataset) == TRAIN_WINDOWS

    def loader(workers):
        made = TrainLoader(dataset, GlobalBatches(len(dataset), 7, 8, 2, rank, world), workers)
        made.set_epoch(3)
        return made

    fast = loader(0)
    index_steps = list(fast.sampler.steps())
    for start in (0, 10 * 16 * world):
        steps = list(fast.steps(start))
        assert len(steps) == fast.sampler.steps_from(start)
        for indices, step in zip(index_steps[start // (16 * world):], steps):
            assert step.windows == indices.windows and step.uneven == indices.uneven and len(step) == len(indices)
            for order, batch in zip([*indices, indices.stand_in], [*step, step.stand_in]):
                if order is None:
                    assert batch is None
                    continue
                for part, gathered in zip(batch, dataset.__getitems__(order)):
                    assert (part is None) == (gathered is None)
                    if part is not None:
                        torch.testing.assert_close(part, gathered, rtol=0, atol=0)
        with_workers = list(loader(2).steps(start))
        assert len(with_workers) == len(steps)
        for a, b in zip(steps, with_workers):
            assert (a.windows, a.uneven, len(a)) == (b.windows, b.uneven, len(b))
            for batch_a, batch_b in zip([*a, a.stand_in], [*b, b.stand_in]):
                assert (batch_a is None) == (batch_b is None)
                for x, y in zip(batch_a or (), batch_b or ()):
                    assert (x is None) == (y is None)
                    if x is not None:
                        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert len(fast) == sum(len(step) for step in index_steps)  # the micro-batches iterating it gives
    assert len(list(fast)) == len(fast)


def test_the_stand_in_pass_changes_nothing():
    """A rank with no window in a step still runs a forward and backward (DDP all-reduces there), zero-
    weighted and in eval mode: gradients zero, weights, BatchNorm statistics and the random stream
    untouched, and the model back in train mode."""
    from data_provider.data_factory import data_provider

    exp = make_experiment(make_args("--model", "PatchTST", "--synthetic_rows", ROWS, "--batch_size", 8,
                                    "--dropout", 0.3, "--e_layers", 1, "--d_model", 16, "--d_ff", 16))
    dataset, _ = data_provider(exp.args, "train")
    optimizer = exp.make_optimizer()  # fresh: Adam moves no weight on zero gradients
    exp.model.train()
    before = {k: v.clone() for k, v in exp.raw_model.state_dict().items()}
    assert any("running_mean" in k for k in before), "PatchTST keeps BatchNorm statistics"
    rng = torch.get_rng_state()
    loss_sum, n_scored = exp.train_step(GlobalStep([], 3, stand_in=dataset.__getitems__(torch.arange(5, 6))),
                                        optimizer)
    assert float(loss_sum) == 0 and n_scored == 0
    assert all(p.grad is not None and not p.grad.any() for p in exp.raw_model.parameters())
    after = exp.raw_model.state_dict()
    for name, value in before.items():
        assert torch.equal(after[name], value), name
    assert torch.equal(torch.get_rng_state(), rng) and exp.model.training


def test_a_micro_batch_weighs_its_share_of_the_global_batch():
    """train_step's gradient over a rank's micro-batches is its windows' share of the global batch's
    mean: (windows here / global windows) x world size x their mean's gradient. On one process, a step
    told its global batch holds twice the windows takes half the gradient."""
    from data_provider.data_factory import data_provider

    exp = make_experiment(make_args("--synthetic_rows", ROWS, "--batch_size", 8, "--learning_rate", 0))
    dataset, _ = data_provider(exp.args, "train")
    optimizer = exp.make_optimizer()
    micro = [dataset.__getitems__(torch.arange(0, 3)), dataset.__getitems__(torch.arange(3, 8))]
    gradients = []
    for step in (micro, GlobalStep(micro, 8), GlobalStep(micro, 16), [dataset.__getitems__(torch.arange(8))]):
        exp.train_step(step, optimizer)
        gradients.append(torch.cat([p.grad.flatten() for p in exp.raw_model.parameters()]))
    torch.testing.assert_close(gradients[0], gradients[3], rtol=1e-5, atol=1e-7)  # the mean of all 8
    torch.testing.assert_close(gradients[1], gradients[3], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(gradients[2], gradients[3] / 2, rtol=1e-5, atol=1e-7)


def test_sync_batchnorm_normalises_locally_in_an_uneven_step():
    """In a step whose ranks run different numbers of forwards, SyncBatchNorm's gathers could not pair
    up: local_batch_norm gives it plain BatchNorm's forward (no collective) and restores it after."""
    from utils import ddp

    torch.manual_seed(0)
    plain = torch.nn.BatchNorm1d(4)
    synced = torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(4)))
    synced.load_state_dict({f"0.{k}": v for k, v in plain.state_dict().items()})
    x = torch.randn(6, 4, 5)
    with ddp.local_batch_norm(synced):
        torch.testing.assert_close(synced(x), plain(x), rtol=0, atol=0)
    assert "forward" not in vars(synced[0])  # SyncBatchNorm's own forward again
    with ddp.local_batch_norm(synced, local=False):
        assert "forward" not in vars(synced[0])


@pytest.mark.parametrize("loss", ["quantile", "studentt"])
def test_a_probabilistic_objective_trains_the_same_model_on_any_number_of_processes(tmp_path, loss):
    """The pinball loss and the Student-t likelihood are means over the scored elements too: 1 x 24 and
    3 x 8 (uneven parts of the last chunk) train the same quantile / distribution forecaster. The pinball
    loss's gradient, like MAE's, is a step function of each residual's sign, which float rounding in the
    two batch layouts can flip: over 3 epochs they part by 2e-5 (MAE: 6e-5), hence 1e-4; the smooth
    likelihood stays within 1e-6."""
    rel = 1e-4 if loss == "quantile" else 1e-6
    results = _train(tmp_path, "DLinear", GLOBAL_24, "--loss", loss)
    _assert_same_training(results, train_rel=rel, eval_rel=rel)
    for key in ("wql", "mase", "coverage_80", "test_objective_loss"):
        assert results["3 x 8"][key] == pytest.approx(results["1 x 24"][key], rel=rel, abs=0), key
