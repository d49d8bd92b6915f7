"""The GIFT-Eval harness (benchmarks/gift_eval.py, issue 42): GIFT-Eval's rules, its all_results.csv equal to
gluonts' evaluate_model on fixed forecasts (tests/golden/gift_eval/, written by lab/gift_eval_reference.py
in a gluonts venv), the same CSV on 1, 2 and 3 gloo processes and any batch size, resuming, point forecasts,
and bad inputs. Data sets are small synthetic ones in GIFT-Eval's layout (Arrow, as save_to_disk writes it)."""
import csv
import io
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from benchmarks import gift_eval, gift_eval_data as data, gift_eval_scores as scores  # noqa: E402
from helpers import TORCHRUN_LOG_LINE, run_command, run_on_ranks  # noqa: E402
from utils.errors import UserError  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden" / "gift_eval"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())["configurations"]


def golden_arrays():
    with np.load(GOLDEN / "fixtures.npz") as npz:
        return {k: npz[k] for k in npz.files}


def write_golden_sets(root, arrays):
    for name, freq in (("hospital", "M"), ("ett1/H", "H")):
        prefix = f"series__{name.replace('/', '__')}__"
        targets = [arrays[f"{prefix}{i}"] for i in range(sum(k.startswith(prefix) for k in arrays))]
        data.write_dataset(root / name, freq, targets)


def write_synthetic_sets(root):
    """Several frequencies, NaN gaps, a multivariate set, series shorter than a season, an m4 set."""
    rng = np.random.default_rng(0)

    def wave(n, period, level=10.0):
        return level + 3 * np.sin(2 * np.pi * np.arange(n) / period) + rng.normal(0, 0.5, n)

    hourly = [wave(1100, 24), wave(800, 24), wave(900, 24)]
    hourly[0][100:105] = np.nan
    hourly[1][-10] = np.nan
    data.write_dataset(root / "electricity/H", "H", hourly)
    data.write_dataset(root / "ett1/15T", "15T", [np.stack([wave(1000, 96, lv) for lv in (1, 5, 20)])
                                                  for _ in range(2)])
    data.write_dataset(root / "hospital", "M", [wave(80, 12), wave(30, 12), wave(20, 12)])
    data.write_dataset(root / "m4_weekly", "W-SUN", [wave(60, 52), wave(100, 52)])


SYNTHETIC = ["electricity/H", "ett1/15T", "hospital", "m4_weekly"]


def harness_args(root, out, *extra):
    return gift_eval.parse_args(["--data_root", str(root), "--out", str(out), *map(str, extra)])


def csv_rows(path):
    return list(csv.DictReader(io.StringIO(Path(path).read_text())))


def test_rules_are_gift_evals():
    assert len(data.configurations()) == 97 and len(data.SHORT) == 55 and len(data.MED_LONG) == 21
    for name, freq, term, length in (("electricity/15T", "15T", "short", 48), ("solar/10T", "10T", "medium", 480),
                                     ("bizitobs_service", "10S", "long", 900), ("hospital", "M", "short", 12),
                                     ("hierarchical_sales/W", "W-WED", "short", 8), ("m4_yearly", "A-DEC", "short", 6),
                                     ("m4_hourly", "H", "short", 48), ("saugeenday/D", "D", "short", 30),
                                     ("m4_quarterly", "Q-DEC", "short", 8), ("us_births/M", "MS", "short", 12)):
        assert data.prediction_length(name, freq, term) == length, name
    assert data.windows("m4_daily", 10_000, 14) == 1
    assert [data.windows("x", n, 48) for n in (10, 480, 481, 960, 100_000)] == [1, 1, 2, 2, 20]
    assert data.csv_name("saugeenday/D", "short") == "saugeen/D/short"
    assert data.csv_name("kdd_cup_2018_with_missing/H", "long") == "kdd_cup_2018/H/long"
    assert data.csv_name("bizitobs_application", "medium") == "bizitobs_application/10S/medium"
    with pytest.raises(UserError, match="frequency 'B' is not one GIFT-Eval defines"):
        data.prediction_length("electricity/B", "B", "short")
    with pytest.raises(UserError, match="frequency 'Q' is not one"):
        data.prediction_length("solar/Q", "Q", "short")  # quarters: only the m4 sets


def test_the_baselines_are_statsforecasts(tmp_path):
    """Seasonal naive and naive with their nine quantiles equal statsforecast's SeasonalNaive and Naive (GIFT-Eval's
    reference rows) on committed figures (lab/gift_eval_statsforecast.py, in its own venv)."""
    cases = json.loads((GOLDEN / "statsforecast.json").read_text())["cases"]
    for case in cases:
        for name in ("naive", "seasonal_naive"):
            _, quantiles = gift_eval.baseline_forecasts(gift_eval.BASELINES[name], [np.array(case["history"])],
                                                        case["horizon"], case["season"])
            np.testing.assert_allclose(quantiles[0], np.array(case[name]), rtol=1e-12, atol=1e-12,
                                       err_msg=f"{name} {len(case['history'])} {case['season']}")


def fixed_forecasts(arrays, point_only=False):
    """A forecast_batch returning the golden forecasts of each window (looked up by series and start)."""
    index = {c: {tuple(k): i for i, k in enumerate(e["instances"])} for c, e in EXPECTED.items()}

    def forecast_batch(args, histories, config, keys):
        key = config["csv"].replace("/", "__")
        rows = [index[config["csv"]][k] for k in keys]
        mean, quantiles = arrays[f"{key}__mean"][rows], arrays[f"{key}__quantiles"][:, rows].swapaxes(0, 1)
        return (mean, None, 0) if point_only else (mean, quantiles, 0)
    return forecast_batch


@pytest.fixture
def golden_run(tmp_path, monkeypatch):
    arrays = golden_arrays()
    write_golden_sets(tmp_path / "data", arrays)
    monkeypatch.setitem(gift_eval.BASELINES, "fixed", None)

    def run(point_only=False):
        monkeypatch.setattr(gift_eval, "forecast_batch", fixed_forecasts(arrays, point_only))
        out = tmp_path / ("point" if point_only else "fixed")
        gift_eval.run(harness_args(tmp_path / "data", out, "--model", "fixed", "--datasets", "hospital", "ett1/H",
                                   "--terms", "short,medium", "--batch_size", 5))
        return csv_rows(out / "all_results.csv")
    return run


def test_all_results_equal_gluonts_evaluate_model(golden_run):
    """Every column of every configuration within 1e-9 of gluonts' figure, and the same windows."""
    rows = golden_run()
    assert [r["dataset"] for r in rows] == ["hospital/M/short", "ett1/H/short", "ett1/H/medium"]
    assert list(rows[0]) == gift_eval.CSV_HEADER and len(gift_eval.CSV_HEADER) == 15
    for row in rows:
        expected = EXPECTED[row["dataset"]]
        for column in scores.COLUMNS:
            assert float(row[f"eval_metrics/{column}"]) == pytest.approx(expected["figures"][column], rel=1e-9,
                                                                          abs=0), (row["dataset"], column)
    arrays = golden_arrays()
    for c, e in EXPECTED.items():  # the harness's rules give gluonts' windows, in its order
        key, freq, term = c.split("/")
        name = "ett1/H" if key == "ett1" else key
        prefix = f"series__{name.replace('/', '__')}__"
        series = data.univariate_series({"target": [arrays[f"{prefix}{i}"] for i in range(
            sum(k.startswith(prefix) for k in arrays))]})
        assert gift_eval.seasonality(freq) == e["seasonality"]
        horizon = data.prediction_length(name, freq, term)
        n_windows = data.windows(name, min(len(s) for s in series), horizon)
        assert [[s, t] for s, _, t in data.instances(series, horizon, n_windows)] == e["instances"], c
    assert rows[0]["domain"] == "Healthcare" and rows[1]["num_variates"] == "7"


def test_a_point_forecast_leaves_crps_and_msis_empty(golden_run, capsys):
    rows = golden_run(point_only=True)
    assert "warning: fixed gives point forecasts" in capsys.readouterr().err
    for row in rows:
        assert row["eval_metrics/mean_weighted_sum_quantile_loss"] == "" and row["eval_metrics/MSIS"] == ""
        assert float(row["eval_metrics/MASE[0.5]"]) > 0


def _run_on_rank(rank, world_size, root, out, batch_size):
    gift_eval.run(harness_args(root, out, "--model", "naive", "--batch_size", batch_size, "--datasets", *SYNTHETIC))
    return (Path(out) / "all_results.csv").read_text() if rank == 0 else None


def test_the_same_csv_on_1_2_3_processes_and_any_batch_size(tmp_path):
    write_synthetic_sets(tmp_path / "data")
    texts = []
    for processes, batch_size in ((1, 512), (1, 1), (2, 3), (3, 2)):
        out = tmp_path / f"out{processes}_{batch_size}"
        if processes == 1:
            texts.append(_run_on_rank(0, 1, tmp_path / "data", out, batch_size))
        else:
            texts.append(run_on_ranks(_run_on_rank, processes, tmp_path / "data", out, batch_size)[0])
    assert all(t == texts[0] for t in texts)
    rows = csv_rows(tmp_path / "out1_512" / "all_results.csv")
    assert len(rows) == 8 and all(math.isfinite(float(r["eval_metrics/mean_weighted_sum_quantile_loss"]))
                                  for r in rows)


def test_a_killed_run_resumes_at_the_next_unfinished_configuration(tmp_path, capsys):
    write_synthetic_sets(tmp_path / "data")
    args = ("--model", "seasonal_naive", "--datasets", "hospital", "m4_weekly")
    gift_eval.run(harness_args(tmp_path / "data", tmp_path / "out", *args))
    first = (tmp_path / "out" / "all_results.csv").read_text()
    done = sorted((tmp_path / "out" / "configurations").iterdir())
    assert len(done) == 2
    done[1].unlink()  # as if killed before its second configuration was written
    (tmp_path / "out" / "all_results.csv").unlink()
    capsys.readouterr()
    gift_eval.run(harness_args(tmp_path / "data", tmp_path / "out", *args))
    assert (tmp_path / "out" / "all_results.csv").read_text() == first
    scored = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert len(scored) == 1 and done[1].stem.replace("__", "/") in scored[0]
    with pytest.raises(UserError, match="holds another run's result"):
        gift_eval.run(harness_args(tmp_path / "data", tmp_path / "out", "--model", "naive", "--model_name",
                                   "seasonal_naive", "--datasets", "hospital"))


def test_a_result_stored_for_other_data_is_scored_again_on_resume(tmp_path, capsys):
    """A configuration's stored result names the data set it was computed on (its files' sha256): after the data
    under --data_root changed, the same command scores it again, equal to a fresh run's, and keeps the others."""
    write_synthetic_sets(tmp_path / "data")
    args = ("--model", "seasonal_naive", "--datasets", "hospital", "m4_weekly")
    gift_eval.run(harness_args(tmp_path / "data", tmp_path / "out", *args))
    before = {r["dataset"]: r for r in csv_rows(tmp_path / "out" / "all_results.csv")}
    rng = np.random.default_rng(5)
    data.write_dataset(tmp_path / "data" / "hospital", "M", [rng.normal(100, 30, 80), rng.normal(50, 9, 40)])
    capsys.readouterr()
    gift_eval.run(harness_args(tmp_path / "data", tmp_path / "out", *args))
    out = capsys.readouterr().out
    assert "hospital/M/short: its stored result was computed on other data (data set sha256 " in out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("[")] == ["[2/2] hospital/M/short"]
    gift_eval.run(harness_args(tmp_path / "data", tmp_path / "fresh", *args))
    after = (tmp_path / "out" / "all_results.csv").read_text()
    assert after == (tmp_path / "fresh" / "all_results.csv").read_text()
    rows = {r["dataset"]: r for r in csv_rows(tmp_path / "out" / "all_results.csv")}
    assert rows["m4_weekly/W/short"] == before["m4_weekly/W/short"]
    assert rows["hospital/M/short"]["eval_metrics/MSE[0.5]"] != before["hospital/M/short"]["eval_metrics/MSE[0.5]"]
    # a result from before results named their data is scored again too
    stored = tmp_path / "out" / "configurations" / "m4_weekly__W__short.json"
    result = json.loads(stored.read_text())
    del result["config"]["data_sha256"]
    stored.write_text(json.dumps(result))
    capsys.readouterr()
    gift_eval.run(harness_args(tmp_path / "data", tmp_path / "out", *args))
    assert "m4_weekly/W/short: its stored result was computed on data it does not name" in capsys.readouterr().out
    assert (tmp_path / "out" / "all_results.csv").read_text() == after


def test_relative_scores_of_seasonal_naive_are_one(tmp_path, capsys):
    write_synthetic_sets(tmp_path / "data")
    gift_eval.run(harness_args(tmp_path / "data", tmp_path / "out", "--model", "seasonal_naive", "--datasets",
                               "hospital", "ett1/15T", "--model_type", "statistical", "--org", "us"))
    table = capsys.readouterr().out.split("geometric mean relative to seasonal naive")[1].splitlines()
    assert [line.split()[:2] for line in table[1:]] == [
        ["overall", "1.0000"], ["term", "short"], ["term", "medium"], ["term", "long"], ["domain", "Healthcare"],
        ["domain", "Energy"], ["frequency", "M"], ["frequency", "15T"]]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert set(config) == {"model", "model_type", "model_dtype", "model_link", "code_link", "org",
                           "testdata_leakage", "replication_code_available"} and config["org"] == "us"


def _refused(proc, message, out):
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.parametrize("case,processes", [("not a GIFT-Eval folder", 1), ("undefined frequency", 1),
                                            ("unknown data set", 1), ("not a GIFT-Eval folder", 2)])
def test_bad_inputs_get_one_line_and_nothing_is_written(tmp_path, case, processes):
    write_synthetic_sets(tmp_path / "data")
    datasets = ["hospital", "electricity/H"]
    if case == "not a GIFT-Eval folder":
        (tmp_path / "data" / "electricity/H" / "state.json").unlink()
        message = "electricity/H is not a GIFT-Eval data set: no state.json"
    elif case == "undefined frequency":
        data.write_dataset(tmp_path / "data" / "electricity/H", "B", [np.ones(500)])
        message = "frequency 'B' is not one GIFT-Eval defines a prediction length for"
    else:
        datasets = ["hospital", "electricity/2H"]
        message = "--datasets: electricity/2H is not one of GIFT-Eval's 55 data sets"
    out = tmp_path / "out"
    launch = [] if processes == 1 else ["-m", "utils.launch", "--nproc_per_node", str(processes)]
    ddp = [] if processes == 1 else ["--ddp"]
    proc = run_command([sys.executable, *launch, "-m", "benchmarks.gift_eval", *ddp, "--model", "seasonal_naive",
                        "--data_root", str(tmp_path / "data"), "--out", str(out), "--datasets", *datasets,
                        "--num_threads", "1"])
    _refused(proc, message, out)
    assert not TORCHRUN_LOG_LINE.search(proc.stderr), proc.stderr[-2000:]


def _dlinear_checkpoint(path):
    """A DLinear (seq_len 32, pred_len 8) with seeded weights, saved as run.py saves a trained one."""
    import torch

    from exp.settings import build_model, resolve_args
    from utils.arguments import parse_args

    args = resolve_args(parse_args(["--model", "DLinear", *DLINEAR, "--data", "synthetic", "--features", "S",
                                    "--synthetic_rows", "2000", "--num_threads", "1"]), 1)
    torch.manual_seed(0)
    model = build_model(args)
    torch.save(model.state_dict(), path)
    return model, path


DLINEAR = ["--seq_len", "32", "--label_len", "0", "--pred_len", "8"]


def _run_model_on_rank(rank, world_size, root, out, checkpoint, batch_size):
    gift_eval.run(harness_args(root, out, "--model", "DLinear", "--checkpoint", checkpoint, *DLINEAR, "--batch_size",
                               batch_size, "--datasets", "hospital", "m4_weekly", "--num_threads", 1))
    return (Path(out) / "all_results.csv").read_text() if rank == 0 else None


def test_a_trained_zoo_model_forecasts_as_its_forward_and_is_exact_on_2_processes(tmp_path):
    """A direct model with fixed weights: the context standardised, left-padded, rolled out past its pred_len."""
    import torch

    from benchmarks.gift_eval_models import ModelForecaster

    write_synthetic_sets(tmp_path / "data")
    model, checkpoint = _dlinear_checkpoint(tmp_path / "dlinear.pth")
    history = np.concatenate([[np.nan], np.arange(20.0) % 5 + 1])  # shorter than seq_len, a NaN first
    point, quantiles, crossed = ModelForecaster(["--model", "DLinear", "--checkpoint", checkpoint, *DLINEAR],
                                                1).forecast([history], 12, gift_eval.impute)
    context = np.concatenate([np.ones(11), np.ones(1), np.arange(20.0) % 5 + 1])  # filled, padded with the first
    loc, scale = context.mean(), context.std()
    with torch.no_grad():
        first = model.eval()(torch.tensor((context - loc) / scale, dtype=torch.float32)[None, :, None],
                             None, None, None)[0, :, 0].double()
        rolled = np.concatenate([(context[8:] - loc) / scale, first.numpy()]).astype(np.float32)
        second = model(torch.tensor(rolled)[None, :, None], None, None, None)[0, :4, 0].double()
    assert quantiles is None and crossed == 0
    np.testing.assert_allclose(point[0], np.concatenate([first.numpy(), second.numpy()]) * scale + loc, rtol=1e-6)
    # the same batches on 1 and 2 processes: the same CSV; another batch size: float32 rounding apart
    one = _run_model_on_rank(0, 1, tmp_path / "data", tmp_path / "one", checkpoint, 2)
    assert run_on_ranks(_run_model_on_rank, 2, tmp_path / "data", tmp_path / "two", checkpoint, 2)[0] == one
    _run_model_on_rank(0, 1, tmp_path / "data", tmp_path / "big", checkpoint, 512)
    for a, b in zip(csv_rows(tmp_path / "one" / "all_results.csv"), csv_rows(tmp_path / "big" / "all_results.csv")):
        assert a["eval_metrics/mean_weighted_sum_quantile_loss"] == a["eval_metrics/MSIS"] == ""  # a point model
        assert float(a["eval_metrics/MASE[0.5]"]) == pytest.approx(float(b["eval_metrics/MASE[0.5]"]), rel=1e-6)


def test_the_csv_of_a_model_is_byte_identical_on_1_and_2_processes_with_the_default_threads(tmp_path):
    """A DLinear (--loss quantile) sums its float32 forward in another order on 2 threads than on 1; the
    harness's default is one thread per process on any world size (utils.threads.same_on_any_world_size), so
    `python -m benchmarks.gift_eval` alone (2 cores here) and under utils.launch on 2 processes write the same
    CSV, with nothing about threads said (no OMP_NUM_THREADS in the environment)."""
    import torch

    from exp.settings import build_model, resolve_args
    from utils.arguments import parse_args

    write_synthetic_sets(tmp_path / "data")
    shape = ["--seq_len", "96", "--label_len", "48", "--pred_len", "48", "--loss", "quantile"]
    args = resolve_args(parse_args(["--model", "DLinear", *shape, "--data", "synthetic", "--features", "S",
                                    "--synthetic_rows", "2000"]), 1)
    torch.manual_seed(0)
    torch.save(build_model(args).state_dict(), tmp_path / "dlinear.pth")
    harness = ["-m", "benchmarks.gift_eval", "--model", "DLinear", "--checkpoint", str(tmp_path / "dlinear.pth"),
               *shape, "--data_root", str(tmp_path / "data"), "--datasets", "electricity/H", "ett1/15T",
               "--terms", "short", "--batch_size", "8"]
    texts = []
    for processes in (1, 2):
        out = tmp_path / f"out{processes}"
        launch = [] if processes == 1 else ["-m", "utils.launch", "--nproc_per_node", "2"]
        proc = run_command([sys.executable, *launch, *harness, *(["--ddp"] if processes > 1 else []),
                            "--out", str(out)], extra_env={"OMP_NUM_THREADS": None})
        assert proc.returncode == 0, proc.stderr[-3000:]
        texts.append((out / "all_results.csv").read_text())
    assert texts[0] == texts[1]


def crossing_release():
    """A release of tests/test_foundation.py's table built by its package, with GIFT-Eval's nine levels, whose
    random weights forecast crossing quantiles (its package keeps them as forecast): the first such row."""
    from test_foundation import LEVELS_9, RELEASES, needs, own_tests

    row = next(row for row in RELEASES.values() if row.package and list(row.levels) == LEVELS_9 == list(scores.LEVELS)
               and not getattr(own_tests(needs(row)), "QUANTILES_SORTED_NON_NEGATIVE", False))
    return row


def test_a_zero_shot_foundation_model_gives_quantiles(tmp_path):
    from test_foundation import released_folder

    row = crossing_release()
    write_synthetic_sets(tmp_path / "data")
    folder = released_folder(row, tmp_path / "release")
    gift_eval.run(harness_args(tmp_path / "data", tmp_path / "out", "--model", row.name, "--pretrain_model_path",
                               folder, "--seq_len", 64, "--datasets", "hospital", "m4_weekly", "--num_threads", 1))
    rows = csv_rows(tmp_path / "out" / "all_results.csv")
    assert [r["dataset"] for r in rows] == ["m4_weekly/W/short", "hospital/M/short"]
    assert all(float(r["eval_metrics/mean_weighted_sum_quantile_loss"]) > 0 and float(r["eval_metrics/MSIS"]) > 0
               for r in rows)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "zero-shot"
    # run.py's rule: the release's quantiles as its package's pipeline returns them (here they cross), counted
    for path in (tmp_path / "out" / "configurations").iterdir():
        result = json.loads(path.read_text())
        assert result["quantile_order"] == "as forecast" and result["quantiles_crossed"] > 0, path.name


def test_a_releases_quantiles_are_its_packages_pipeline_on_the_raw_history(tmp_path, monkeypatch):
    """What the harness scores for a released model: the package's predict_quantiles of the raw context (a
    non-negative one here, whose quantiles cross), not re-sorted; the crossings counted."""
    import torch

    from benchmarks.gift_eval_models import ModelForecaster
    from test_foundation import own_tests, released_folder

    row = crossing_release()
    folder = released_folder(row, tmp_path / "release")
    rng = np.random.default_rng(3)
    history = np.maximum(0.0, 4 * np.sin(np.arange(90) / 3) + rng.normal(0, 2, 90))
    point, quantiles, crossed = ModelForecaster(["--model", row.name, "--pretrain_model_path", folder,
                                                 "--seq_len", 64], 1).forecast([history], 16, gift_eval.impute)
    window = torch.tensor(history[-64:], dtype=torch.float32)[None, :, None]  # [1, 64, 1]
    with torch.no_grad():
        theirs = own_tests(row).zero_shot_quantiles(folder, window, 16, monkeypatch)[0, :, 0]  # [16, 9]
    np.testing.assert_allclose(quantiles[0].T, theirs.double().numpy(), rtol=1e-5, atol=1e-6)
    median = theirs[:, list(scores.LEVELS).index(0.5)]
    np.testing.assert_allclose(point[0], median.double().numpy(), rtol=1e-5, atol=1e-6)
    assert crossed == int((theirs[:, 1:] < theirs[:, :-1]).any(-1).sum()) > 0


def test_a_quantile_model_gives_gift_evals_nine_of_its_levels(tmp_path):
    """A DLinear trained with --loss quantile at the default 13 levels: the nine GIFT-Eval scores are picked by
    level (not position), sorted as the test reads them, and mapped back from the standardised context."""
    import torch

    from benchmarks.gift_eval_models import ModelForecaster
    from exp.settings import build_model, resolve_args
    from utils.arguments import parse_args

    argv = ["--model", "DLinear", *DLINEAR, "--loss", "quantile"]
    args = resolve_args(parse_args([*argv, "--data", "synthetic", "--features", "S", "--synthetic_rows", "2000"]), 1)
    torch.manual_seed(1)
    model = build_model(args).eval()
    torch.save(model.state_dict(), tmp_path / "q.pth")
    history = np.sin(np.arange(40.0) / 3) * 5 + 20
    point, quantiles, crossed = ModelForecaster([*argv, "--checkpoint", tmp_path / "q.pth"], 1).forecast(
        [history], 8, gift_eval.impute)
    context = history[-32:]
    loc, scale = context.mean(), context.std()
    with torch.no_grad():
        out = model(torch.tensor((context - loc) / scale, dtype=torch.float32)[None, :, None], None, None, None)
    levels = [float(q) for q in args.quantiles.split(",")]
    blocks = out[0, :, 0].reshape(len(levels), 8).T  # [8, 13]: the widened blocks
    assert crossed == int((blocks[:, 1:] < blocks[:, :-1]).any(-1).sum()) > 0  # counted before they are sorted
    ours = blocks.sort(-1).values.double().numpy()
    expected = ours[:, [levels.index(q) for q in scores.LEVELS]] * scale + loc
    np.testing.assert_allclose(quantiles[0].T, expected, rtol=1e-6)
    np.testing.assert_allclose(point[0], expected[:, 4], rtol=1e-6)


def test_seasonal_naive_rows_equal_gift_evals_own_pipeline(tmp_path):
    """GIFT-Eval's Dataset, its notebook's statsforecast SeasonalNaive predictor and gluonts' evaluate_model, run
    by lab/gift_eval_official.py on its synthetic sets (NaN gaps, multivariate, m4, 10-second data; 11
    configurations): the harness's rows agree to float32 rounding (measured: at most 2.9e-7 relative, MSIS)."""
    from lab.gift_eval_official import synthetic_sets

    official = json.loads((GOLDEN / "official.json").read_text())["rows"]
    sets = synthetic_sets()
    for name, (freq, targets) in sets.items():
        data.write_dataset(tmp_path / "data" / name, freq, targets)
    gift_eval.run(harness_args(tmp_path / "data", tmp_path / "out", "--model", "seasonal_naive", "--datasets", *sets))
    rows = csv_rows(tmp_path / "out" / "all_results.csv")
    assert len(rows) == len(official) == 11
    names = {data.csv_name(name, term): f"{name}|{term}" for name in sets for term in data.TERMS}
    for row in rows:
        expected = official[names[row["dataset"]]]
        for column in scores.COLUMNS:
            assert float(row[f"eval_metrics/{column}"]) == pytest.approx(expected[column], rel=1e-6), \
                (row["dataset"], column)


# ------------------------------------------------------------------ the device: run.py's options and choice
@pytest.mark.parametrize("given,use_gpu,gpu", [([], True, None), (["--use_gpu", "false"], False, None),
                                               (["--no_use_gpu"], False, None), (["--use_gpu"], True, None),
                                               (["--gpu", "1"], True, 1)])
def test_the_device_options_parse_as_run_pys(tmp_path, given, use_gpu, gpu):
    """--use_gpu / --no_use_gpu / --gpu are run.py's (utils.arguments.add_device_arguments), for a baseline too,
    and are not handed on as the model's run arguments (a stored result's identity does not name the device)."""
    from utils.arguments import parse_args as run_parse_args

    for model in ("seasonal_naive", "DLinear"):
        args = harness_args(tmp_path, tmp_path / "out", "--model", model, *given)
        assert (args.use_gpu, args.gpu, args.run_argv, args.device) == (use_gpu, gpu, [], None)
    ran = run_parse_args(["--model", "DLinear", *given])
    assert (ran.use_gpu, ran.gpu) == (use_gpu, gpu)


def _main_in_process(monkeypatch, argv):
    """gift_eval.main here, its exit code returned (main ends its process otherwise)."""
    from utils import distributed, worker

    codes = []
    monkeypatch.setattr(worker, "die_with_launcher", lambda: None)
    monkeypatch.setattr(distributed, "exit_process", codes.append)
    gift_eval.main([str(a) for a in argv])
    return codes[0]


def test_a_gpu_the_machine_lacks_is_refused_with_run_pys_line(tmp_path, monkeypatch, capsys):
    """One CUDA GPU shown (monkeypatched): --gpu 2 is refused by run.py's device choice (utils.distributed.setup),
    the same line from the harness and from run.py; --gpu under --ddp with run.py's line too. Without CUDA,
    --use_gpu falls back to the CPU as run.py does: test_a_model_forecasts_on_the_cpu_without_cuda."""
    import torch

    import run as run_py

    write_synthetic_sets(tmp_path / "data")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    harness = ["--model", "DLinear", "--checkpoint", tmp_path / "dlinear.pth", *DLINEAR, "--data_root", tmp_path / "data",
               "--out", tmp_path / "out", "--datasets", "hospital", "--num_threads", 1]
    assert _main_in_process(monkeypatch, [*harness, "--gpu", 2]) == 2
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert run_py.main([str(a) for a in ("--model", "DLinear", "--data", "synthetic", "--synthetic_rows", 1000, "--gpu",
                                         2, "--num_threads", 1, "--checkpoints", tmp_path / "ck", "--results_dir",
                                         tmp_path / "r")]) == 2
    assert line == [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert line == ["error: --gpu 2 is not a GPU of this machine: it shows 1 GPU(s), numbered 0 to 0; choose one of "
                    "those"]
    assert _main_in_process(monkeypatch, [*harness, "--ddp", "--gpu", 0]) == 2
    assert [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")] == [
        "error: --gpu 0 picks the GPU of a single-process run; under --ddp each process uses the GPU of its "
        "LOCAL_RANK: drop --gpu (set CUDA_VISIBLE_DEVICES to choose which GPUs the job sees)"]
    assert not (tmp_path / "out").exists()


def test_a_model_forecasts_on_the_cpu_without_cuda(tmp_path):
    """No CUDA here: --use_gpu (the default) and --gpu 3 compute on the CPU, as run.py's device choice does, and
    write the CSV that --use_gpu false writes, byte for byte."""
    write_synthetic_sets(tmp_path / "data")
    _, checkpoint = _dlinear_checkpoint(tmp_path / "dlinear.pth")
    texts = []
    for device in (["--use_gpu", "false"], ["--use_gpu", "--gpu", "3"]):
        out = tmp_path / "_".join(device).strip("-")
        proc = run_command([sys.executable, "-m", "benchmarks.gift_eval", "--model", "DLinear", "--checkpoint",
                            str(checkpoint), *DLINEAR, "--data_root", str(tmp_path / "data"), "--out", str(out),
                            "--datasets", "hospital", "--num_threads", "1", *device])
        assert proc.returncode == 0, proc.stderr[-2000:]
        texts.append((out / "all_results.csv").read_text())
    assert texts[0] == texts[1]


def test_the_model_and_its_inputs_are_on_the_device_setup_chose(tmp_path, monkeypatch, capsys):
    """The device distributed.setup returns (the meta device stands in for a GPU) reaches the model's weights,
    its input windows and exp.forward's device argument; the forecasts come back to the host to be scored.
    Planted: ModelForecaster leaving the model on the CPU, or the windows built on the CPU: fails here."""
    import torch

    import exp.forward
    from utils import distributed

    write_synthetic_sets(tmp_path / "data")
    _, checkpoint = _dlinear_checkpoint(tmp_path / "dlinear.pth")
    meta = torch.device("meta")
    chosen = []

    def setup(ddp, use_gpu, gpu, timeout_s, threads):
        chosen.append((ddp, use_gpu, gpu))
        return meta

    seen = []

    def forward(model, batch, args, stage, device):  # meta has no values: record where things are, then stop
        seen.append({next(model.parameters()).device, batch[0].device, batch[1].device, device})
        raise UserError("stopped where the model forecasts")

    monkeypatch.setattr(distributed, "setup", setup)
    monkeypatch.setattr(exp.forward, "forward", forward)
    code = _main_in_process(monkeypatch, ["--model", "DLinear", "--checkpoint", checkpoint, *DLINEAR, "--data_root",
                                          tmp_path / "data", "--out", tmp_path / "out", "--datasets", "hospital",
                                          "--num_threads", 1, "--gpu", 0])
    assert code == 2 and "error: stopped where the model forecasts" in capsys.readouterr().err
    assert chosen == [(False, True, 0)] and seen == [{meta}]
    # a baseline computes on the host: it takes no GPU (so it runs on as many processes as there are cores)
    monkeypatch.setattr(distributed, "setup", lambda ddp, use_gpu, *rest, **kw: chosen.append((ddp, use_gpu)))
    assert _main_in_process(monkeypatch, ["--model", "seasonal_naive", "--data_root", tmp_path / "data", "--out",
                                          tmp_path / "naive", "--datasets", "hospital", "--num_threads", 1]) == 0
    assert chosen[1:] == [(False, False)] and (tmp_path / "naive" / "all_results.csv").is_file()


def test_your_own_data_set_is_scored_under_its_own_name(tmp_path):
    """--dataset NAME=FOLDER: GIFT-Eval's rules on your data (its frequency read from it), reported as
    NAME/<freq>/<term>: the same figures as the same data scored under a GIFT-Eval name, with no --data_root."""
    write_synthetic_sets(tmp_path / "data")
    gift_eval.run(harness_args(tmp_path / "data", tmp_path / "gift", "--model", "naive", "--datasets", "hospital",
                               "ett1/15T", "--terms", "short"))
    gift_eval.run(gift_eval.parse_args(["--model", "naive", "--out", str(tmp_path / "own"), "--terms", "short",
                                        "--dataset", f"my_clinic={tmp_path / 'data' / 'hospital'}",
                                        "--dataset", f"plant.7={tmp_path / 'data' / 'ett1/15T'}"]))
    gift, own = csv_rows(tmp_path / "gift" / "all_results.csv"), csv_rows(tmp_path / "own" / "all_results.csv")
    assert [r["dataset"] for r in own] == ["my_clinic/M/short", "plant.7/15T/short"]
    assert [r["num_variates"] for r in own] == ["1", "3"] and all(r["domain"] == "" for r in own)
    by_name = {"hospital/M/short": "my_clinic/M/short", "ett1/15T/short": "plant.7/15T/short"}
    for g in gift:
        o = next(r for r in own if r["dataset"] == by_name[g["dataset"]])
        assert [g[c] for c in CSV_METRICS] == [o[c] for c in CSV_METRICS]


CSV_METRICS = [f"eval_metrics/{c}" for c in scores.COLUMNS]


@pytest.mark.parametrize("entry,message", [
    ("nofolder", "--dataset 'nofolder': give NAME=FOLDER"),
    ("a/b={data}/hospital", "--dataset 'a/b="),
    ("Hospital={data}/hospital", "--dataset Hospital: a name of GIFT-Eval's own data sets"),
    ("mine={data}/nowhere", "nowhere is not a GIFT-Eval data set: no state.json"),
])
def test_a_malformed_own_data_set_is_one_line(tmp_path, entry, message):
    write_synthetic_sets(tmp_path / "data")
    with pytest.raises(UserError) as caught:
        gift_eval.run(gift_eval.parse_args(["--model", "naive", "--out", str(tmp_path / "out"), "--dataset",
                                            entry.format(data=tmp_path / "data")]))
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()
