"""Host syncs counted on the meta device (utils.host_syncs): the recorder logs what CUDA would block on, and every
release (tests/test_foundation.py's RELEASES, its fine-tuning folder and arguments) and each probabilistic
objective takes one training step (the experiment's own train_epoch: forward, loss, backward, optimizer step) and
evaluation batches (its own evaluate, with the probabilistic scoring) on meta without one.

A sync per eval batch is what evaluating two batches records beyond evaluating one (after a warm-up evaluation, so
caches a release keeps across batches are warm): the reductions at an evaluation's end are once per evaluation.

Every case (each release of tests/test_foundation.py's RELEASES, each objective) must make none.

HOST_SYNCS_RECORD=1 rewrites tests/golden/host_syncs.json (op counts per case: a training step, an eval batch);
HOST_SYNCS_REPORT=<file> writes every case's call sites there (markdown).
"""
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers import ETTH1_ARGS, make_args, write_etth1_shaped
from test_foundation import RELEASES, TUNE, needs, released_folder, run_args
from utils.host_syncs import DEVICE, record_host_syncs, summary, to_meta

GOLDEN = Path(__file__).resolve().parent / "golden" / "host_syncs.json"

OBJECTIVES = {  # a TSLib model under each probabilistic objective (levels, samples as a user gives them)
    "quantile": ("--loss", "quantile", "--quantiles", "0.1,0.5,0.9"),
    "studentt": ("--loss", "studentt", "--quantiles", "0.1,0.5,0.9"),
    "studentt-samples": ("--loss", "studentt", "--quantiles", "0.1,0.5,0.9", "--num_samples", 8),
}
CASES = [*RELEASES, *OBJECTIVES]
BATCH = 4  # windows of the training step and of each eval batch


# ------------------------------------------------------------------ the tests of the recorder itself
def kinds(rec):
    return [(kind, op.split(".")[1] if op.startswith("aten.") else op.split()[0]) for kind, op, _ in rec.syncs]


def test_the_recorder_logs_each_blocking_read_and_copy_and_keeps_the_step_running():
    x = to_meta(torch.ones(3, 4))
    with record_host_syncs() as rec:
        x.sum().item()
        bool(x.max() > 0)
        assert x.tolist() == [[0.0] * 4] * 3  # stand-in values, so the code goes on
        x.cpu()
        x.new_tensor([0.1, 0.5])
        torch.ones(2).to("meta")
        torch.ones(2).to("meta", non_blocking=True)  # no stream sync: listed apart
        assert x[x > 0].shape == (12,)  # a boolean mask taken as all true
        assert torch.nonzero(x).shape == (12, 2)
        counts = torch.bincount(x.flatten().long(), minlength=4)
        assert counts.tolist() == [3, 3, 3, 3]  # spread evenly, read back as built
        torch.unique(x)
        torch.repeat_interleave(counts, output_size=12)  # sized by the caller: no read
        x[x > 0] = 0.0  # a Python number: masked_fill_ on CUDA, no sync
        x[[0, 2]]  # a Python list: a tensor of it copied to the device
        x[torch.tensor([1, 3])]  # host indices, copied to the device
        y = x * 2 + 1  # device work only
    assert kinds(rec) == [("d2h", "_local_scalar_dense"), ("d2h", "_local_scalar_dense"), ("d2h", "_to_copy"),
                          ("d2h", "_to_copy"), ("h2d", "new_tensor"), ("h2d", "_to_copy"), ("d2h", "index"),
                          ("d2h", "nonzero"), ("d2h", "bincount"), ("d2h", "_to_copy"), ("d2h", "_unique2"),
                          ("h2d", "__getitem__"), ("h2d", "index")]
    assert all(site.startswith("tests/test_host_syncs.py:") for _, _, site in rec.syncs), rec.syncs
    assert [kind for kind, _, _ in rec.copies] == ["h2d pageable"]
    assert rec.op_counts["mul"] == 1 and rec.op_counts["add"] == 1 and y.device.type == "meta"
    assert rec.count("h2d") == 4 and len(summary(rec)) == len(rec.syncs)


def test_a_module_step_without_reads_records_none():
    model = to_meta(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1)))
    optimizer = torch.optim.Adam(model.parameters(), foreach=True)
    x = to_meta(torch.randn(5, 4))
    with record_host_syncs() as rec:
        model(x).square().mean().backward()
        optimizer.step()
    assert rec.syncs == [] and rec.op_counts["addmm"] == 2 and rec.op_counts["mm"] >= 2


# ------------------------------------------------------------------ a training step and eval batches on meta
def moved(batch, device):
    return tuple(t.to(device) if torch.is_tensor(t) else t for t in batch)


class OneStep:
    """The training loader's first global step, on `device` (meta), as train_epoch reads a loader."""

    def __init__(self, loader, device=DEVICE):
        self.sampler, self.steps_per_epoch = loader.sampler, 1
        self.step = next(iter(loader.steps(0))).map(lambda batch: moved(batch, device))

    def steps(self, windows):
        return iter([self.step])


class FirstBatches:
    """The test loader's first `n` batches, on `device` (meta) before the evaluation begins (as a split kept on
    the GPU)."""

    def __init__(self, loader, n, device=DEVICE):
        self.dataset, self.n = loader.dataset, n
        self.batches = [moved(batch, device) for _, batch in zip(range(n), loader)]
        self.indices = [indices.to(device) for _, indices in zip(range(n), loader.batch_indices())]
        self.positions = [positions for _, positions in zip(range(n), loader.batch_positions())]

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(self.batches)

    def batch_indices(self):
        return iter(self.indices)

    def batch_positions(self):
        return iter(self.positions)


def argv_of(case, etth1, root):
    common = ("--global_batch_size", BATCH, "--eval_batch_size", BATCH, "--quiet")
    if case in OBJECTIVES:
        return ["--model", "DLinear", *ETTH1_ARGS[:2], "--root_path", etth1, *ETTH1_ARGS[4:], "--seq_len", 48,
                "--pred_len", 24, "--num_threads", 1, *OBJECTIVES[case], *common]
    row = needs(RELEASES[case])
    folder = released_folder(row, root, **({"edit_config": row.tune_folder} if row.tune_folder else {}))
    return [*run_args(row, etth1, folder), *TUNE, *row.tune, *common]


def count_on_meta(argv):
    """{"train_step": ..., "eval_batch": ...} of the experiment `argv` builds on the meta device, each (syncs,
    non-blocking copies, op counts) as Counters: of one training step, and of one eval batch."""
    from data_provider.data_factory import data_provider
    from exp.exp_forecast import Exp_Forecast
    from exp.scoring import ProbabilisticScoring
    from exp.settings import resolve_args
    from exp.steps import RunningLoss
    from utils.checkpoint import TrainingState
    from utils.tools import EarlyStopping

    args = make_args(*argv)
    resolve_args(args, 1)
    exp = Exp_Forecast(args, DEVICE)  # the model built and moved as run.py does, onto meta
    cpu = torch.device("cpu")
    train = OneStep(data_provider(args, "train", cpu)[1])
    # fused Adam has no meta kernel: foreach Adam stands in (neither reads a value back)
    optimizer = torch.optim.Adam(exp.model.parameters(), lr=args.scaled_learning_rate,
                                 weight_decay=args.weight_decay, foreach=True)
    state = TrainingState(exp.raw_model, optimizer, EarlyStopping(args.patience), exp.grad_scaler,
                          running={"since_eval": RunningLoss(DEVICE), "since_log": RunningLoss(DEVICE)})
    with record_host_syncs() as step:
        exp.train_epoch(train, state)
    test = data_provider(args, "test", cpu)[1]
    evaluations = []
    for n in (1, 1, 2):  # the first warms what a release keeps across batches
        loader = FirstBatches(test, n)
        scoring = ProbabilisticScoring(args, test.dataset, DEVICE) if exp.objective is not None else None
        with record_host_syncs() as rec:
            exp.evaluate(loader, "test", scoring=scoring)
        evaluations.append(rec)
    one, two = evaluations[1:]
    per_batch = (Counter(two.syncs) - Counter(one.syncs), Counter(two.copies) - Counter(one.copies),
                 Counter(two.op_counts) - Counter(one.op_counts))
    return {"train_step": (Counter(step.syncs), Counter(step.copies), step.op_counts), "eval_batch": per_batch}


RESULTS = {}  # case -> count_on_meta's result, None where its package is missing


@pytest.fixture(scope="module")
def etth1(tmp_path_factory):
    return write_etth1_shaped(tmp_path_factory.mktemp("etth1"))


@pytest.fixture(scope="module")
def results():
    """The cases counted by this module's tests; once they have run, the records of them (write_records)."""
    yield RESULTS
    write_records(RESULTS)


def syncs_of(result):
    return sum(result["train_step"][0].values()) + sum(result["eval_batch"][0].values())


def lines_of(case, result):
    if result is None:
        return [f"{case}: skipped (its package is not installed)"]
    out = [f"{case}: {syncs_of(result)} syncs; ops {sum(result['train_step'][2].values())} per training step, "
           f"{sum(result['eval_batch'][2].values())} per eval batch of {BATCH} windows"]
    for part, (syncs, copies, _) in result.items():
        out += [f"  {part}: {kind} {op} at {site} x{n}" for (kind, op, site), n in syncs.items()]
        out += [f"  {part}: (non-blocking copy, no stream sync) {kind} {op} at {site} x{n}"
                for (kind, op, site), n in copies.items()]
    return out


def write_records(results):
    if os.environ.get("HOST_SYNCS_RECORD"):
        recorded = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
        recorded.update({case: {part: dict(sorted(r[part][2].items())) for part in r}
                         for case, r in results.items() if r is not None})
        parts = [f' "{case}": {{\n' + ",\n".join(f'  "{part}": {json.dumps(counts)}' for part, counts in
                                                  recorded[case].items()) + "\n }" for case in sorted(recorded)]
        GOLDEN.write_text("{\n" + ",\n".join(parts) + "\n}\n")  # a line per case and part: diffs stay short
    report = os.environ.get("HOST_SYNCS_REPORT")
    if report:
        lines = ["# Host syncs per training step and eval batch, on the meta device", "",
                 "Written by `HOST_SYNCS_REPORT=<this file> python -m pytest -q tests/test_host_syncs.py` (the cases "
                 "run). d2h: the host reads device memory (.item/.tolist/bool, nonzero, boolean index, bincount, "
                 ".cpu); h2d: a blocking host-to-device copy (a tensor built from Python data on the device, "
                 ".to(device) without non_blocking). Non-blocking copies are listed, not counted. The test holds "
                 "every case to 0.", ""]
        for case, result in results.items():
            lines += [*lines_of(case, result), ""]
        Path(report).write_text("\n".join(lines))


@pytest.mark.parametrize("case", CASES)
def test_a_training_step_and_an_eval_batch_make_no_host_sync(case, etth1, results, tmp_path):
    try:
        argv = argv_of(case, etth1, tmp_path / "release")
    except pytest.skip.Exception:
        results[case] = None
        raise
    result = results[case] = count_on_meta([str(a) for a in argv])
    lines = lines_of(case, result)
    recorded = json.loads(GOLDEN.read_text()).get(case, {}) if GOLDEN.is_file() else {}
    for part in ("train_step", "eval_batch"):
        if part in recorded:
            lines.append(f"  {part} ops: {sum(result[part][2].values())} now, {sum(recorded[part].values())} "
                         f"recorded in {GOLDEN.name}")
    print("\n".join(lines))
    assert syncs_of(result) == 0, "\n".join(lines)
