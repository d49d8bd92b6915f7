"""Naive: each series' last value repeated over the horizon (the random walk forecast). Needs no training:
`--is_training 0` evaluates it with no checkpoint. With --loss quantile: the point plus the level's standard normal
quantile times sigma sqrt(h), sigma the root mean square of the window's one-step changes (models/SeasonalNaive.py)."""
from models.SeasonalNaive import Baseline, seasonal_naive


class Model(Baseline):
    def __init__(self, configs):
        super().__init__(configs, 1)

    def point_and_spread(self, x):
        return seasonal_naive(x, self.horizon, 1)
