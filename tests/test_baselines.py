"""SeasonalNaive, Naive and Naive2 (models/): forecasts from the window alone, evaluated with --is_training 0 and
no checkpoint on any --data, quantiles by the stated rule (models/SeasonalNaive.py)."""
import argparse
import statistics

import numpy as np
import pytest
import torch

from helpers import assert_ok, records, run_cli


def _configs(**given):
    base = dict(task_name="long_term_forecast", freq="h", seq_len=48, pred_len=30, output_width=1, loss="MSE",
                quantiles="0.1,0.5,0.9")
    return argparse.Namespace(**{**base, **given})


def _model(name, **given):
    from models import get_model_class

    return get_model_class(name)(_configs(**given)).eval()


def test_seasonal_naive_repeats_the_last_season_and_naive_the_last_value():
    x = torch.randn(3, 48, 2)
    sn = _model("SeasonalNaive")(x)  # hourly: season 24
    assert torch.equal(sn, x[:, torch.arange(30) % 24 + 24])
    assert torch.equal(_model("Naive")(x), x[:, -1:].expand(3, 30, 2))
    monthly = _model("SeasonalNaive", task_name="short_term_forecast", frequency_map=12, seq_len=36, pred_len=18)
    assert torch.equal(monthly(x[:, :36]), x[:, 24 + torch.arange(18) % 12])


def test_naive2_is_m4s_on_the_window_without_its_padding():
    from utils.m4 import naive2

    rng = np.random.default_rng(0)
    t = np.arange(80)
    series = 100 + 20 * np.sin(2 * np.pi * t / 12) + rng.normal(size=80)
    window = np.concatenate([np.zeros(16), series])  # 16 steps of padding in front
    model = _model("Naive2", task_name="short_term_forecast", frequency_map=12, seq_len=96, pred_len=18)
    with torch.no_grad():
        got = model(torch.tensor(window, dtype=torch.float32)[None, :, None])[0, :, 0].double().numpy()
    want = naive2(window[16:].astype(np.float32).astype(np.float64), 18, 12)
    assert not np.allclose(want, want[0])  # the test found the season
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_quantiles_are_the_point_plus_normal_quantiles_of_the_residual_spread():
    x = torch.randn(2, 48, 1)
    model = _model("Naive", output_width=3, pred_len=90, loss="quantile")
    out = model(x).reshape(2, 3, 30, 1)
    sigma = float(x[0, 1:, 0].sub(x[0, :-1, 0]).square().mean().sqrt())
    assert torch.equal(out[:, 1], x[:, -1:].expand(2, 30, 1))  # the median is the point
    z = statistics.NormalDist().inv_cdf(0.9)
    torch.testing.assert_close(out[0, 2, :, 0] - out[0, 1, :, 0], z * sigma * torch.arange(1, 31).sqrt().float())


def test_no_training_no_checkpoint_on_long_term_data_and_with_quantiles(tmp_path):
    for model in ("SeasonalNaive", "Naive", "Naive2"):
        proc = run_cli(tmp_path, "--model", model, "--is_training", 0, "--synthetic_rows", 600, "--seq_len", 48,
                       "--pred_len", 24, "--num_threads", 1, "--quiet")
        assert_ok(proc)
        assert records(tmp_path)[-1]["model"] == model
    assert not list((tmp_path / "checkpoints").rglob("*.pth"))
    proc = run_cli(tmp_path, "--model", "SeasonalNaive", "--is_training", 0, "--synthetic_rows", 600, "--seq_len", 48,
                   "--pred_len", 24, "--loss", "quantile", "--num_threads", 1, "--quiet", nproc=2)
    assert_ok(proc)
    assert records(tmp_path)[-1]["world_size"] == 2


def test_a_season_longer_than_the_window_is_one_line(tmp_path):
    from helpers import assert_one_error_line

    proc = run_cli(tmp_path, "--model", "SeasonalNaive", "--is_training", 0, "--synthetic_rows", 600, "--seq_len", 12,
                   "--label_len", 6, "--pred_len", 24, "--num_threads", 1, "--quiet")
    assert_one_error_line(proc, "its season 24 is longer than --seq_len 12")
