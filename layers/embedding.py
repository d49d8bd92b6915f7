"""Input embeddings shared by the Transformer-family forecasters (TSLib's Embed.py, written once).

The classes are named for what they do; layers/tslib/Embed.py offers TSLib's classes (DataEmbedding, ...) under
TSLib's names and state_dict keys, built on this module's functions (circular_token_conv, cut_patches) and
utils.positions.sinusoid_table, so both sets compute with one implementation and keep their own checkpoints'
key names.

Time features (`x_mark`) come from the data provider: `configs.mark_dim` columns per step, 0 for
undated data, in which case the temporal term is left out.
"""
import torch
from torch import nn

from utils.positions import sinusoid_table


def circular_token_conv(c_in: int, d_model: int) -> nn.Conv1d:
    """The width-3 circular convolution that embeds a step's values with its neighbours' (TSLib's
    TokenEmbedding), Kaiming-normal initialised as there."""
    conv = nn.Conv1d(c_in, d_model, kernel_size=3, padding=1, padding_mode="circular", bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_in", nonlinearity="leaky_relu")
    return conv


def cut_patches(series: torch.Tensor, pad: nn.Module, patch_len: int, stride: int) -> torch.Tensor:
    """[..., L] -> [..., N, patch_len]: the end padded by `pad` (a ReplicationPad1d), then a patch every
    `stride` steps (PatchTST, Nie et al., ICLR 2023)."""
    return pad(series.unsqueeze(1)).squeeze(1).unfold(-1, patch_len, stride)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions, [1, L, d_model] for an input of length L."""

    def __init__(self, d_model: int, max_len: int = 5000):
        super().__init__()
        self.register_buffer("table", sinusoid_table(max_len, d_model).unsqueeze(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[:, : x.shape[1]]


class ConvValueEmbedding(nn.Module):
    """Values of all channels at a step -> d_model, by a width-3 circular convolution over time."""

    def __init__(self, c_in: int, d_model: int):
        super().__init__()
        self.conv = circular_token_conv(c_in, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, L, C] -> [B, L, d_model]
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


class CalendarEmbedding(nn.Module):
    """Time features of a step -> d_model (TSLib's `timeF` embedding: one linear map, no bias)."""

    def __init__(self, mark_dim: int, d_model: int):
        super().__init__()
        self.linear = nn.Linear(mark_dim, d_model, bias=False)

    def forward(self, x_mark: torch.Tensor) -> torch.Tensor:
        return self.linear(x_mark)


class StepTokenEmbedding(nn.Module):
    """value + temporal (+ position) embedding of every step: [B, L, C] -> [B, L, d_model]."""

    def __init__(self, c_in: int, d_model: int, mark_dim: int = 0, dropout: float = 0.1, position: bool = True):
        super().__init__()
        self.value = ConvValueEmbedding(c_in, d_model)
        self.position = SinusoidalPositions(d_model) if position else None
        self.temporal = CalendarEmbedding(mark_dim, d_model) if mark_dim else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, x_mark: torch.Tensor | None = None) -> torch.Tensor:
        out = self.value(x)
        if self.position is not None:
            out = out + self.position(x)
        if self.temporal is not None and x_mark is not None:
            out = out + self.temporal(x_mark)
        return self.dropout(out)


class VariateTokenEmbedding(nn.Module):
    """iTransformer's embedding: each variate's whole series is one token, [B, L, C] -> [B, C (+marks), d_model].

    Time features, when given, are appended as extra variates (as in the paper's code).
    """

    def __init__(self, seq_len: int, d_model: int, dropout: float = 0.1):
        super().__init__()
        self.linear = nn.Linear(seq_len, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, x_mark: torch.Tensor | None = None) -> torch.Tensor:
        x = x.transpose(1, 2)
        if x_mark is not None and x_mark.shape[-1]:
            x = torch.cat([x, x_mark.transpose(1, 2)], dim=1)
        return self.dropout(self.linear(x))


class PatchTokenEmbedding(nn.Module):
    """PatchTST's patching: pad the end by `stride` repeats, cut patches of `patch_len` every `stride`
    steps, project each to d_model and add positions. [B * C, L] -> [B * C, N, d_model]."""

    def __init__(self, d_model: int, patch_len: int, stride: int, dropout: float = 0.1):
        super().__init__()
        self.patch_len, self.stride = patch_len, stride
        self.pad = nn.ReplicationPad1d((0, stride))
        self.value = nn.Linear(patch_len, d_model, bias=False)
        self.position = SinusoidalPositions(d_model)
        self.dropout = nn.Dropout(dropout)

    @staticmethod
    def n_patches(seq_len: int, patch_len: int, stride: int) -> int:
        return (seq_len + stride - patch_len) // stride + 1

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        tokens = self.value(cut_patches(series, self.pad, self.patch_len, self.stride))
        return self.dropout(tokens + self.position(tokens))
