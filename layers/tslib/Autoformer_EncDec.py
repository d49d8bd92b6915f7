"""Autoformer's progressive-decomposition encoder and decoder (Wu et al., "Autoformer: Decomposition
Transformers with Auto-Correlation for Long-Term Series Forecasting", NeurIPS 2021), under the module,
class and argument names TSLib's model files import (Autoformer, FEDformer, MICN, SegRNN, ...).

Every block splits its input into a seasonal part and a moving-average trend: `series_decomp` is
layers.decomposition.SeriesDecomposition (the decomposition DLinear and TimeMixer use) under TSLib's
name, computing the average by pooling (O(L k), TSLib's arithmetic) where those two fold its [L, L]
matrix into their products; `moving_avg` is layers.decomposition.moving_average with TSLib's padding.
"""
import torch.nn.functional as F
from torch import nn

from layers.decomposition import SeriesDecomposition, moving_average


def _activation(name):
    # TSLib's rule: "relu" is ReLU, any other name GELU.
    return F.relu if name == "relu" else F.gelu


class my_Layernorm(nn.Module):
    """LayerNorm over channels, then the time mean of the normalised series removed (a seasonal part
    has no level of its own)."""

    def __init__(self, channels):
        super().__init__()
        self.layernorm = nn.LayerNorm(channels)

    def forward(self, x):
        normed = self.layernorm(x)
        return normed - normed.mean(dim=1, keepdim=True)


class moving_avg(nn.Module):
    """Moving average over time of x [B, L, C], both ends padded with (kernel_size - 1) // 2 copies of
    the first / last value, any stride (series_decomp is the stride-1 case)."""

    def __init__(self, kernel_size, stride):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride

    def forward(self, x):
        return moving_average(x, self.kernel_size, self.stride, same_length=False)


class series_decomp(SeriesDecomposition):
    """(seasonal, trend) of x [B, L, C]: TSLib's name for layers.decomposition.SeriesDecomposition.

    For the odd kernels TSLib accepts this is its moving average exactly; an even kernel (a shape error
    in TSLib) pads one more value at the end so the trend keeps the input's length."""

    def __init__(self, kernel_size):
        super().__init__(kernel_size, pooled=True)


class series_decomp_multi(nn.Module):
    """FEDformer's / MICN's decomposition with several kernels: seasonal and trend each averaged over
    the kernels."""

    def __init__(self, kernel_size):
        super().__init__()
        self.kernel_size = kernel_size
        self.series_decomp = nn.ModuleList(series_decomp(kernel) for kernel in kernel_size)

    def forward(self, x):
        parts = [decomp(x) for decomp in self.series_decomp]
        seasonal = sum(part[0] for part in parts) / len(parts)
        trend = sum(part[1] for part in parts) / len(parts)
        return seasonal, trend


class EncoderLayer(nn.Module):
    """Attention, decomposition, a two-convolution feed-forward, decomposition: only the seasonal
    part goes on (the trends are dropped in the encoder)."""

    def __init__(self, attention, d_model, d_ff=None, moving_avg=25, dropout=0.1, activation="relu"):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.attention = attention
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=1, bias=False)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=1, bias=False)
        self.decomp1 = series_decomp(moving_avg)
        self.decomp2 = series_decomp(moving_avg)
        self.dropout = nn.Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, x, attn_mask=None):
        new_x, attn = self.attention(x, x, x, attn_mask=attn_mask)
        x, _ = self.decomp1(x + self.dropout(new_x))
        y = self.dropout(self.activation(self.conv1(x.transpose(-1, 1))))
        y = self.dropout(self.conv2(y).transpose(-1, 1))
        res, _ = self.decomp2(x + y)
        return res, attn


class Encoder(nn.Module):
    """Attention layers (with distilling conv layers between them when given), then the norm."""

    def __init__(self, attn_layers, conv_layers=None, norm_layer=None):
        super().__init__()
        self.attn_layers = nn.ModuleList(attn_layers)
        self.conv_layers = nn.ModuleList(conv_layers) if conv_layers is not None else None
        self.norm = norm_layer

    def forward(self, x, attn_mask=None):
        attns = []
        if self.conv_layers is not None:
            for attn_layer, conv_layer in zip(self.attn_layers, self.conv_layers):
                x, attn = attn_layer(x, attn_mask=attn_mask)
                x = conv_layer(x)
                attns.append(attn)
            x, attn = self.attn_layers[-1](x)  # TSLib's last layer runs without the mask
            attns.append(attn)
        else:
            for attn_layer in self.attn_layers:
                x, attn = attn_layer(x, attn_mask=attn_mask)
                attns.append(attn)
        if self.norm is not None:
            x = self.norm(x)
        return x, attns


class DecoderLayer(nn.Module):
    """Self-attention, cross-attention and feed-forward, each followed by a decomposition; the three
    trends are summed and projected to c_out channels by a circular kernel-3 convolution."""

    def __init__(self, self_attention, cross_attention, d_model, c_out, d_ff=None,
                 moving_avg=25, dropout=0.1, activation="relu"):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.self_attention = self_attention
        self.cross_attention = cross_attention
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=1, bias=False)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=1, bias=False)
        self.decomp1 = series_decomp(moving_avg)
        self.decomp2 = series_decomp(moving_avg)
        self.decomp3 = series_decomp(moving_avg)
        self.dropout = nn.Dropout(dropout)
        self.projection = nn.Conv1d(d_model, c_out, kernel_size=3, stride=1, padding=1,
                                    padding_mode="circular", bias=False)
        self.activation = _activation(activation)

    def forward(self, x, cross, x_mask=None, cross_mask=None):
        x = x + self.dropout(self.self_attention(x, x, x, attn_mask=x_mask)[0])
        x, trend1 = self.decomp1(x)
        x = x + self.dropout(self.cross_attention(x, cross, cross, attn_mask=cross_mask)[0])
        x, trend2 = self.decomp2(x)
        y = self.dropout(self.activation(self.conv1(x.transpose(-1, 1))))
        y = self.dropout(self.conv2(y).transpose(-1, 1))
        x, trend3 = self.decomp3(x + y)
        residual_trend = self.projection((trend1 + trend2 + trend3).permute(0, 2, 1)).transpose(1, 2)
        return x, residual_trend


class Decoder(nn.Module):
    """Decoder layers accumulating the trend, then the norm and projection of the seasonal part."""

    def __init__(self, layers, norm_layer=None, projection=None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm_layer
        self.projection = projection

    def forward(self, x, cross, x_mask=None, cross_mask=None, trend=None):
        for layer in self.layers:
            x, residual_trend = layer(x, cross, x_mask=x_mask, cross_mask=cross_mask)
            trend = trend + residual_trend
        if self.norm is not None:
            x = self.norm(x)
        if self.projection is not None:
            x = self.projection(x)
        return x, trend
