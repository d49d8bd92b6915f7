"""Probabilistic metrics (utils.metrics.ProbabilisticSums, seasonality, seasonal_error) against gluonts'
own figures on committed fixtures (lab/gluonts_reference.py wrote them, in a gluonts venv), on
1, 2 and 3 gloo processes, and their edge cases."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import run_on_ranks
from utils.errors import UserError
from utils.metrics import ErrorSums, ProbabilisticSums, seasonal_error, seasonality, squared_seasonal_error

GOLDEN = Path(__file__).resolve().parent / "golden" / "probabilistic"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())
SUBSET = (0.05, 0.25, 0.5, 0.75, 0.95)  # without GIFT-Eval's nine levels: WQL over these


def fixtures():
    with np.load(GOLDEN / "fixtures.npz") as npz:
        return {key: npz[key] for key in npz.files}


def series_scales(fx):
    """[W, C]: each window's series' seasonal error, from the series' whole history, once per series."""
    per_series = [seasonal_error(fx[f"history_{s}"], seasonality(str(freq)), f"series {s}")
                  for s, freq in enumerate(fx["freqs"])]
    return torch.tensor(np.stack([per_series[s] for s in fx["series"]]))


def tensors(fx, levels=None):
    q = torch.tensor(fx["quantiles"])
    if levels is not None:
        q = q[..., [fx["levels"].tolist().index(level) for level in levels]]
    return q, torch.tensor(fx["truths"])


def score(q, y, scale, levels, batches, transform=None):
    """Metrics of windows fed in batches of the given sizes."""
    sums = ProbabilisticSums(levels, transform=transform)
    start = 0
    for size in batches:
        sums.update(q[start:start + size], y[start:start + size], None if scale is None else scale[start:start + size])
        start += size
    assert start == len(y)
    return sums.metrics()


GLUONTS_MSIS_ALPHA = 0.1  # lab/gluonts_reference.py scores MSIS(alpha=0.1)


def assert_equal_to(metrics, expected, rel):
    metrics, expected = dict(metrics), dict(expected)  # gluonts' figures name no alpha; ours do
    for name in ("sql", "rmsse"):  # fev's metrics, not gluonts': against fev.json below
        if name not in expected:
            metrics.pop(name, None)
    want_alpha = expected.pop("msis_alpha", GLUONTS_MSIS_ALPHA if "msis" in expected else None)
    assert metrics.pop("msis_alpha", None) == want_alpha
    assert set(metrics) == set(expected)
    for name, value in expected.items():
        if name == "wql_levels":
            assert metrics[name] == value
        else:
            assert metrics[name] == pytest.approx(value, rel=rel, abs=0), name


@pytest.mark.parametrize("batches", [(9,), (1, 3, 5), (4, 4, 1)])
def test_metrics_equal_gluonts_figures(batches):
    fx = fixtures()
    q, y = tensors(fx)
    metrics = score(q, y, series_scales(fx), fx["levels"].tolist(), batches)
    assert_equal_to(metrics, EXPECTED["metrics"], rel=1e-9)


def test_metrics_without_gift_eval_levels_take_wql_over_the_levels_given():
    fx = fixtures()
    q, y = tensors(fx, SUBSET)
    metrics = score(q, y, series_scales(fx), SUBSET, (2, 7))
    assert metrics["wql_levels"] == list(SUBSET)  # and no coverage_80: 0.1 and 0.9 are not levels
    assert_equal_to(metrics, EXPECTED["metrics_subset_levels"] | {"mase": EXPECTED["metrics"]["mase"],
                                                                   "smape": EXPECTED["metrics"]["smape"]}, rel=1e-9)


def test_transform_puts_the_quantiles_on_the_truths_scale():
    """Quantiles given on a scaled space: the transform (channels last, as exp.outputs.OriginalScale)
    brings them back before scoring, and the figures are gluonts' on the original scale."""
    fx = fixtures()
    q, y = tensors(fx)
    mean, std = torch.tensor([5.0, 200.0], dtype=torch.float64), torch.tensor([2.0, 30.0], dtype=torch.float64)
    scaled = (q - mean[:, None]) / std[:, None]

    def to_original(t):
        assert t.shape[-1] == 2  # channels last
        return t * std + mean

    metrics = score(scaled, y, series_scales(fx), fx["levels"].tolist(), (5, 4), transform=to_original)
    assert_equal_to(metrics, EXPECTED["metrics"], rel=1e-9)


def test_median_error_sums_equal_gluonts_mse_and_mae():
    fx = fixtures()
    q, y = tensors(fx)
    sums = ErrorSums()
    sums.update(q[..., fx["levels"].tolist().index(0.5)], y)
    assert sums.metrics()["mse"] == pytest.approx(EXPECTED["median_mse"], rel=1e-9, abs=0)
    assert sums.metrics()["mae"] == pytest.approx(EXPECTED["median_mae"], rel=1e-9, abs=0)


def test_float32_inputs_accumulate_in_float64():
    fx = fixtures()
    q, y = tensors(fx)
    metrics = score(q.float(), y.float(), series_scales(fx), fx["levels"].tolist(), (3, 6))
    for name, value in EXPECTED["metrics"].items():
        if name != "wql_levels":
            assert metrics[name] == pytest.approx(value, rel=1e-5), name


# ---- the same figures on any number of processes and in any batch grouping ----

def _metrics_on_rank(rank, world_size, batch):
    """Each rank scores a contiguous share of the windows (as a ShardSampler deals them), in batches of
    `batch`; one all_reduce."""
    fx = fixtures()
    q, y = tensors(fx)
    scale = series_scales(fx)
    share = np.array_split(np.arange(len(y)), world_size)[rank]
    sums = ProbabilisticSums(fx["levels"].tolist())
    for start in range(0, len(share), batch):
        index = torch.as_tensor(share[start:start + batch])
        sums.update(q[index], y[index], scale[index])
    return sums.all_reduce().metrics()


def test_metrics_identical_on_1_2_and_3_processes():
    reference = _metrics_on_rank(0, 1, 9)
    assert_equal_to(reference, EXPECTED["metrics"], rel=1e-9)
    for world_size, batch in ((1, 2), (2, 3), (3, 1)):
        if world_size == 1:
            results = [_metrics_on_rank(0, 1, batch)]
        else:
            results = run_on_ranks(_metrics_on_rank, world_size, batch)
        for result in results:
            assert_equal_to(result, reference, rel=1e-12)
        assert len({json.dumps(r, sort_keys=True) for r in results}) == 1  # every rank, the same bits


def test_metrics_do_not_depend_on_window_order_or_grouping():
    fx = fixtures()
    q, y = tensors(fx)
    scale = series_scales(fx)
    reference = score(q, y, scale, fx["levels"].tolist(), (9,))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    shuffled = score(q[order], y[order], scale[order], fx["levels"].tolist(), (2, 2, 5))
    assert_equal_to(shuffled, reference, rel=1e-12)


# ---- MASE's scale: each series' history, once ----

def test_series_scale_is_gluonts_seasonal_error_of_the_history():
    fx = fixtures()
    for s, freq in enumerate(fx["freqs"]):
        season = seasonality(str(freq))
        assert season == EXPECTED["seasonality"][s]
        np.testing.assert_allclose(seasonal_error(fx[f"history_{s}"], season), EXPECTED["seasonal_error"][s],
                                   rtol=1e-12, atol=0)
    # every window of a series is scaled alike, whatever window or batch it is
    scale = series_scales(fx)
    for s in range(len(fx["freqs"])):
        assert len({tuple(row) for row in scale[torch.as_tensor(fx["series"] == s)].tolist()}) == 1


def test_a_per_window_scale_misses_gluonts_mase():
    """The fixtures tell a per-window scale (each window's own lookback, here its series' last
    2 seasons + 1 rows before it) from the series' history: MASE and MSIS then miss gluonts' figures."""
    fx = fixtures()
    q, y = tensors(fx)
    scales, seen = [], {}
    for w, s in enumerate(fx["series"]):
        season = seasonality(str(fx["freqs"][s]))
        past = np.concatenate([fx[f"history_{s}"], *fx["truths"][seen.setdefault(s, [])]])
        scales.append(seasonal_error(past[-(2 * season + 1):], season))
        seen[s].append(w)
    metrics = score(q, y, torch.tensor(np.stack(scales)), fx["levels"].tolist(), (9,))
    for name in ("mase", "msis"):
        assert abs(metrics[name] / EXPECTED["metrics"][name] - 1) > 1e-3, name


# ---- seasonality and seasonal_error ----

def test_seasonality_equals_gluonts_get_seasonality():
    for freq, expected in EXPECTED["get_seasonality"].items():
        assert seasonality(freq) == expected, freq


@pytest.mark.parametrize("freq, expected", [
    ("t", 1440), ("h", 24), ("d", 1), ("b", 5), ("w", 1), ("m", 12), ("q", 4), ("y", 1), ("s", 3600),
    ("15min", 96), ("10t", 144), ("H", 24), ("T", 1440), ("10S", 360), ("M", 12), ("Q-DEC", 4), ("A-DEC", 1),
    ("W-SUN", 1), ("7h", 1),
])
def test_seasonality_of_tslib_and_older_pandas_names(freq, expected):
    assert seasonality(freq) == expected


@pytest.mark.parametrize("freq", ["hours", "0h", "", "15 min", "x"])
def test_unknown_frequency_is_one_line(freq):
    with pytest.raises(UserError, match="unknown frequency") as caught:
        seasonality(freq)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("rows", [24, 10])
def test_history_of_a_season_or_less_is_one_line(rows):
    with pytest.raises(UserError) as caught:
        seasonal_error(np.arange(rows * 2.0).reshape(rows, 2), 24, "series 'ETTh1'")
    message = str(caught.value)
    assert message.startswith("MASE needs at least season+1 history rows per series: series 'ETTh1' has")
    assert f"has {rows} " in message and "\n" not in message


def test_seasonal_error_of_a_season_plus_one_rows_and_a_nan():
    assert seasonal_error(np.array([[1.0, 5.0], [3.0, 5.0], [0.0, 4.0]]), 2).tolist() == [1.0, 1.0]
    with pytest.raises(UserError, match="finite"):
        seasonal_error(np.array([1.0, np.nan, 2.0, 3.0]), 1)


# ---- edge cases ----

@pytest.mark.parametrize("levels", [(0.1, 0.9), (0.5, 0.1), (0.5, 0.5), (0.0, 0.5), (0.5, 1.0)])
def test_bad_levels_are_one_line(levels):
    with pytest.raises(UserError, match="quantile levels") as caught:
        ProbabilisticSums(levels)
    assert "\n" not in str(caught.value)


def test_without_a_scale_no_mase_and_without_its_levels_no_msis_or_coverage():
    q = torch.tensor([[[[1.0, 2.0, 3.0]]]])  # [1, 1, 1, 3]
    sums = ProbabilisticSums((0.25, 0.5, 0.75))
    sums.update(q, torch.tensor([[[2.5]]]))
    assert set(sums.metrics()) == {"wql", "wql_levels", "smape", "coverage_50"}
    sums.update(q, torch.tensor([[[2.5]]]), torch.ones(1, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="all or none"):
        sums.metrics()
    scaled = ProbabilisticSums((0.25, 0.5, 0.75))
    scaled.update(q, torch.tensor([[[2.5]]]), torch.ones(1, 1, dtype=torch.float64))
    assert scaled.metrics()["mase"] == 0.5 and "msis" not in scaled.metrics()


@pytest.mark.parametrize("alpha, levels", [(0.1, (0.05, 0.5, 0.95)), (0.2, (0.1, 0.5, 0.9)), (0.5, (0.25, 0.5, 0.75))])
def test_msis_is_the_interval_score_at_its_alpha_and_names_it(alpha, levels):
    """MSIS at the interval 1 - alpha (gluonts' MSIS(alpha)): mean over elements of (u - l + 2/alpha (l - y)1[y < l]
    + 2/alpha (y - u)1[y > u]) / scale, computed here with numpy; the metrics name the alpha (default 0.1, the
    90 % interval), and without both ends among the levels there is no msis."""
    generator = torch.Generator().manual_seed(3)
    q = torch.sort(torch.randn(4, 6, 2, 3, generator=generator, dtype=torch.float64), dim=-1).values  # [B, P, C, L]
    y = torch.randn(4, 6, 2, generator=generator, dtype=torch.float64)
    scale = torch.rand(4, 2, generator=generator, dtype=torch.float64) + 0.5
    sums = ProbabilisticSums(levels, msis_alpha=alpha) if alpha != 0.1 else ProbabilisticSums(levels)
    sums.update(q, y, scale)
    low, high, truth = q[..., 0].numpy(), q[..., 2].numpy(), y.numpy()
    score = (high - low + 2 / alpha * (low - truth) * (truth < low) + 2 / alpha * (truth - high) * (truth > high))
    want = (score / scale.numpy()[:, None, :]).mean()
    got = sums.metrics()
    assert got["msis"] == pytest.approx(want, rel=1e-12) and got["msis_alpha"] == alpha
    other = ProbabilisticSums(levels, msis_alpha=0.3)
    other.update(q, y, scale)
    assert "msis" not in other.metrics() and "msis_alpha" not in other.metrics()


def test_zero_denominators_follow_gluonts():
    """All-zero truths: wql 0/0 NaN, or inf with a loss; a zero scale and 0 forecast as 0 drop out."""
    levels = (0.05, 0.5, 0.95)
    exact = ProbabilisticSums(levels)
    exact.update(torch.zeros(1, 2, 1, 3), torch.zeros(1, 2, 1), torch.zeros(1, 1, dtype=torch.float64))
    metrics = exact.metrics()
    assert np.isnan(metrics["wql"]) and np.isnan(metrics["smape"]) and np.isnan(metrics["mase"])
    assert metrics["coverage_90"] == 1.0
    off = ProbabilisticSums(levels)
    off.update(torch.tensor([[[[-1.0, 1.0, 2.0]]]]), torch.zeros(1, 1, 1), torch.tensor([[2.0]], dtype=torch.float64))
    assert off.metrics()["wql"] == np.inf and off.metrics()["mase"] == 0.5 and off.metrics()["smape"] == 2.0
    empty = ProbabilisticSums(levels).all_reduce().metrics()
    assert np.isnan(empty["wql"]) and np.isnan(empty["smape"]) and "mase" not in empty


def test_smape_where_the_median_and_the_truth_differ_in_sign():
    """sMAPE (gluonts' sMAPE[0.5]: 2 |y - median| / (|y| + |median|), 0 / 0 left out) on medians and truths of
    opposite signs, where it is 2 (|y - f| = |y| + |f|), and at zeros, against terms computed here by hand. The
    gluonts fixture's values are all non-negative, so it cannot tell |y| + |f| from |y + f|. Planted: the
    denominator |y + f| fails here."""
    median = torch.tensor([1.0, -1.0, -2.5, 0.0, 0.0, -4.0, 2.0, -2.0, -3.0, 0.5, 6.0, -1.0], dtype=torch.float64)
    truth = torch.tensor([-1.0, 3.0, 0.5, 0.0, 5.0, 0.0, 4.0, -4.0, 1.0, -0.5, 6.0, -3.0], dtype=torch.float64)
    terms = [2.0, 2.0, 2.0, None, 2.0, 2.0, 2 * 2 / 6, 2 * 2 / 6, 2.0, 2.0, 0.0, 1.0]  # None: 0 / 0, left out
    expected = np.mean([t for t in terms if t is not None])
    quantiles = torch.stack([median - 1, median, median + 1], -1).view(2, 6, 1, 3)
    sums = ProbabilisticSums((0.1, 0.5, 0.9))
    sums.update(quantiles, truth.view(2, 6, 1))
    assert sums.metrics()["smape"] == pytest.approx(expected, rel=1e-15)


# ---- SQL and RMSSE against fev's own figures (lab/fev_reference.py wrote fev.json, in a fev venv) ----

FEV = json.loads((GOLDEN / "fev.json").read_text())


def test_sql_and_rmsse_equal_fev_figures_on_each_series():
    """Each series' windows scored alone (fev takes one seasonality a call): SQL over GIFT-Eval's nine levels and
    RMSSE of the median, the constant history channel (scale 0) left out as fev leaves it out. Planted: a season
    off by one, |y - q| without its level weight, the squared scale's root taken twice, each fails here."""
    fx = fixtures()
    q, y = tensors(fx)
    for s, freq in enumerate(fx["freqs"]):
        windows = torch.as_tensor(np.flatnonzero(fx["series"] == s))
        season = seasonality(str(freq))
        history = fx[f"history_{s}"]
        scale = torch.tensor(seasonal_error(history, season)).expand(len(windows), -1)
        sq_scale = torch.tensor(squared_seasonal_error(history, season)).expand(len(windows), -1)
        sums = ProbabilisticSums(fx["levels"].tolist())
        sums.update(q[windows], y[windows], scale, sq_scale)
        metrics, expected = sums.metrics(), FEV["figures"][f"series_{s}"]
        assert metrics["sql"] == pytest.approx(expected["sql"], rel=1e-12, abs=0), s
        assert metrics["rmsse"] == pytest.approx(expected["rmsse"], rel=1e-12, abs=0), s


def test_gift_eval_sql_equals_the_runs_where_nothing_is_masked():
    """GIFT-Eval's records carry SQL from the same definition: on a finite series its window sums give the run's."""
    from benchmarks import gift_eval_scores as scores

    fx = fixtures()
    q, y = tensors(fx, scores.LEVELS)
    s = 0
    windows = np.flatnonzero(fx["series"] == s)
    history = fx[f"history_{s}"][:, 0]
    scale = scores.seasonal_errors([history] * len(windows), seasonality(str(fx["freqs"][s])))
    rows = scores.window_sums(y[windows, :, 0].numpy(), None, q[windows, :, 0].numpy().transpose(0, 2, 1), scale)
    sums = ProbabilisticSums(scores.LEVELS)
    sums.update(q[windows][:, :, :1], y[windows][:, :, :1], torch.tensor(scale)[:, None])
    assert scores.metrics(rows)["SQL"] == pytest.approx(sums.metrics()["sql"], rel=1e-12)
    assert scores.metrics(rows)["MASE[0.5]"] == pytest.approx(sums.metrics()["mase"], rel=1e-12)


def test_rmsse_needs_the_squared_scale_of_every_window():
    fx = fixtures()
    q, y = tensors(fx)
    scale = series_scales(fx)
    sums = ProbabilisticSums(fx["levels"].tolist())
    sums.update(q, y, scale)
    assert "rmsse" not in sums.metrics() and "sql" in sums.metrics()  # no squared scale: no RMSSE
    with pytest.raises(ValueError, match="needs scale"):
        sums.update(q, y, None, scale)


def test_every_metric_reads_only_the_sums_it_names():
    """A metric is one object: its sums by name and its formula; it reads nothing it does not declare."""
    from utils import metrics as definitions

    for metric in (*definitions.POINT_METRICS, *definitions.probabilistic_metrics((0.1, 0.5, 0.9), 0.1,
                                                                                  ("coverage_80",))):
        sums = dict.fromkeys(metric.sums, 1.0)
        assert isinstance(metric(sums), float), metric
        with pytest.raises(KeyError):
            metric(dict(list(sums.items())[1:]))
