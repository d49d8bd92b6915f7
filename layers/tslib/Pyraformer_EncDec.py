"""Pyraformer's pyramidal attention encoder (Liu et al., "Pyraformer: Low-Complexity Pyramidal Attention
for Long-Range Time Series Modeling and Forecasting", ICLR 2022) under TSLib's module, class and
argument names.

The coarser-scale construction module (CSCM) builds a pyramid of ever coarser copies of the series by
strided convolutions; attention runs over all scales at once, each node seeing its neighbours on its own
scale, its parent and its children (PAM, as a dense mask: TSLib's "naive" version).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from layers.tslib.Embed import DataEmbedding
from layers.tslib.SelfAttention_Family import AttentionLayer, FullAttention


def _scale_sizes(input_size, window_size):
    sizes = [input_size]
    for window in window_size:
        sizes.append(math.floor(sizes[-1] / window))
    return sizes


def get_mask(input_size, window_size, inner_size):
    """(mask, all_size): the pyramidal attention mask (True = not attended) over all scales' nodes."""
    all_size = _scale_sizes(input_size, window_size)
    starts = [sum(all_size[:i]) for i in range(len(all_size))]
    allowed = torch.zeros(sum(all_size), sum(all_size))
    half = inner_size // 2
    for start, size in zip(starts, all_size):  # neighbours on the same scale
        for i in range(start, start + size):
            allowed[i, max(i - half, start):min(i + half + 1, start + size)] = 1
    for level in range(1, len(all_size)):  # parent <-> children
        start, child_start = starts[level], starts[level - 1]
        for node in range(all_size[level]):
            first = child_start + node * window_size[level - 1]
            # TSLib: a scale's last node reaches every remaining child up to the scale's start
            last = start if node == all_size[level] - 1 else first + window_size[level - 1]
            allowed[start + node, first:last] = 1
            allowed[first:last, start + node] = 1
    return (1 - allowed).bool(), all_size


def refer_points(all_sizes, window_size):
    """For each finest-scale step, its node's index on every scale: [1, L, scales, 1] long."""
    indexes = torch.zeros(all_sizes[0], len(all_sizes))
    for i in range(all_sizes[0]):
        indexes[i, 0] = node = i
        for j in range(1, len(all_sizes)):
            start = sum(all_sizes[:j])
            position = node - (start - all_sizes[j - 1])  # the node's position on scale j - 1
            node = start + min(position // window_size[j - 1], all_sizes[j] - 1)
            indexes[i, j] = node
    return indexes.unsqueeze(0).unsqueeze(3).long()


class RegularMask():
    """A fixed boolean mask given the attention's `.mask` interface ([B, 1, L, S])."""

    def __init__(self, mask):
        self._mask = mask.unsqueeze(1)

    @property
    def mask(self):
        return self._mask


class EncoderLayer(nn.Module):
    """Masked self-attention and a position-wise feed-forward."""

    def __init__(self, d_model, d_inner, n_head, dropout=0.1, normalize_before=True):
        super().__init__()
        self.slf_attn = AttentionLayer(
            FullAttention(mask_flag=True, factor=0, attention_dropout=dropout, output_attention=False),
            d_model, n_head)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, dropout=dropout, normalize_before=normalize_before)

    def forward(self, enc_input, slf_attn_mask=None):
        enc_output, _ = self.slf_attn(enc_input, enc_input, enc_input, attn_mask=RegularMask(slf_attn_mask))
        return self.pos_ffn(enc_output)


class Encoder(nn.Module):
    """Embedding, CSCM pyramid, pyramidal attention layers; each step's nodes on all scales concatenated."""

    def __init__(self, configs, window_size, inner_size):
        super().__init__()
        self.mask, self.all_size = get_mask(configs.seq_len, window_size, inner_size)
        self.indexes = refer_points(self.all_size, window_size)
        self.layers = nn.ModuleList([
            EncoderLayer(configs.d_model, configs.d_ff, configs.n_heads, dropout=configs.dropout,
                         normalize_before=False) for _ in range(configs.e_layers)])
        self.enc_embedding = DataEmbedding(configs.enc_in, configs.d_model, configs.dropout)
        self.conv_layers = Bottleneck_Construct(configs.d_model, window_size, configs.d_model // 4)

    def forward(self, x_enc, x_mark_enc):
        seq_enc = self.enc_embedding(x_enc, x_mark_enc)
        mask = self.mask.repeat(len(seq_enc), 1, 1).to(x_enc.device)
        seq_enc = self.conv_layers(seq_enc)
        for layer in self.layers:
            seq_enc = layer(seq_enc, mask)
        batch, _, width = seq_enc.shape
        indexes = self.indexes.to(seq_enc.device).repeat(batch, 1, 1, width).view(batch, -1, width)
        return torch.gather(seq_enc, 1, indexes).view(batch, self.all_size[0], -1)


class ConvLayer(nn.Module):
    """A strided convolution (one pyramid step), batch norm and ELU."""

    def __init__(self, c_in, window_size):
        super().__init__()
        self.downConv = nn.Conv1d(c_in, c_in, kernel_size=window_size, stride=window_size)
        self.norm = nn.BatchNorm1d(c_in)
        self.activation = nn.ELU()

    def forward(self, x):
        return self.activation(self.norm(self.downConv(x)))


class Bottleneck_Construct(nn.Module):
    """CSCM: down-project, the pyramid of strided convolutions, up-project, appended to the input."""

    def __init__(self, d_model, window_size, d_inner):
        super().__init__()
        windows = window_size if isinstance(window_size, list) else [window_size] * 3
        self.conv_layers = nn.ModuleList(ConvLayer(d_inner, window) for window in windows)
        self.up = nn.Linear(d_inner, d_model)
        self.down = nn.Linear(d_model, d_inner)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, enc_input):
        scale = self.down(enc_input).permute(0, 2, 1)
        scales = []
        for conv in self.conv_layers:
            scale = conv(scale)
            scales.append(scale)
        coarse = self.up(torch.cat(scales, dim=2).transpose(1, 2))
        return self.norm(torch.cat([enc_input, coarse], dim=1))


class PositionwiseFeedForward(nn.Module):
    """Two linear maps with GELU and dropout, residual, LayerNorm (eps 1e-6) before or after."""

    def __init__(self, d_in, d_hid, dropout=0.1, normalize_before=True):
        super().__init__()
        self.normalize_before = normalize_before
        self.w_1 = nn.Linear(d_in, d_hid)
        self.w_2 = nn.Linear(d_hid, d_in)
        self.layer_norm = nn.LayerNorm(d_in, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        residual = x
        if self.normalize_before:
            x = self.layer_norm(x)
        x = self.dropout(self.w_2(self.dropout(F.gelu(self.w_1(x))))) + residual
        return x if self.normalize_before else self.layer_norm(x)
