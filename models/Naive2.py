"""Naive2: M4's reference method (utils.m4.naive2): where M4's 90 % autocorrelation test finds the season, the
window is divided by the seasonal indices of the classical multiplicative decomposition, its last value repeated
and multiplied back by them; else naive. The season is SeasonalNaive's (models/SeasonalNaive.py). Zeros before a
window's first non-zero value are its padding (M4's, M1's, M3's, Tourism's windows of a short series) and are left
out; a series with no finite decomposition (a zero or negative value) is forecast naive. It needs no training:
`--is_training 0` evaluates it with no checkpoint. With --loss quantile, Naive's spread (the window's one-step changes).
"""
import numpy as np
import torch

from models.SeasonalNaive import Baseline, season_of, seasonal_naive
from utils.m4 import naive2


def naive2_of_window(window, horizon, season):
    """Naive2 of one window [L] float64, its leading zero padding left out."""
    nonzero = np.flatnonzero(window)
    history = window[nonzero[0]:] if len(nonzero) else window[-1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        forecast = naive2(history, horizon, season)
    return forecast if np.isfinite(forecast).all() else np.full(horizon, history[-1])


class Model(Baseline):
    def __init__(self, configs):
        super().__init__(configs, season_of(configs))

    def point_and_spread(self, x):
        _, spread = seasonal_naive(x, self.horizon, 1)
        windows = x.detach().double().cpu().numpy()
        point = np.stack([np.stack([naive2_of_window(w[:, c], self.horizon, self.season) for c in range(w.shape[1])], -1)
                          for w in windows]) if len(windows) else np.zeros((0, self.horizon, x.shape[2]))
        return torch.from_numpy(point).to(device=x.device, dtype=x.dtype), spread
