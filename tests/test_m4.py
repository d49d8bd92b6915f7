"""M4 short-term forecasting (issue 42 item 3): TSLib's layout, windows, losses and summary, exact on any number of
processes, and TSLib's M4 scripts run unchanged. M4's data is not shipped: every test writes a small M4-shaped
folder (data_provider.m4.write_synthetic_m4); the summary's figures are checked against those TSLib's
m4_summary gives on the committed fixture (tests/golden/m4, lab/m4_crosscheck.py)."""
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
    """lab/m4_crosscheck.py: TSLib's m4_summary on the fixture's files gave expected.json (unrounded, and
    rounded as TSLib prints); utils.m4 on the same files gives the same to 1e-9."""
    from lab.m4_crosscheck import FIXTURE, TOLERANCE, largest_difference, ours

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


def test_validation_scores_every_series_in_one_pass_with_the_bits_of_each_alone():
    """Validation's per-series losses (Exp_Short_Term_Forecast.evaluate: m4_loss over each row of [series,
    horizon]) are, bit for bit, each series' loss computed alone, at every M4 horizon, NaN steps and 0 / 0
    included. Planted: the mean over dim 0, or SMAPE's factor 200 taken inside the mean: fails."""
    from utils import m4
    from utils.metrics import m4_loss

    g = torch.Generator().manual_seed(4)
    for horizon in sorted(set(m4.HORIZONS.values())):
        forecast = torch.randn(301, horizon, generator=g) * 100 + 1000
        target = torch.randn(301, horizon, generator=g) * 100 + 1000
        target[::7, -3:] = torch.nan
        target[5, 1], forecast[5, 1], target[9, 0] = 0.0, 0.0, 0.0
        for loss in ("SMAPE", "MAPE"):
            alone = torch.stack([_series_loss(f, t, loss) for f, t in zip(forecast, target)])
            assert torch.equal(m4_loss(forecast, target, loss, dim=-1), alone), (horizon, loss)
            assert torch.equal(m4_loss(forecast[7], target[7], loss), alone[7])


def _series_loss(forecast, target, loss):
    """One series' loss as validation computed it series by series (TSLib's masked means, 0 / 0 counted 0)."""
    kept = ~torch.isnan(target)
    target = torch.where(kept, target, 0)
    if loss == "SMAPE":
        both = forecast.abs() + target.abs()
        ratio = (forecast - target).abs() / torch.where(both == 0, 1, both)
        return 200 * torch.where(kept & (both != 0), ratio, 0).mean()
    return torch.where(kept & (target != 0), (forecast - target) / torch.where(target == 0, 1, target), 0).abs().mean()


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


# ---------------------------------------------------------------- Naive2 against M4's rules, written out here
def _r_acf(x, lags):
    """R's acf(x)$acf[1 + k] for k = 1..lags: lagged products about the mean over the sum of squares."""
    d = np.asarray(x, dtype=np.float64) - np.mean(x)
    products = np.correlate(d, d, mode="full")[len(d) - 1:]
    return products[1:lags + 1] / products[0]


def _m4_seasonality_statistic(x, ppy):
    """|acf(ppy)| in units of M4's limit at z = 1 (SeasonalityTest in M4-methods' "Benchmarks and Evaluation.R":
    clim = tcrit / sqrt(n) * sqrt(cumsum(c(1, 2 * acf^2)))[ppy]), or None where the test is not run or R's acf
    has no lag ppy (lag.max = 10 log10 n): those series are not seasonal."""
    n = len(x)
    if ppy <= 1 or n < 3 * ppy or ppy > min(int(np.floor(10 * np.log10(n))), n - 1):
        return None
    acf = _r_acf(x, ppy)
    return abs(acf[ppy - 1]) * np.sqrt(n) / np.sqrt(1 + 2 * np.sum(acf[:ppy - 1] ** 2))


def _m4_naive2(x, horizon, ppy, z=1.645):
    """M4's Naive2: where the 90 % test (tcrit 1.645) finds a season, R's decompose(type = "multiplicative"):
    the centred moving average (weights 1/ppy, halved at both ends of a 2 x ppy one for an even ppy), the ratio to
    it averaged at each position from the series' start, normalised to mean 1; the adjusted series' last value
    repeated, times the last ppy seasonal values."""
    x = np.asarray(x, dtype=np.float64)
    statistic = _m4_seasonality_statistic(x, ppy)
    if statistic is None or statistic <= z:
        return np.repeat(x[-1], horizon)
    weights = np.r_[0.5, np.ones(ppy - 1), 0.5] / ppy if ppy % 2 == 0 else np.ones(ppy) / ppy
    half, n = len(weights) // 2, len(x)
    trend = np.array([np.dot(weights, x[t - half:t + half + 1]) if half <= t < n - half else np.nan
                      for t in range(n)])
    ratio = x / trend
    figure = np.array([np.nanmean(ratio[position::ppy]) for position in range(ppy)])
    seasonal = np.resize(figure / figure.mean(), n)  # position t % ppy, R's rep(figure, periods + 1)[1:n]
    last_year = seasonal[n - ppy:]
    return x[-1] / seasonal[-1] * np.resize(last_year, horizon)


def _near_threshold_series(ppy, horizon, rng):
    """Weakly seasonal positive series whose M4 statistic lies between 1.645 and 1.96 (seasonal at 90 %, not at
    95 %), or just below 1.645, with their test horizons."""
    inside, below = [], []
    while len(inside) < 3 or len(below) < 1:
        shortest = max(3 * ppy, int(np.ceil(10 ** (ppy / 10))))  # tested, and R's acf reaches lag ppy
        n = int(rng.integers(shortest, 12 * ppy + 40))
        t = np.arange(n + horizon)
        values = 100 + 0.4 * np.sin(2 * np.pi * t / ppy) + rng.normal(scale=1.0, size=n + horizon)
        statistic = _m4_seasonality_statistic(values[:n], ppy)
        if statistic is not None and 1.645 < statistic <= 1.96 and len(inside) < 3:
            inside.append((values[:n], values[n:]))
        elif statistic is not None and 1.5 < statistic <= 1.645 and len(below) < 1:
            below.append((values[:n], values[n:]))
    return inside + below


def test_naive2_follows_m4s_90_percent_seasonality_test_on_many_series(tmp_path):
    """Naive2, OWA's denominator, on the synthetic M4 folder's 60 series and 12 made weakly seasonal (9 seasonal at
    M4's 90 % and not at 95 %, 3 just under the 90 % limit), against M4's rules written out here (the acf test at
    tcrit 1.645, R's multiplicative decompose): each series' seasonality decision and forecast, and the summary's
    Naive2 sMAPE and MASE, through an OWA of exactly 1 for forecasts equal to Naive2. Planted: the test at 95 %
    (1.96) fails here, as does a limit without the lower lags' acf."""
    from data_provider.m4 import read_m4, write_synthetic_m4
    from utils import m4

    ids, train, targets, sets = read_m4(write_synthetic_m4(tmp_path / "m4", per_pattern=10, seed=4, layout="npz"))
    rng = np.random.default_rng(23)
    for p in ("Quarterly", "Monthly", "Hourly"):
        extra = _near_threshold_series(sets.frequency[p], m4.HORIZONS[p], rng)
        ids[p] = ids[p] + [f"{p[0]}near{k}" for k in range(len(extra))]
        train[p] = train[p] + [x for x, _ in extra]
        targets[p] = np.concatenate([targets[p], np.stack([y for _, y in extra])])
    counts = {p: len(ids[p]) for p in m4.SEASONAL_PATTERNS}
    sets = m4.M4Sets(counts, sets.frequency, train, targets)
    statistics = [_m4_seasonality_statistic(x, sets.frequency[p]) for p in m4.SEASONAL_PATTERNS for x in train[p]]
    decided = [s is not None and s > 1.645 for s in statistics]
    assert sum(s is not None and 1.645 < s <= 1.96 for s in statistics) >= 9  # where 90 % and 95 % part
    assert sum(s is not None and 1.5 < s <= 1.645 for s in statistics) >= 3
    assert 20 < sum(decided) < len(decided) - 20  # seasonal and not, both plenty
    assert [m4.seasonal(x, sets.frequency[p]) for p in m4.SEASONAL_PATTERNS for x in train[p]] == decided
    expected = {p: np.stack([_m4_naive2(x, m4.HORIZONS[p], sets.frequency[p]) for x in train[p]])
                for p in m4.SEASONAL_PATTERNS}
    ours = m4.naive2_forecasts(str(tmp_path), sets, ids)  # no submission-Naive2.csv: computed
    for p in m4.SEASONAL_PATTERNS:
        np.testing.assert_allclose(ours[p], expected[p], rtol=1e-12, atol=0, err_msg=p)
    summary = m4.m4_summary(expected, ours, sets)
    for column in m4.COLUMNS:
        assert summary["OWA"][column] == pytest.approx(1.0, rel=1e-12, abs=0), column
    smape = {p: np.mean(200 * np.abs(expected[p] - targets[p]) / (np.abs(expected[p]) + np.abs(targets[p])))
             for p in m4.SEASONAL_PATTERNS}
    total = sum(counts.values())
    assert summary["SMAPE"]["Average"] == pytest.approx(sum(smape[p] * counts[p] for p in smape) / total, rel=1e-12)
    assert summary["SMAPE"]["Monthly"] == pytest.approx(smape["Monthly"], rel=1e-12)


# ---------------------------------------------------------------- sMAPE where the signs differ, and at zeros
# (forecast, truth, 200 |f - y| / (|f| + |y|)) written out by hand: opposite signs give 200 (|f - y| = |f| + |y|),
# where |y + f| would give up to 400 or a 0 denominator; 0 / 0 is 0, as TSLib's m4_summary (smape_2 divides by 1
# where the denominator is 0) and its smape_loss (divide_no_nan) count it; M4's own R code (smape_cal) divides
# as it is and never meets 0 / 0, every M4 value being positive
SMAPE_ROWS = [(1.0, -1.0, 200.0), (-1.0, 3.0, 200.0), (-2.5, 0.5, 200.0), (0.0, 0.0, 0.0), (0.0, 5.0, 200.0),
              (-4.0, 0.0, 200.0), (2.0, 4.0, 200 * 2 / 6), (-2.0, -4.0, 200 * 2 / 6), (-3.0, 1.0, 200.0),
              (0.5, -0.5, 200.0), (6.0, 6.0, 0.0), (-1.0, -3.0, 100.0)]


def test_smape_where_forecast_and_truth_differ_in_sign_or_are_zero():
    """M4's sMAPE (the summary's, each frequency's mean) and TSLib's SMAPE training loss on rows whose forecast and
    truth differ in sign, or are 0, against the hand-computed terms above. Planted: |y + f| for |y| + |f| fails
    here (the golden fixture's forecasts are all positive, so it passes there)."""
    from utils import m4
    from utils.metrics import batch_loss

    forecast, target, terms = (np.array(column).reshape(2, 6) for column in zip(*SMAPE_ROWS))
    np.testing.assert_allclose(m4.smape_terms(forecast, target), terms, rtol=1e-15, atol=0)
    # the summary's figures of one frequency: the mean over every element, for the model and for Naive2
    sets = m4.M4Sets({"Yearly": 2}, {"Yearly": 1}, {"Yearly": [np.array([1.0, 2.0, 4.0]), np.array([3.0, 1.0, 2.0])]},
                     {"Yearly": target})
    figures = m4.group_figures(forecast, forecast[::-1], sets, "Yearly")
    assert figures[0] == pytest.approx(terms.mean(), rel=1e-15)
    assert figures[3] == pytest.approx(np.mean(m4.smape_terms(forecast[::-1], target)), rel=1e-15)
    reversed_terms = [200 * abs(f - y) / (abs(f) + abs(y)) if abs(f) + abs(y) else 0.0
                      for f, y in zip(forecast[::-1].ravel(), target.ravel())]
    assert figures[3] == pytest.approx(np.mean(reversed_terms), rel=1e-15)
    loss = batch_loss(torch.tensor(forecast).view(2, 6, 1), torch.tensor(target).view(2, 6, 1), "SMAPE")
    assert loss.item() == pytest.approx(terms.mean(), rel=1e-12)


# ---------------------------------------------------------------- a series whose MASE scale is 0
def test_a_series_whose_mase_scale_is_0_is_named_and_its_frequencys_mase_is_undefined(tmp_path):
    """A constant M4 series: its in-sample seasonal naive error, MASE's scale, is 0. M4's scoring divides by it (as
    TSLib's m4_summary does), so the frequency's MASE is inf and OWA undefined: both null, and one warning line names
    the series and the cause (was: "the forecasts or the true values are not finite on the scaled data", of data
    that is finite and never scaled, after two lines of numpy's RuntimeWarning)."""
    from data_provider.m4 import write_synthetic_m4
    from utils import m4

    folder = write_synthetic_m4(tmp_path / "m4", per_pattern=3, seed=0, layout="npz")
    for name in ("training.npz", "test.npz"):
        rows = np.load(folder / name, allow_pickle=True)
        rows[1] = np.full(len(rows[1]), 50.0)  # Y2, the second Yearly series
        with open(folder / name, "wb") as out:
            np.save(out, rows, allow_pickle=True)
    assert m4.zero_scale_series([np.array([1.0, 2.0, 2.5]), np.full(5, 50.0), np.array([3.0, 3.0, 4.0])], 1) == [1]
    assert m4.series_mase(np.full(6, 51.0), np.full(9, 50.0), np.full(6, 50.0), 1) == np.inf
    proc = run_cli(tmp_path, "--task_name", "short_term_forecast", "--data", "m4", "--root_path", f"{folder}/",
                   "--seasonal_patterns", "Yearly", "--loss", "SMAPE", "--model", "DLinear", *STEP)
    assert_ok(proc)
    assert [line for line in (proc.stdout + proc.stderr).splitlines() if "warning" in line.lower()] == [
        "warning: mase inf, owa nan: MASE's scale, the in-sample seasonal naive error at lag 1, is 0 for series Y2 (1 "
        "of 3 Yearly: a history that repeats itself at that lag), so their MASE divides by 0 and Yearly's MASE and OWA "
        "are undefined, as in M4's own scoring (written as null in metrics.json and results.jsonl)"]
    record = records(tmp_path)[-1]
    assert record["mase"] is None and record["owa"] is None and np.isfinite(record["smape"])
