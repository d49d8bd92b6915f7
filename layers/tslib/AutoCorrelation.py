"""Auto-Correlation (Wu et al., "Autoformer: Decomposition Transformers with Auto-Correlation for
Long-Term Series Forecasting", NeurIPS 2021) under TSLib's module, class and argument names.

Queries and keys are compared at every time lag at once through the FFT (Wiener-Khinchin); the top
int(factor * ln L) lags are kept and the values, rolled by those lags, are summed with softmax weights.

In training the lags are chosen from the correlation averaged over the whole batch (the paper's
"speed-up" version, as TSLib computes it), so a training step depends on which windows share its
forward; in evaluation each window chooses its own lags.
"""
import math

import torch
from torch import nn


def _top_k(factor, length):
    return int(factor * math.log(length))


def _rolled_sum(values, delays, weights):
    """sum_i weights[:, i] * values rolled left by delays[:, i] (per window): values [B, H, C, L]."""
    batch, length = values.shape[0], values.shape[-1]
    doubled = torch.cat([values, values], dim=-1)  # a roll is a window into the doubled series
    positions = torch.arange(length, device=values.device)
    out = torch.zeros_like(values).float()
    for i in range(delays.shape[1]):
        index = (positions + delays[:, i:i + 1]).view(batch, 1, 1, length).expand_as(values)
        out = out + torch.gather(doubled, -1, index) * weights[:, i].view(batch, 1, 1, 1)
    return out


class AutoCorrelation(nn.Module):
    """Period-based dependency discovery and time-delay aggregation on [B, L, H, E] heads."""

    # A layer's word for what a model's `batch_dependent` says (tests/test_model_contract.py): TSLib's
    # model files cannot declare it, the layer they build does.
    batch_dependent = ("in training the top lags are chosen from the correlation averaged over the batch "
                       "(TSLib's AutoCorrelation), so a window's gradient depends on its batch-mates")

    def __init__(self, mask_flag=True, factor=1, scale=None, attention_dropout=0.1, output_attention=False):
        super().__init__()
        self.factor = factor
        self.scale = scale
        self.mask_flag = mask_flag
        self.output_attention = output_attention
        self.dropout = nn.Dropout(attention_dropout)  # kept for TSLib's module tree; TSLib never applies it

    def time_delay_agg_training(self, values, corr):
        """Lags shared by the batch: the top lags of the batch's mean correlation."""
        top_k = _top_k(self.factor, values.shape[-1])
        mean_value = corr.mean(dim=1).mean(dim=1)  # [B, L]
        index = torch.topk(mean_value.mean(dim=0), top_k, dim=-1)[1]
        weights = torch.softmax(mean_value[:, index], dim=-1)
        out = torch.zeros_like(values).float()
        for i in range(top_k):
            out = out + torch.roll(values, -int(index[i]), -1) * weights[:, i].view(-1, 1, 1, 1)
        return out

    def time_delay_agg_inference(self, values, corr):
        """Each window's own top lags of its correlation averaged over heads and channels."""
        top_k = _top_k(self.factor, values.shape[-1])
        weights, delays = torch.topk(corr.mean(dim=1).mean(dim=1), top_k, dim=-1)
        return _rolled_sum(values, delays, torch.softmax(weights, dim=-1))

    def time_delay_agg_full(self, values, corr):
        """The paper's full version: top lags per window, head and channel."""
        length = values.shape[-1]
        weights, delays = torch.topk(corr, _top_k(self.factor, length), dim=-1)
        weights = torch.softmax(weights, dim=-1)
        doubled = torch.cat([values, values], dim=-1)
        positions = torch.arange(length, device=values.device)
        out = torch.zeros_like(values).float()
        for i in range(delays.shape[-1]):
            pattern = torch.gather(doubled, -1, positions + delays[..., i:i + 1])
            out = out + pattern * weights[..., i:i + 1]
        return out

    def forward(self, queries, keys, values, attn_mask):
        length, source = queries.shape[1], values.shape[1]
        if length > source:  # keys and values zero-padded (or cut) to the queries' length
            zeros = torch.zeros_like(queries[:, :length - source]).float()
            values, keys = torch.cat([values, zeros], dim=1), torch.cat([keys, zeros], dim=1)
        else:
            values, keys = values[:, :length], keys[:, :length]
        # the FFTs in float32 (half precision has none on the CPU); the result in the inputs' dtype
        q_fft = torch.fft.rfft(queries.permute(0, 2, 3, 1).float(), dim=-1)
        k_fft = torch.fft.rfft(keys.permute(0, 2, 3, 1).float(), dim=-1)
        corr = torch.fft.irfft(q_fft * torch.conj(k_fft), dim=-1)  # [B, H, E, L]: every lag at once
        aggregate = self.time_delay_agg_training if self.training else self.time_delay_agg_inference
        out = aggregate(values.permute(0, 2, 3, 1).contiguous(), corr).permute(0, 3, 1, 2).to(values.dtype)
        return out.contiguous(), (corr.permute(0, 3, 1, 2).to(values.dtype) if self.output_attention else None)


class AutoCorrelationLayer(nn.Module):
    """Projections around an inner correlation (AutoCorrelation, FourierBlock, MultiWavelet...)."""

    def __init__(self, correlation, d_model, n_heads, d_keys=None, d_values=None):
        super().__init__()
        d_keys = d_keys or d_model // n_heads
        d_values = d_values or d_model // n_heads
        self.inner_correlation = correlation
        self.query_projection = nn.Linear(d_model, d_keys * n_heads)
        self.key_projection = nn.Linear(d_model, d_keys * n_heads)
        self.value_projection = nn.Linear(d_model, d_values * n_heads)
        self.out_projection = nn.Linear(d_values * n_heads, d_model)
        self.n_heads = n_heads

    def forward(self, queries, keys, values, attn_mask):
        batch, length, source, heads = queries.shape[0], queries.shape[1], keys.shape[1], self.n_heads
        queries = self.query_projection(queries).view(batch, length, heads, -1)
        keys = self.key_projection(keys).view(batch, source, heads, -1)
        values = self.value_projection(values).view(batch, source, heads, -1)
        out, attn = self.inner_correlation(queries, keys, values, attn_mask)
        return self.out_projection(out.view(batch, length, -1)), attn
