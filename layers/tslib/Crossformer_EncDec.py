"""Crossformer's hierarchical encoder and decoder (Zhang and Yan, "Crossformer: Transformer Utilizing
Cross-Dimension Dependency for Multivariate Time Series Forecasting", ICLR 2023) under TSLib's module,
class and argument names. Segments of each channel are embedded; every scale merges neighbouring
segments and runs two-stage (time, then channel) attention; the decoder predicts from every scale.
"""
import torch
from einops import rearrange
from torch import nn

from layers.tslib.SelfAttention_Family import TwoStageAttentionLayer


class SegMerging(nn.Module):
    """Merge win_size neighbouring segments [B, D, S, d] -> [B, D, ceil(S / win), d] (the last ones
    repeated to fill a window), LayerNorm, linear."""

    def __init__(self, d_model, win_size, norm_layer=nn.LayerNorm):
        super().__init__()
        self.d_model = d_model
        self.win_size = win_size
        self.linear_trans = nn.Linear(win_size * d_model, d_model)
        self.norm = norm_layer(win_size * d_model)

    def forward(self, x):
        short = -x.shape[2] % self.win_size
        if short:
            x = torch.cat((x, x[:, :, -short:, :]), dim=-2)
        x = torch.cat([x[:, :, i::self.win_size, :] for i in range(self.win_size)], -1)
        return self.linear_trans(self.norm(x))


class scale_block(nn.Module):
    """One encoder scale: segment merging (win_size > 1), then `depth` two-stage attention layers."""

    def __init__(self, configs, win_size, d_model, n_heads, d_ff, depth, dropout, seg_num=10, factor=10):
        super().__init__()
        self.merge_layer = SegMerging(d_model, win_size, nn.LayerNorm) if win_size > 1 else None
        self.encode_layers = nn.ModuleList(
            TwoStageAttentionLayer(configs, seg_num, factor, d_model, n_heads, d_ff, dropout) for _ in range(depth))

    def forward(self, x, attn_mask=None, tau=None, delta=None):
        if self.merge_layer is not None:
            x = self.merge_layer(x)
        for layer in self.encode_layers:
            x = layer(x)
        return x, None


class Encoder(nn.Module):
    """The scales in turn; returns the input and every scale's output."""

    def __init__(self, attn_layers):
        super().__init__()
        self.encode_blocks = nn.ModuleList(attn_layers)

    def forward(self, x):
        encode_x = [x]
        for block in self.encode_blocks:
            x, _ = block(x)
            encode_x.append(x)
        return encode_x, None


class DecoderLayer(nn.Module):
    """Two-stage self-attention, cross-attention to one encoder scale, MLP; a per-segment prediction."""

    def __init__(self, self_attention, cross_attention, seg_len, d_model, d_ff=None, dropout=0.1):
        super().__init__()
        self.self_attention = self_attention
        self.cross_attention = cross_attention
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.MLP1 = nn.Sequential(nn.Linear(d_model, d_model), nn.GELU(), nn.Linear(d_model, d_model))
        self.linear_pred = nn.Linear(d_model, seg_len)

    def forward(self, x, cross):
        batch = x.shape[0]
        x = rearrange(self.self_attention(x), 'b d s m -> (b d) s m')
        cross = rearrange(cross, 'b d s m -> (b d) s m')
        attended, _ = self.cross_attention(x, cross, cross, None, None, None)
        x = self.norm1(x + self.dropout(attended))
        dec_output = self.norm2(x + self.MLP1(x))
        dec_output = rearrange(dec_output, '(b d) s m -> b d s m', b=batch)
        layer_predict = rearrange(self.linear_pred(dec_output), 'b d s l -> b (d s) l')
        return dec_output, layer_predict


class Decoder(nn.Module):
    """Decoder layers, layer i attending to encoder scale i; predictions summed over layers."""

    def __init__(self, layers):
        super().__init__()
        self.decode_layers = nn.ModuleList(layers)

    def forward(self, x, cross):
        channels = x.shape[1]
        final_predict = None
        for layer, cross_enc in zip(self.decode_layers, cross):
            x, layer_predict = layer(x, cross_enc)
            final_predict = layer_predict if final_predict is None else final_predict + layer_predict
        return rearrange(final_predict, 'b (d s) l -> b (s l) d', d=channels)
