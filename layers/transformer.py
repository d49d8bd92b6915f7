"""Decoder-only Transformer blocks used by Timer-XL (OpenLTM's TimerLayer / TimerBlock, post-norm)."""
import torch
import torch.nn.functional as F
from torch import nn

from layers.attention import TimeAttention

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class TimerLayer(nn.Module):
    """x = norm1(x + dropout(attn(x))); out = norm2(x + FFN(x)), FFN = d_model -> d_ff -> d_model."""

    def __init__(self, attention: TimeAttention, d_model: int, d_ff: int | None = None, dropout: float = 0.1,
                 activation: str = "relu"):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        d_ff = d_ff or 4 * d_model
        self.attention = attention
        # Pointwise linears: the same maths as OpenLTM's kernel-size-1 Conv1d, without the transposes.
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = _ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor, n_vars: int, n_tokens: int) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.attention(x, n_vars, n_tokens)))
        y = self.dropout(self.activation(self.linear1(x)))
        y = self.dropout(self.linear2(y))
        return self.norm2(x + y)


class TimerBlock(nn.Module):
    """A stack of TimerLayers followed by a final LayerNorm."""

    def __init__(self, layers: list[TimerLayer], d_model: int):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor, n_vars: int, n_tokens: int) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, n_vars, n_tokens)
        return self.norm(x)


def series_to_patches(x: torch.Tensor, token_len: int) -> torch.Tensor:
    """[B, L, C] -> [B, C, N, token_len]: each channel cut into N = L / token_len non-overlapping tokens."""
    length = x.shape[1]
    if length % token_len:
        raise ValueError(f"input length {length} is not a multiple of input_token_len {token_len}")
    return x.transpose(1, 2).unfold(-1, token_len, token_len)


def token_forecasts_to_series(out: torch.Tensor, batch: int, n_vars: int) -> torch.Tensor:
    """Per-token forecasts in channel-major order ([B * C, N, S] or [B, C * N, S]) -> [B, N * S, C]:
    block n of the time axis is the forecast that follows token n."""
    return out.reshape(batch, n_vars, -1).transpose(1, 2)
