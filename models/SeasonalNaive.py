"""SeasonalNaive: each series' last season repeated over the horizon (the last value where the season is 1), the
forecasting competitions' benchmark. The season is MASE's lag of the run: the short-term task's (M4, M1, M3,
Tourism: Yearly 1, Quarterly 4, Monthly 12, ...), else gluonts' seasonality of --freq (utils.metrics.seasonality).
Needs no training: `--is_training 0` evaluates it with no checkpoint (docs/benchmarks.md#classical-baselines).

With --loss quantile it forecasts each level as the point plus the level's standard normal quantile times the
h-step standard deviation of the method's in-window residuals (Hyndman & Athanasopoulos, Forecasting: Principles
and Practice, 3rd ed., section 5.5: seasonal naive sigma sqrt(k + 1), k whole seasons before step h; naive
sigma sqrt(h)), the rule of statsforecast's SeasonalNaive and Naive and of benchmarks/gift_eval.py's baselines.
"""
import statistics

import torch
from torch import nn

from utils.metrics import seasonality
from utils.probabilistic import parse_levels


def season_of(configs):
    """MASE's lag of the run: the short-term task's frequency_map, else the seasonality of --freq."""
    if configs.task_name == "short_term_forecast" and getattr(configs, "frequency_map", None):
        return int(configs.frequency_map)
    return seasonality(configs.freq)


class Baseline(nn.Module):
    """A forecast computed from the input window alone. `scale`, a multiplier that is 1 until trained, is its one
    parameter: it lets the experiment's training path (DDP, optimisers, the model contract) take the model as any
    other; untrained (`--is_training 0`, no checkpoint) the forecast is the method's exactly (x * 1.0 is x)."""

    autoregressive = False
    inputs_used = ("x_enc",)
    needs_no_training = True  # exp.settings: --is_training 0 without weights named loads none

    def __init__(self, configs, season):
        super().__init__()
        self.width = int(getattr(configs, "output_width", 1))
        self.horizon = configs.pred_len // self.width
        self.season = season
        self.z = None
        if self.width > 1:
            if configs.loss != "quantile":
                raise ValueError(f"it forecasts quantiles (--loss quantile), not the parameters of --loss {configs.loss}")
            self.z = [statistics.NormalDist().inv_cdf(q) for q in parse_levels(configs.quantiles)]
        self.scale = nn.Parameter(torch.ones(()))

    def point_and_spread(self, x):
        """([B, horizon, C] point forecast, its h-step standard deviation [B, horizon, C]) of x [B, L, C]."""
        raise NotImplementedError

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        x = x_enc.float()
        point, spread = self.point_and_spread(x)
        if self.z is not None:
            point = torch.cat([point + z * spread for z in self.z], dim=1)  # block k of the horizon: level k
        return (point * self.scale.float()).to(x_enc.dtype)


def _sigma(residuals):
    """The root mean square of residuals [B, T, C] over T: [B, 1, C]."""
    return residuals.square().mean(dim=1, keepdim=True).sqrt()


def seasonal_naive(x, horizon, season):
    """(point, spread) of the seasonal naive forecast of x [B, L, C] (season 1: naive)."""
    steps = torch.arange(horizon, device=x.device)
    point = x[:, x.shape[1] - season + steps % season]
    if x.shape[1] <= season:
        return point, torch.zeros_like(point)
    k = (steps // season).to(x.dtype)
    return point, _sigma(x[:, season:] - x[:, :-season]) * (k + 1).sqrt()[None, :, None]


class Model(Baseline):
    def __init__(self, configs):
        season = season_of(configs)
        if season > configs.seq_len:
            raise ValueError(f"its season {season} is longer than --seq_len {configs.seq_len}: give --seq_len at least "
                             f"{season}")
        super().__init__(configs, season)

    def point_and_spread(self, x):
        return seasonal_naive(x, self.horizon, self.season)
