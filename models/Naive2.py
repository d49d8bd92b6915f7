"""Naive2: M4's reference method (utils.m4.naive2): where M4's 90 % autocorrelation test finds the season, the
series is divided by the seasonal indices of the classical multiplicative decomposition, its last value repeated
and multiplied back by them; else naive. The season is SeasonalNaive's (models/SeasonalNaive.py). On the short-term
task (M4, M1, M3, Tourism) the input window holds each series whole (`whole_history`: --seq_len becomes the longest
training series), so the forecast is M4's Naive2; zeros before a window's first non-zero value are its padding and
are left out. A series with no finite decomposition (a zero or negative value) is forecast naive. It needs no
training: `--is_training 0` evaluates it with no checkpoint. With --loss quantile: Naive's rule (sigma sqrt(h),
sigma the root mean square of the series' one-step changes).
"""
import numpy as np
import torch

from models.SeasonalNaive import Baseline, season_of
from utils.m4 import naive2


def naive2_of_window(window, horizon, season):
    """(Naive2 forecast, Naive's h-step standard deviation) of one window [L] float64, its zero padding left out."""
    nonzero = np.flatnonzero(window)
    history = window[nonzero[0]:] if len(nonzero) else window[-1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        forecast = naive2(history, horizon, season)
    if not np.isfinite(forecast).all():
        forecast = np.full(horizon, history[-1])
    sigma = np.sqrt(np.mean(np.diff(history) ** 2)) if len(history) > 1 else 0.0
    return forecast, sigma * np.sqrt(np.arange(1, horizon + 1))


class Model(Baseline):
    whole_history = True  # exp.settings: the short-term task's window holds each series whole

    def __init__(self, configs):
        super().__init__(configs, season_of(configs))

    def point_and_spread(self, x):
        windows = x.detach().double().cpu().numpy()
        parts = np.zeros((2, len(windows), self.horizon, x.shape[2]))
        for b, w in enumerate(windows):
            for c in range(w.shape[1]):
                parts[0, b, :, c], parts[1, b, :, c] = naive2_of_window(w[:, c], self.horizon, self.season)
        point, spread = torch.from_numpy(parts).to(device=x.device, dtype=x.dtype)
        return point, spread
