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
    inputs_used = ("x_enc",)

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

    def effective_weights(self):
        """(weight, bias) of the whole model as one linear map over time.

        seasonal_head(x - A x) + trend_head(A x) = (Ws + (Wt - Ws) A) x + bs + bt, with A the
        moving-average matrix: the same mathematics as decomposing first, but one matrix
        product per batch instead of a decomposition and two products.
        """
        average = self.decomposition.averaging_matrix  # [L, L]
        if self.individual:
            seasonal = torch.stack([head.weight for head in self.Linear_Seasonal])  # [C, P, L]
            trend = torch.stack([head.weight for head in self.Linear_Trend])
            bias = torch.stack([head.bias for head in self.Linear_Seasonal]) + torch.stack(
                [head.bias for head in self.Linear_Trend])  # [C, P]
        else:
            seasonal, trend = self.Linear_Seasonal.weight, self.Linear_Trend.weight  # [P, L]
            bias = self.Linear_Seasonal.bias + self.Linear_Trend.bias
        return seasonal + (trend - seasonal) @ average.to(seasonal.dtype), bias

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_enc.shape[1] != self.seq_len:
            raise ValueError(f"DLinear expects seq_len={self.seq_len} input steps, got {x_enc.shape[1]}")
        if self.decomposition.averaging_matrix.device != x_enc.device:
            self.decomposition(x_enc[:1])  # rebuilds the matrix on the input's device
        weight, bias = self.effective_weights()
        if self.individual:  # head c for channel c, batched: [B, L, C] x [C, P, L] -> [B, P, C]
            return torch.einsum("blc,cpl->bpc", x_enc, weight) + bias.T
        # one GEMM over all B * C series: [B * C, L] x [L, P]. The explicit reshape keeps it a
        # plain matrix product; a strided 3-D input sends no-grad calls to a slow batched kernel.
        batch, _, channels = x_enc.shape
        series = x_enc.transpose(1, 2).reshape(batch * channels, self.seq_len)
        return nn.functional.linear(series, weight, bias).view(batch, channels, -1).transpose(1, 2)
