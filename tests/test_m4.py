"""M4 short-term forecasting (issue 42 item 3): TSLib's layout, windows, losses and summary, exact on any number of
processes, and TSLib's M4 scripts run unchanged. M4's data is not shipped: every test writes a small M4-shaped
folder (data_provider.m4.write_synthetic_m4); the summary's figures are checked against those TSLib's
m4_summary gives on the committed fixture (tests/golden/m4, benchmarks/m4_crosscheck.py)."""
import json
import os
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import REPO, assert_ok, records, run_cli

TSLIB_COMMIT = "4e938a1"  # thuml/Time-Series-Library, whose scripts/short_term_forecast/TimesNet_M4.sh is below


def _timesnet_line(pattern, d_model, d_ff):
    return (f"--task_name short_term_forecast --is_training 1 --root_path ./dataset/m4 --seasonal_patterns '{pattern}' "
            f"--model_id m4_{pattern} --model $model_name --data m4 --features M --e_layers 2 --d_layers 1 --factor 3 "
            f"--enc_in 1 --dec_in 1 --c_out 1 --batch_size 16 --d_model {d_model} --d_ff {d_ff} --top_k 5 --des 'Exp' "
            "--itr 1 --learning_rate 0.001 --loss 'SMAPE'").replace("$model_name", "TimesNet")


# scripts/short_term_forecast/TimesNet_M4.sh's six command lines, after `python -u run.py`, written out (bash's
# expansion of $model_name); with TSLIB_DIR naming a TSLib checkout, the test reads them from the script itself
TIMESNET_M4 = [_timesnet_line(*line) for line in (("Monthly", 32, 32), ("Yearly", 16, 32), ("Quarterly", 64, 64),
                                                  ("Daily", 16, 16), ("Weekly", 32, 32), ("Hourly", 32, 32))]
# appended: one optimizer step, the data and the outputs here
STEP = ["--train_steps", 1, "--num_threads", 1, "--quiet"]


def script_lines():
    checkout = os.environ.get("TSLIB_DIR")
    if not checkout:
        return [shlex.split(line) for line in TIMESNET_M4]
    recorder = 'python() { shift 2; printf "%s\\x1f" "$@"; printf "\\n"; }; source "$1"'
    path = Path(checkout) / "scripts" / "short_term_forecast" / "TimesNet_M4.sh"
    out = subprocess.run(["bash", "-c", recorder, "_", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.rstrip("\x1f").split("\x1f") for line in out.splitlines()]


@pytest.fixture(scope="module")
def m4_folder(tmp_path_factory):
    from data_provider.m4 import write_synthetic_m4

    return write_synthetic_m4(tmp_path_factory.mktemp("m4"), per_pattern=3, seed=0, layout="npz")


def test_tslibs_timesnet_m4_script_runs_unchanged_and_ends_in_tslibs_summary(tmp_path, m4_folder):
    """Each of the script's six runs trains a step and tests every series; the sixth finds all six forecast files
    and prints TSLib's table (rows SMAPE, MAPE, MASE, OWA; columns Yearly, Quarterly, Monthly, Others, Average)."""
    lines = script_lines()
    assert len(lines) == 6
    for line in lines:
        assert_ok(run_cli(tmp_path, *line, "--root_path", m4_folder, *STEP))
    runs = records(tmp_path)
    assert [r["args"]["seasonal_patterns"] for r in runs] == ["Monthly", "Yearly", "Quarterly", "Daily", "Weekly", "Hourly"]
    # TSLib's rules, whatever the script leaves out: the competition's horizon, twice it as input
    assert [(r["args"]["pred_len"], r["args"]["seq_len"], r["args"]["label_len"]) for r in runs] == [
        (18, 36, 18), (6, 12, 6), (8, 16, 8), (14, 28, 14), (13, 26, 13), (48, 96, 48)]
    assert all(r["test_windows"] == 3 and np.isfinite(r["smape"]) for r in runs)
    assert "m4_summary" not in runs[-2] and set(runs[-1]["m4_summary"]) == {"SMAPE", "MAPE", "MASE", "OWA"}
    summary = runs[-1]["m4_summary"]
    assert all(list(summary[row]) == ["Yearly", "Quarterly", "Monthly", "Others", "Average"] for row in summary)
    table = (tmp_path / "results" / "m4_results" / "TimesNet" / "m4_summary.csv").read_text().splitlines()
    assert table[0] == "metric,Yearly,Quarterly,Monthly,Others,Average" and len(table) == 5
    # the summary is utils.m4's of the six files the runs wrote
    from exp.short_term import summary_of_folder

    again = summary_of_folder(str(tmp_path / "results" / "m4_results" / "TimesNet"), str(m4_folder))
    assert again == summary


def _forecasts(folder, pattern="Quarterly"):
    return (folder / "results" / "m4_results" / "DLinear" / f"{pattern}_forecast.csv").read_text()


def test_one_two_and_three_processes_give_the_same_forecasts_and_figures(tmp_path, m4_folder):
    """Training (2 steps, each a global batch of the 3 series: the second epoch draws its cut points again) and
    the test on 1, 2 and 3 processes: the same figures and forecasts (to float32 rounding: DDP adds the ranks'
    gradients in another order), every series forecast once. The 1-process weights tested on 3 processes, a
    series a batch as TSLib tests: the same forecast file byte for byte, the same figures exactly."""
    argv = ["--task_name", "short_term_forecast", "--data", "m4", "--root_path", m4_folder, "--seasonal_patterns",
            "Quarterly", "--model", "DLinear", "--loss", "SMAPE", "--global_batch_size", 3, "--train_steps", 2,
            "--eval_batch_size", 1, "--num_threads", 1, "--quiet"]
    runs = []
    for nproc in (None, 2, 3):
        out = tmp_path / f"n{nproc}"
        assert_ok(run_cli(out, *argv, nproc=nproc))
        run = records(out)[-1]
        assert run["world_size"] == (nproc or 1) and run["test_windows"] == 3
        forecasts = np.loadtxt(_forecasts(out).splitlines()[1:], delimiter=",")
        assert forecasts.shape == (3, 8)
        runs.append((run, forecasts))
    (first, reference), *others = runs
    for run, forecasts in others:
        assert np.allclose(forecasts, reference, rtol=1e-6, atol=0)
        for key in ("smape", "mape", "mase", "owa", "vali_loss"):
            assert run[key] == pytest.approx(first[key], rel=1e-6, abs=0), key
        assert [h["train_loss"] for h in run["history"]] == pytest.approx([h["train_loss"] for h in first["history"]],
                                                                          rel=1e-6)
    weights = tmp_path / "nNone" / "checkpoints" / first["setting"] / "checkpoint.pth"
    tested = tmp_path / "tested"
    assert_ok(run_cli(tested, *argv, "--is_training", 0, "--checkpoint", weights, nproc=3))
    assert _forecasts(tested) == _forecasts(tmp_path / "nNone")
    again = records(tested)[-1]
    assert {k: again[k] for k in ("smape", "mape", "mase", "owa")} == {k: first[k] for k in ("smape", "mape", "mase", "owa")}


def test_the_summary_equals_tslibs_m4_summary_on_the_fixture():
    """benchmarks/m4_crosscheck.py: TSLib's m4_summary on the fixture's files gave expected.json (unrounded, and
    rounded as TSLib prints); utils.m4 on the same files gives the same to 1e-9."""
    from benchmarks.m4_crosscheck import FIXTURE, TOLERANCE, largest_difference, ours

    expected = json.loads((FIXTURE / "expected.json").read_text())
    mine = ours()
    assert largest_difference(expected["figures"], mine) <= TOLERANCE
    assert all(round(mine[r][c], 3) == expected["rounded"][r][c] for r in mine for c in mine[r])


def test_tslibs_pickled_pair_and_m4s_csvs_read_the_same(tmp_path):
    from data_provider.m4 import read_m4, write_synthetic_m4

    npz = read_m4(write_synthetic_m4(tmp_path / "npz", seed=3, layout="npz"))
    csv = read_m4(write_synthetic_m4(tmp_path / "csv", seed=3, layout="csv"))
    for p in npz[0]:
        assert npz[0][p] == csv[0][p]
        assert all(np.array_equal(a, b) for a, b in zip(npz[1][p], csv[1][p]))
        assert np.array_equal(npz[2][p], csv[2][p])
    assert npz[3].counts == csv[3].counts == {p: 3 for p in npz[0]}


def _tslib_smape(forecast, target, mask):
    """TSLib's smape_loss, written out: 200 mean(divide_no_nan(|f - y|, |f| + |y|) x mask)."""
    ratio = (forecast - target).abs() / (forecast.detach().abs() + target.abs())
    ratio = torch.where(torch.isfinite(ratio), ratio, 0)
    return 200 * (ratio * mask).mean()


def test_m4_losses_are_tslibs_masked_means():
    """A NaN target is TSLib's mask 0: out of the sum, in the count; 0 / 0 is 0 (and so is its gradient, NaN in
    TSLib); the denominator is not differentiated (TSLib's forecast.data)."""
    from utils.metrics import batch_loss

    torch.manual_seed(0)
    target = torch.rand(4, 6, 1) + 0.5
    target[0, 0] = 0.0
    mask = torch.ones_like(target)
    mask[1, 4:] = 0
    padded = torch.where(mask.bool(), target, torch.nan)
    forecast = torch.rand(4, 6, 1).requires_grad_()
    with torch.no_grad():
        forecast[0, 0] = 0.0  # 0 / 0
    ours = batch_loss(forecast, padded, "SMAPE")
    theirs = _tslib_smape(forecast, torch.where(mask.bool(), target, 0), mask)
    assert torch.allclose(ours, theirs, rtol=1e-6)
    ours_grad, = torch.autograd.grad(ours, forecast)
    theirs_grad, = torch.autograd.grad(theirs, forecast)
    # TSLib's 0 / 0 zeroes the value only: its gradient there is NaN, ours 0
    assert torch.isnan(theirs_grad[0, 0]) and ours_grad[0, 0] == 0
    theirs_grad[0, 0] = 0
    assert torch.allclose(ours_grad, theirs_grad, rtol=1e-6)
    assert torch.all(ours_grad[1, 4:] == 0)


def test_training_windows_are_tslibs_and_follow_the_series_not_the_batch():
    """TSLib's Dataset_M4.__getitem__ layout at a cut point, the cut drawn in TSLib's range from (seed, epoch,
    series) alone: the same window whichever batch (or rank) gathers it; another epoch, other cuts."""
    from data_provider.m4 import M4Windows
    from data_provider.windows import Window

    series = [np.arange(1.0, 41.0), np.arange(1.0, 8.0), np.arange(100.0, 130.0)]
    windows = M4Windows(series, Window(12, 6, 12), "train", history_size=1.5)  # horizon 6, label 6, input 12
    windows.set_seed(7)
    cuts = windows.cut_points(np.arange(3))
    assert all(max(1, len(s) - 9) <= c < len(s) for s, c in zip(series, cuts))
    x, y, _, _ = windows.__getitems__([1])
    cut = int(cuts[1])
    before = series[1][max(0, cut - 12):cut]
    expected_x = np.zeros(12)
    expected_x[12 - len(before):] = before
    after = series[1][max(0, cut - 6):min(7, cut + 6)]
    expected_y = np.zeros(12)
    expected_y[:len(after)] = after
    expected_y[max(len(after), 6):] = np.nan  # TSLib's mask 0 in the horizon
    assert np.array_equal(x[0, :, 0].numpy(), expected_x)
    assert np.array_equal(y[0, :, 0].numpy(), expected_y, equal_nan=True)
    together = windows.__getitems__([2, 0, 1])
    alone = [windows.__getitems__([i]) for i in (2, 0, 1)]
    for part in (0, 1):
        assert torch.equal(torch.nan_to_num(together[part]), torch.nan_to_num(torch.cat([a[part] for a in alone])))
    windows.set_epoch(1)
    assert not np.array_equal(windows.cut_points(np.arange(3)), cuts) or len(set(cuts)) == 1


def test_naive2_is_m4s_reference():
    """Naive2: the last value where M4's test finds no season (too short, or no significant acf at the year); a
    series of a multiplicative season on a level is forecast exactly (its decomposition's indices are the season)."""
    from utils.m4 import naive2, seasonal

    season = np.array([0.8, 0.9, 1.0, 1.1, 1.2, 1.0])
    x = 50 * np.tile(season, 8)[:-1]  # 47 values: the next one is position 5 of the season
    assert seasonal(x, 6)
    forecast = naive2(x, 8, 6)
    assert np.allclose(forecast, 50 * np.tile(season, 3)[5:13], rtol=1e-12)
    assert np.array_equal(naive2(x[:17], 8, 6), np.full(8, x[16]))  # under 3 years: not tested, naive
    assert np.array_equal(naive2(x, 8, 1), np.full(8, x[-1]))  # yearly data: naive


def test_each_epoch_draws_its_own_cut_points_in_the_training_loader():
    """TSLib draws a series' cut point anew each time it is sampled: the training loader tells the data set the
    step's epoch (data_provider.windows.gather_step), with loader workers too."""
    from data_provider.global_batches import GlobalBatches
    from data_provider.m4 import M4Windows
    from data_provider.windows import TrainLoader, Window

    series = [np.arange(1.0, 200.0) + 1000 * i for i in range(4)]
    for workers in (0, 1):
        dataset = M4Windows(series, Window(26, 13, 26), "train", history_size=10)
        loader = TrainLoader(dataset, GlobalBatches(4, seed=5, batch_size=4), num_workers=workers)
        inputs = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            x = torch.cat([batch[0] for step in loader.steps() for batch in step])
            inputs.append(x[torch.argsort(x[:, -1, 0])])  # series order (the epochs shuffle differently)
        assert not torch.equal(*inputs), workers
        assert torch.equal(inputs[0][:, -1, 0] // 1000, torch.arange(4.0))
