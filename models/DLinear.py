"""DLinear: decompose the lookback window into a moving-average trend and a seasonal remainder, forecast
each with one linear map over time (seq_len -> pred_len), and add the two forecasts. Zeng et al., "Are
Transformers Effective for Time Series Forecasting?", AAAI 2023; follows the TSLib implementation."""
import torch
from torch import nn

from layers.decomposition import SeriesDecomposition


def _time_linear(seq_len: int, pred_len: int) -> nn.Linear:
    """seq_len -> pred_len linear map initialised to the window average, as TSLib does."""
    linear = nn.Linear(seq_len, pred_len)
    with torch.no_grad():
        linear.weight.fill_(1 / seq_len)
    return linear


class Model(nn.Module):
    autoregressive = False

    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        self.channels = configs.enc_in
        self.individual = bool(configs.individual)
        self.decomposition = SeriesDecomposition(getattr(configs, "moving_avg", 25), length=self.seq_len)
        if self.individual:
            # ModuleLists keep TSLib's state_dict keys (Linear_Seasonal.<c>.weight, ...).
            self.Linear_Seasonal = nn.ModuleList(_time_linear(self.seq_len, self.pred_len) for _ in range(self.channels))
            self.Linear_Trend = nn.ModuleList(_time_linear(self.seq_len, self.pred_len) for _ in range(self.channels))
        else:
            self.Linear_Seasonal = _time_linear(self.seq_len, self.pred_len)
            self.Linear_Trend = _time_linear(self.seq_len, self.pred_len)

    @staticmethod
    def _per_channel(heads: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        """x [B, C, L] -> [B, C, pred_len] with head c applied to channel c, as one batched product
        instead of a Python loop of C small matmuls (C reaches ~900 on Traffic)."""
        weight = torch.stack([head.weight for head in heads])  # [C, pred_len, L]
        bias = torch.stack([head.bias for head in heads])  # [C, pred_len]
        return torch.einsum("bcl,cpl->bcp", x, weight) + bias

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_enc.shape[1] != self.seq_len:
            raise ValueError(f"DLinear expects seq_len={self.seq_len} input steps, got {x_enc.shape[1]}")
        seasonal, trend = self.decomposition(x_enc)
        seasonal, trend = seasonal.transpose(1, 2), trend.transpose(1, 2)  # [B, C, L]: linear acts on time
        if self.individual:
            out = self._per_channel(self.Linear_Seasonal, seasonal) + self._per_channel(self.Linear_Trend, trend)
        else:
            out = self.Linear_Seasonal(seasonal) + self.Linear_Trend(trend)
        return out.transpose(1, 2)  # [B, pred_len, C]
