"""NLinear: subtract the last observed value from the lookback window, forecast the remainder with one
linear map over time (seq_len -> pred_len), and add the last value back, so a shift in level between
training and test costs the linear map nothing. Zeng et al., "Are Transformers Effective for Time Series
Forecasting?", AAAI 2023; follows the authors' LTSF-Linear implementation (TSLib has no NLinear)."""
import torch
from torch import nn


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)

    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        self.individual = bool(configs.individual)
        # PyTorch's default nn.Linear initialisation, as LTSF-Linear's NLinear (its 1/seq_len fill is
        # commented out there, unlike DLinear's).
        if self.individual:
            # A ModuleList keeps the reference's state_dict keys (Linear.<c>.weight, ...).
            self.Linear = nn.ModuleList(nn.Linear(self.seq_len, self.pred_len) for _ in range(configs.enc_in))
        else:
            self.Linear = nn.Linear(self.seq_len, self.pred_len)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_enc.shape[1] != self.seq_len:
            raise ValueError(f"NLinear expects seq_len={self.seq_len} input steps, got {x_enc.shape[1]}")
        last = x_enc[:, -1:, :].detach()  # detached, as the reference: the anchor is data, not a path
        x = x_enc - last
        if self.individual:  # head c for channel c, batched: [B, L, C] x [C, P, L] -> [B, P, C]
            weight = torch.stack([head.weight for head in self.Linear])
            bias = torch.stack([head.bias for head in self.Linear])  # [C, P]
            return torch.einsum("blc,cpl->bpc", x, weight) + bias.T + last
        # one GEMM over all B * C series
        batch, _, channels = x.shape
        series = x.transpose(1, 2).reshape(batch * channels, self.seq_len)
        out = self.Linear(series).view(batch, channels, self.pred_len).transpose(1, 2)
        return out + last
