"""--test_windows N (a seeded subset of the test split, exact on any number of processes) and the
progress an evaluation shows once it runs for a few seconds (issue 36, item 25)."""
import io
import json

import numpy as np
import pytest
import torch

from data_provider.data_factory import SeededSubset, data_provider
from helpers import assert_ok, make_args, make_experiment, records, run_cli, run_on_ranks
from utils.progress import EvaluationProgress

SMALL = ["--synthetic_rows", 3000, "--seq_len", 48, "--label_len", 24, "--pred_len", 24]


def _test_subset(rank, world, argv):
    """This rank's windows of the --test_windows subset (their numbers in the split) and the test
    metrics, at two evaluation batch sizes."""
    args = make_args(*argv, "--ddp")
    exp = make_experiment(args)
    results = {}
    for batch in (7, 64):
        dataset, loader = data_provider(args.replace(eval_batch_size=batch), "test")
        shard = [int(i) for indices in loader.batch_indices() for i in dataset.positions[indices]]
        results[batch] = (shard, len(dataset), exp.evaluate(loader, "test").metrics())
    return results


def test_a_test_subset_is_the_same_windows_and_metrics_on_any_world_size():
    """The same N windows, shared out, and the same metrics to float rounding, on 1, 2 and 3 processes
    and at evaluation batches of 7 and 64."""
    argv = [*SMALL, "--test_windows", 90]
    (reference,) = run_on_ranks(_test_subset, 1, argv)
    ids, n, metrics = reference[7]
    assert n == 90 and ids == sorted(set(ids)) and max(ids) > 90  # distinct, in time order, from the whole split
    for world in (1, 2, 3):
        ranks = [reference] if world == 1 else run_on_ranks(_test_subset, world, argv)
        for batch in (7, 64):
            assert [i for r in ranks for i in r[batch][0]] == ids, (world, batch)  # the same windows, shared out
            for r in ranks:
                assert r[batch][2] == pytest.approx(metrics, rel=1e-6), (world, batch)


class ReadsBatchMates(torch.nn.Module):
    """A linear map over time minus half its batch's mean forecast: its output depends on which windows share
    its batch, as TSLib's TimesNet's (top periods from the batch's mean spectrum) does."""

    autoregressive = False

    def __init__(self, configs):
        super().__init__()
        self.time = torch.nn.Linear(configs.seq_len, configs.pred_len)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        out = self.time(x_enc.transpose(1, 2)).transpose(1, 2)
        return out - 0.5 * out.mean(0, keepdim=True)


def _evaluation_batches(rank, world, argv):
    """This rank's test batches (window numbers) and the test metrics of ReadsBatchMates, at evaluation
    batches of 7 and 64."""
    from unittest import mock

    args = make_args(*argv, "--ddp")
    with mock.patch("exp.settings.get_model_class", return_value=ReadsBatchMates):
        exp = make_experiment(args)
    results = {}
    for batch in (7, 64):
        _, loader = data_provider(args.replace(eval_batch_size=batch), "test")
        results[batch] = ([b.tolist() for b in loader.batch_indices()], exp.evaluate(loader, "test").metrics())
    return results


def test_each_evaluation_batch_holds_the_windows_it_holds_on_one_process():
    """Ranks take whole evaluation batches: on 2 and 3 processes the batches are one process's, dealt out, so a
    model that reads its batch-mates scores alike on any number of processes at the same --eval_batch_size."""
    argv = [*SMALL, "--test_windows", 150]
    (reference,) = run_on_ranks(_evaluation_batches, 1, argv)
    for world in (2, 3):
        ranks = run_on_ranks(_evaluation_batches, world, argv)
        for batch in (7, 64):
            assert [b for r in ranks for b in r[batch][0]] == reference[batch][0], (world, batch)
            for r in ranks:
                assert r[batch][1] == pytest.approx(reference[batch][1], rel=1e-9), (world, batch)


def _univariate(folder):
    """Three series of 400, 300 and 250 rows; value = 1000 x series number + row, so a window shows
    which series and rows it came from."""
    for i, rows in enumerate((400, 300, 250), start=1):
        np.save(folder / f"s{i}.npy", 1000 * i + np.arange(rows, dtype=float))
    return ["--data", "univariate", "--root_path", folder, "--data_path", "*.npy", "--scale", "false",
            "--features", "S", "--seq_len", 48, "--label_len", 24, "--pred_len", 24]


def _split(argv, flag="test"):
    args = make_args(*argv)
    args.autoregressive = False
    return data_provider(args, flag)[0]


def test_the_subset_is_n_windows_of_the_test_split_chosen_by_the_seed(tmp_path):
    """On univariate series (the test split is itself a selection of windows that do not cross series):
    N of the test split's windows, whole, from the seed alone; training and validation keep theirs."""
    argv = _univariate(tmp_path)
    split = _split(argv)
    subset = _split([*argv, "--test_windows", 25])
    assert isinstance(subset, SeededSubset) and len(subset) == 25 and subset.split_windows == len(split) > 25
    positions = subset.positions.tolist()
    assert positions == sorted(set(positions)) and 0 <= positions[0] and positions[-1] < len(split)
    everything = torch.arange(25)
    for got, expected in zip(subset.__getitems__(everything), split.__getitems__(torch.as_tensor(positions))):
        if expected is not None:
            torch.testing.assert_close(got, expected, rtol=0, atol=0)  # the split's own windows
    x, y = subset.__getitems__(everything)[:2]
    first = x[:, :1, 0]
    assert torch.equal(x[..., 0], first + torch.arange(48.0)) and torch.equal(y[..., 0], first + 24 + torch.arange(48.0))
    assert len({int(v) // 1000 for v in first.flatten()}) > 1  # drawn across the series, none crossing one
    assert _split([*argv, "--test_windows", 25]).positions.tolist() == positions  # seeded
    assert _split([*argv, "--test_windows", 25, "--seed", 7]).positions.tolist() != positions
    for flag in ("train", "val"):
        assert len(_split([*argv, "--test_windows", 25], flag)) == len(_split(argv, flag))


def test_a_subset_run_says_so_in_its_records_and_more_than_the_split_is_all(tmp_path):
    """metrics.json and results.jsonl hold the windows scored and the split's size, window_errors.csv
    numbers the split's windows, and the result line says the test was a subset; N past the split's
    size scores every window, as the run without it, and says so."""
    argv = ["--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--train_epochs", 1]
    full = run_cli(tmp_path / "full", *argv)
    subset = run_cli(tmp_path / "subset", *argv, "--test_windows", 50)
    more = run_cli(tmp_path / "more", *argv, "--test_windows", 100000)
    for proc in (full, subset, more):
        assert_ok(proc)
    (whole,), (part,), (all_of_it,) = (records(tmp_path / name) for name in ("full", "subset", "more"))
    split = whole["test_windows"]
    assert whole["test_split_windows"] == split and part["args"]["test_windows"] == 50
    assert (part["test_windows"], part["test_split_windows"]) == (50, split)
    assert f"(vali {part['vali_loss']:.6f}, 50 of the split's {split} windows, 1 processes)" in subset.stdout
    folder = tmp_path / "subset" / "results" / part["setting"]
    numbers = np.loadtxt(folder / "window_errors.csv", delimiter=",", skiprows=1)[:, 0]
    assert len(numbers) == 50 and numbers.max() > 50 and (np.diff(numbers) > 0).all()
    assert json.loads((folder / "metrics.json").read_text())["test_split_windows"] == split
    assert (all_of_it["test_windows"], all_of_it["mse"]) == (split, whole["mse"])
    assert f"--test_windows 100000: the test split holds {split} windows, all scored" in more.stdout
    assert part["mse"] != whole["mse"]


def test_the_report_never_pools_a_subset_test_with_full_tests():
    from benchmarks.report import summarise

    def record(seed, mse, **extra):
        args = {"data": "ETTh1", "seq_len": 96, "des": "Exp", "learning_rate": 1e-4, "batch_size": 32,
                "lradj": "type1", **extra}
        return {"model": "DLinear", "data": "ETTh1", "pred_len": 96, "seed": seed, "mse": mse, "mae": mse,
                "test_windows": 512 if extra else 2785, "test_split_windows": 2785, "args": args}

    rows, _ = summarise([record(1, 0.40), record(2, 0.42), record(1, 0.30, test_windows=512)])
    assert sorted((r["des"], r["seeds"]) for r in rows) == [("Exp", 2), ("Exp, test 512 of 2785 windows", 1)]


def test_the_test_subset_is_no_part_of_a_runs_identity():
    """Training runs the same whatever the test scores: a run resumes, or its checkpoint is evaluated,
    with another --test_windows."""
    from utils.checkpoint import IDENTITY_ARGS

    assert "test_windows" not in IDENTITY_ARGS and "val_windows" in IDENTITY_ARGS


# ------------------------------------------------------------------ progress of a long evaluation
class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_an_evaluation_shows_progress_only_once_it_runs_long():
    for quiet_s, shown in ((1e9, False), (0.0, True)):
        lines, terminal = io.StringIO(), _Terminal()
        for stream, mode in ((lines, "lines"), (terminal, "bar")):
            progress = EvaluationProgress("test", 20, mode, stream=stream, quiet_s=quiet_s, every_s=1e9)
            for _ in range(20):
                progress.update()
            progress.close()
        assert bool(lines.getvalue()) == shown and bool(terminal.getvalue()) == shown
    assert lines.getvalue().startswith("  test: 1/20 batches, ") and lines.getvalue().count("\n") == 1
    assert "test:" in terminal.getvalue() and "/20 [" in terminal.getvalue()  # a tqdm bar


def test_a_long_evaluation_shows_progress_on_rank_0_alone_and_not_when_quiet(tmp_path, monkeypatch):
    """Every evaluation of a run counts as long here: one line each (two validations and two tests:
    the epoch's end and the final test), from rank 0 only; nothing with --quiet or in a short run."""
    argv = ["--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--train_epochs", 1,
            "--ddp"]
    short = run_cli(tmp_path / "short", *argv, nproc=2)
    monkeypatch.setenv("TSL_EVALUATION_QUIET_S", "0")
    long = run_cli(tmp_path / "long", *argv, nproc=2)
    quiet = run_cli(tmp_path / "quiet", *argv, "--quiet", nproc=2)
    for proc in (short, long, quiet):
        assert_ok(proc)
    shown = [line.split(":")[0].strip() for line in long.stderr.splitlines() if " batches, " in line]
    assert shown == ["val", "test", "val", "test"], long.stderr[-2000:]
    assert " batches, " not in short.stderr + quiet.stderr
