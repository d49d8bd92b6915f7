"""A probabilistic run's outputs (issue 38, item 5; exp/outputs.py, exp/scoring.py): forecast.csv's quantile
columns beside the median, window_errors.csv's per-window sums from which the metrics of any subset of windows
follow exactly (and the same file on 1 and 2 processes), forecast.png's bands, the result line and the report."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from exp.outputs import predict
from exp.scoring import subset_metrics, window_fields
from utils.metrics import ProbabilisticSums
from helpers import assert_ok, make_args, make_experiment, records, run_cli

SMALL = ["--model", "DLinear", "--data", "synthetic", "--synthetic_rows", 1000, "--synthetic_channels", 3,
         "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--num_threads", 1]
QUANTILE = [*SMALL, "--loss", "quantile", "--inverse"]
LEVELS = (0.05, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95)  # --quantiles' default
PROBABILISTIC = ("wql", "mase", "smape", "msis", "coverage_50", "coverage_80", "coverage_90")


@pytest.fixture(scope="module")
def quantile_run(tmp_path_factory):
    """One short quantile run with --inverse and its pictures; (folder, record, stdout, window_errors frame)."""
    tmp = tmp_path_factory.mktemp("quantile")
    proc = run_cli(tmp, *QUANTILE, "--train_epochs", 1, plots=True)
    assert_ok(proc)
    record = records(tmp)[-1]
    return tmp, record, proc.stdout + proc.stderr, _window_errors(tmp, record)


def _window_errors(tmp, record):
    return pd.read_csv(tmp / "results" / record["setting"] / "window_errors.csv")


def _columns(frame):
    return {name: frame[name].to_numpy() for name in frame.columns}


# ------------------------------------------------------------------ forecast.csv
@pytest.mark.parametrize("loss", [["--loss", "quantile"], ["--loss", "studentt", "--num_samples", 8]])
def test_forecast_csv_holds_sorted_quantiles_beside_the_median(tmp_path, loss, caplog):
    """An untrained model's raw quantile outputs cross; forecast.csv's never do. Each column is the median
    (equal to its q0.5 column), its quantiles follow in level order; a sampled forecast is drawn from the
    future's own key, so writing it again gives the same file. Planted: columns from the unsorted parameters,
    or levels written in reverse: this test fails."""
    exp = make_experiment(make_args(*SMALL, *loss, "--results_dir", tmp_path / "results", "--no_plots"))
    with caplog.at_level("INFO", logger="tsl"):
        written = predict(exp, "future")
    path = tmp_path / "results" / "future" / "forecast.csv"
    forecast = pd.read_csv(path)
    channels = ["x0", "x1", "OT"]
    assert list(forecast.columns) == ["date"] + [f"{c}{q}" for c in channels for q in ["", *(f"_q{v:g}" for v in LEVELS)]]
    for c in channels:
        quantiles = forecast[[f"{c}_q{v:g}" for v in LEVELS]].to_numpy()
        assert (np.diff(quantiles, axis=1) >= 0).all(), c
        assert np.array_equal(forecast[c].to_numpy(), forecast[f"{c}_q0.5"].to_numpy())
        assert (quantiles[:, -1] > quantiles[:, 0]).any()  # not one value in every column
    np.testing.assert_array_equal(forecast[channels].to_numpy(), written[channels].to_numpy())
    assert "quantiles 0.05 ... 0.95 (<column>_q<level>)" in caplog.text
    first = path.read_bytes()
    predict(exp, "future")
    assert path.read_bytes() == first  # sampled or not, the same file


def test_sampled_forecast_csv_comes_from_the_futures_key(tmp_path):
    """--num_samples draws forecast.csv's samples from window_keys(seed, "future", [0]): another seed draws others."""
    files = []
    for seed in (1, 2):
        exp = make_experiment(make_args(*SMALL, "--loss", "studentt", "--num_samples", 8, "--seed", 1,
                                        "--results_dir", tmp_path / "results", "--no_plots"))
        exp.args = exp.args.replace(seed=seed)  # the same weights, another sample stream
        predict(exp, f"s{seed}")
        files.append(pd.read_csv(tmp_path / "results" / f"s{seed}" / "forecast.csv"))
    assert not files[0]["OT_q0.1"].equals(files[1]["OT_q0.1"])
    assert files[0]["date"].equals(files[1]["date"])


# ------------------------------------------------------------------ window_errors.csv
def test_window_columns_reproduce_the_runs_metrics(quantile_run):
    """The sums of every window's columns give metrics.json's probabilistic metrics, on both scales, to 1e-9.
    Planted: a field left out of the rows, or the original scale's rows from the scaled truths: fails."""
    tmp, record, _, frame = quantile_run
    assert list(frame.columns[:3]) == ["window", "mse", "mae"]
    assert list(frame["window"]) == list(range(record["test_windows"]))
    for suffix in ("", "_orig"):
        metrics = subset_metrics(_columns(frame), suffix)
        assert metrics["wql_levels"] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
        for name in PROBABILISTIC:
            assert metrics[name] == pytest.approx(record[name + suffix], rel=1e-9, abs=1e-12), name + suffix
    assert 0 < record["coverage_50"] < record["coverage_90"] < 1


def test_each_row_holds_its_own_windows_sums(quantile_run):
    """Rows follow the windows: the first, a middle and the last row equal the sums of that window forecast
    alone here, so the metrics of any subset of windows are exact. Planted: the rows shifted by one window
    (their total unchanged, so the test above passes): this test fails."""
    from data_provider.data_factory import data_provider
    from exp.forward import forward
    from exp.scoring import series_scales
    from utils.checkpoint import load_weights
    from utils.probabilistic import objective_for

    tmp, record, _, frame = quantile_run
    exp = make_experiment(make_args(*QUANTILE, "--is_training", 0))
    load_weights(exp.raw_model, tmp / "checkpoints" / record["setting"] / "checkpoint.pth")
    dataset, _ = data_provider(exp.args, "test")
    picks = [0, len(dataset) // 2, len(dataset) - 1]
    with torch.no_grad():
        params, true = forward(exp.raw_model.eval(), dataset.__getitems__(picks), exp.args, "test", exp.device)
    quantiles = objective_for(exp.args).quantiles(params)
    expected = np.array([_alone(quantiles[i:i + 1], true[i:i + 1], series_scales(exp.args)[[pick]],
                                series_scales(exp.args, squared=True)[[pick]])
                         for i, pick in enumerate(picks)])
    names = [c for c in frame.columns[3:] if not c.endswith("_orig")]
    np.testing.assert_allclose(frame.loc[picks, names].to_numpy(), expected, rtol=1e-5, atol=1e-6)
    # and a subset's metrics are those of its windows alone: here the three picked
    three = subset_metrics(_columns(frame.loc[picks]))
    assert three["wql"] != pytest.approx(record["wql"], rel=1e-6)  # a subset, not the whole set
    alone = subset_metrics({name: expected[:, i] for i, name in enumerate(names)})
    for name in PROBABILISTIC:
        assert three[name] == pytest.approx(alone[name], rel=1e-5), name


def _alone(quantiles, true, scale, sq_scale):
    """One window's sums, scored by a ProbabilisticSums of that window alone."""
    sums = ProbabilisticSums(LEVELS)
    sums.update(quantiles, true, scale, sq_scale)
    sums.metrics()  # adds its pending sums into sums.sums
    return [sums.sums[k] for k in window_fields(LEVELS, True)]


def test_window_errors_are_the_same_file_on_1_and_2_processes(quantile_run, tmp_path):
    """The checkpoint scored on 2 processes (every rank's windows gathered on rank 0, in order) writes the
    1-process file, byte for byte. Planted: rank 0 writing only its own windows' rows: fails."""
    tmp, record, _, single = quantile_run
    checkpoint = tmp / "checkpoints" / record["setting"] / "checkpoint.pth"
    assert_ok(run_cli(tmp_path, *QUANTILE, "--is_training", 0, "--checkpoint", checkpoint, "--ddp", nproc=2))
    again = records(tmp_path)[-1]
    assert again["world_size"] == 2
    written = tmp_path / "results" / again["setting"] / "window_errors.csv"
    assert written.read_bytes() == (tmp / "results" / record["setting"] / "window_errors.csv").read_bytes()


def test_a_point_runs_window_errors_keep_their_three_columns(tmp_path):
    assert_ok(run_cli(tmp_path, *SMALL, "--train_epochs", 1))
    assert list(_window_errors(tmp_path, records(tmp_path)[-1]).columns) == ["window", "mse", "mae"]


# ------------------------------------------------------------------ forecast.png, result line, report
def test_forecast_png_and_result_line_of_a_quantile_run(quantile_run):
    tmp, record, output, _ = quantile_run
    assert (tmp / "results" / record["setting"] / "forecast.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "(median, 50 / 80 / 90 % bands)" in output
    assert (f"wql {record['wql']:.6f} mase {record['mase']:.6f} coverage_80 {record['coverage_80']:.6f}"
            in output)


def test_forecast_picture_draws_the_median_inside_its_bands(tmp_path, monkeypatch):
    """The bands hold the picked windows' quantiles on the original scale: 90 % around 80 % around 50 % around
    the median. Planted: a band's ends swapped, or the median from the unsorted parameters: fails."""
    from exp import outputs

    exp = make_experiment(make_args(*QUANTILE, "--results_dir", tmp_path / "results"))
    drawn = {}
    monkeypatch.setattr(outputs.plots, "plot_forecasts", lambda path, windows, *rest: drawn.setdefault("w", windows))
    outputs.draw_forecasts(exp, "picture")
    assert len(drawn["w"]) == 4
    for w in drawn["w"]:
        assert list(w["bands"]) == ["50 %", "80 %", "90 %"]
        median = np.array(w["forecast"])
        inner_lo = inner_hi = median
        for name in ("50 %", "80 %", "90 %"):
            lo, hi = map(np.array, w["bands"][name])
            assert (lo <= inner_lo).all() and (inner_hi <= hi).all() and (lo < hi).any(), name
            inner_lo, inner_hi = lo, hi


def test_plot_forecasts_draws_bands(tmp_path):
    from utils.plots import plot_forecasts

    window = {"history": [0.0, 1.0], "truth": [1.0, 2.0], "forecast": [1.1, 1.9], "label": "w",
              "bands": {"50 %": ([1.0, 1.7], [1.2, 2.1]), "90 %": ([0.5, 1.0], [1.6, 2.8])}}
    path = plot_forecasts(tmp_path / "f.png", [window], "title", "y")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_report_shows_the_probabilistic_metrics_beside_mse_and_mae(quantile_run, tmp_path, capsys):
    """A table with a quantile run gains WQL, MASE, sMAPE, MSIS and coverage columns ('-' for a point run's
    row); a table of point runs keeps its columns."""
    from benchmarks.report import CSV_FIELDS, MD_COLUMNS
    from benchmarks.report import main as report_main

    tmp, record, _, _ = quantile_run
    point = {k: v for k, v in record.items() if k not in PROBABILISTIC and k != "wql_levels"}
    point["args"] = dict(record["args"], loss="MSE")
    mixed = tmp_path / "mixed" / "results.jsonl"
    mixed.parent.mkdir()
    mixed.write_text(json.dumps(record) + "\n" + json.dumps(point) + "\n")
    assert report_main([str(mixed), "--reference", ""]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert head == [*MD_COLUMNS[:-1], "WQL", "MASE", "sMAPE", "MSIS", "coverage 50 / 80 / 90 %", "seeds"]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:4]]
    quantile_row = next(r for r in rows if r[head.index("WQL")] != "-")
    point_row = next(r for r in rows if r[head.index("WQL")] == "-")
    assert quantile_row[head.index("WQL")] == f"{record['wql']:.4f}"
    assert quantile_row[head.index("MASE")] == f"{record['mase']:.4f}"
    assert quantile_row[head.index("coverage 50 / 80 / 90 %")] == " / ".join(
        f"{record[f'coverage_{p}']:.3f}" for p in (50, 80, 90))
    assert point_row[head.index("coverage 50 / 80 / 90 %")] == "-"

    assert report_main([str(mixed), "--reference", "", "--format", "csv"]) == 0
    table = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert {"wql", "wql_std", "mase", "coverage_80", "coverage_90_std"} <= set(table.columns)
    assert sorted(table["wql"].dropna()) == [pytest.approx(record["wql"])]

    only_point = tmp_path / "point" / "results.jsonl"
    only_point.parent.mkdir()
    only_point.write_text(json.dumps(point) + "\n")
    assert report_main([str(only_point), "--reference", ""]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "| " + " | ".join(MD_COLUMNS) + " |"
    assert report_main([str(only_point), "--reference", "", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == ",".join(CSV_FIELDS)
