"""ETSformer's exponential-smoothing encoder and decoder (Woo et al., "ETSformer: Exponential Smoothing
Transformers for Time-series Forecasting", 2022) under TSLib's module, class and argument names.

The encoder peels off, layer by layer, a seasonal part (the top-k Fourier frequencies, extrapolated over
the horizon) and a growth part (exponential smoothing of first differences), and smooths a level; the
decoder damps the last growth over the horizon and adds the extrapolated seasons.

`Transform` is ETSformer's training augmentation (scale, shift, jitter). Used on its own it draws from
the global generator as TSLib does (one scale and shift per channel for the whole batch); inside the
experiment's keyed training steps each window gets its own draws (layers/noise.py), so a window is
augmented the same whichever process trains it.
"""
import math

import torch
import torch.fft as fft
import torch.nn.functional as F
from einops import rearrange
from scipy.fftpack import next_fast_len
from torch import nn

from layers import noise


class Transform:
    """Scale, shift and jitter x [B, L, C] with standard deviation sigma (training augmentation)."""

    def __init__(self, sigma):
        self.sigma = sigma

    @torch.no_grad()
    def transform(self, x):
        return self.jitter(self.shift(self.scale(x)))

    def _draw(self, x, per_channel):
        if noise.keyed():  # one draw per window, keyed by the window (module docstring)
            shape = (1, x.shape[-1]) if per_channel else x.shape[1:]
            return noise.randn(x.shape[0], *shape, device=x.device, dtype=x.dtype)
        return torch.randn(x.size(-1) if per_channel else x.shape).to(x.device)

    def jitter(self, x):
        return x + self._draw(x, per_channel=False) * self.sigma

    def scale(self, x):
        return x * (self._draw(x, per_channel=True) * self.sigma + 1)

    def shift(self, x):
        return x + self._draw(x, per_channel=True) * self.sigma


def conv1d_fft(f, g, dim=-1):
    """Correlation of f (length N) with the kernel g along dim, through FFTs, keeping N outputs."""
    length = f.size(dim)
    fast_len = next_fast_len(length + g.size(dim) - 1)
    # float32 FFTs (half precision has none on the CPU); the result in f's dtype
    product = fft.rfft(f.float(), fast_len, dim=dim) * fft.rfft(g.float(), fast_len, dim=dim).conj()
    out = fft.irfft(product, fast_len, dim=dim).roll((-1,), dims=(dim,))
    return out.narrow(dim, fast_len - length, length).to(f.dtype)


class ExponentialSmoothing(nn.Module):
    """Per-head exponential smoothing of values [B, T, H, D] with a learned rate and initial state v0."""

    def __init__(self, dim, nhead, dropout=0.1, aux=False):
        super().__init__()
        self._smoothing_weight = nn.Parameter(torch.randn(nhead, 1))
        self.v0 = nn.Parameter(torch.randn(1, 1, nhead, dim))
        self.dropout = nn.Dropout(dropout)
        if aux:
            self.aux_dropout = nn.Dropout(dropout)

    def forward(self, values, aux_values=None):
        init_weight, weight = self.get_exponential_weight(values.shape[1])
        output = init_weight * self.v0 + conv1d_fft(self.dropout(values), weight, dim=1)
        if aux_values is not None:
            aux_weight = weight / (1 - self.weight) * self.weight
            output = output + conv1d_fft(self.aux_dropout(aux_values), aux_weight)  # TSLib: along the last dim
        return output.to(values.dtype)  # the float32 powers promote a half-precision model's values

    def get_exponential_weight(self, T):
        """(alpha^(t+1) for t < T, (1 - alpha) alpha^(T-1-t)) shaped [1, T, H, 1]."""
        powers = torch.arange(T, dtype=torch.float, device=self.weight.device)
        weight = (1 - self.weight) * self.weight ** torch.flip(powers, dims=(0,))
        init_weight = self.weight ** (powers + 1)
        return rearrange(init_weight, 'h t -> 1 t h 1'), rearrange(weight, 'h t -> 1 t h 1')

    @property
    def weight(self):
        return torch.sigmoid(self._smoothing_weight)


class Feedforward(nn.Module):
    """Two bias-free linear maps with an activation (sigmoid by default) and dropout."""

    def __init__(self, d_model, dim_feedforward, dropout=0.1, activation='sigmoid'):
        super().__init__()
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=False)
        self.dropout1 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=False)
        self.dropout2 = nn.Dropout(dropout)
        self.activation = getattr(F, activation)

    def forward(self, x):
        return self.dropout2(self.linear2(self.dropout1(self.activation(self.linear1(x)))))


class GrowthLayer(nn.Module):
    """Growth: first differences of the projected input (z0 before the first step), smoothed."""

    def __init__(self, d_model, nhead, d_head=None, dropout=0.1):
        super().__init__()
        self.d_head = d_head or (d_model // nhead)
        self.d_model = d_model
        self.nhead = nhead
        self.z0 = nn.Parameter(torch.randn(self.nhead, self.d_head))
        self.in_proj = nn.Linear(self.d_model, self.d_head * self.nhead)
        self.es = ExponentialSmoothing(self.d_head, self.nhead, dropout=dropout)
        self.out_proj = nn.Linear(self.d_head * self.nhead, self.d_model)
        assert self.d_head * self.nhead == self.d_model, "d_model must be divisible by nhead"

    def forward(self, inputs):
        batch, length, _ = inputs.shape
        values = self.in_proj(inputs).view(batch, length, self.nhead, -1)
        values = torch.cat([self.z0.expand(batch, 1, -1, -1), values], dim=1)
        out = self.es(values[:, 1:] - values[:, :-1])
        out = torch.cat([self.es.v0.expand(batch, -1, -1, -1), out], dim=1)
        return self.out_proj(rearrange(out, 'b t h d -> b t (h d)'))


class FourierLayer(nn.Module):
    """Season: the k largest-amplitude frequencies of x [B, T, D] (per window and channel),
    extrapolated as cosines over T + pred_len steps."""

    def __init__(self, d_model, pred_len, k=None, low_freq=1):
        super().__init__()
        self.d_model = d_model
        self.pred_len = pred_len
        self.k = k
        self.low_freq = low_freq

    def forward(self, x):
        batch, length, channels = x.shape
        end = -1 if length % 2 == 0 else None  # the Nyquist term of an even length is left out
        x_freq = fft.rfft(x.float(), dim=1)[:, self.low_freq:end]  # float32: see conv1d_fft
        f = fft.rfftfreq(length)[self.low_freq:end].to(x_freq.device)
        x_freq, index_tuple = self.topk_freq(x_freq)
        f = torch.gather(f.view(1, -1, 1).expand(batch, -1, channels), 1, index_tuple)
        return self.extrapolate(x_freq, f.unsqueeze(2), length).to(x.dtype)

    def extrapolate(self, x_freq, f, t):
        x_freq = torch.cat([x_freq, x_freq.conj()], dim=1)
        f = torch.cat([f, -f], dim=1)
        t_val = torch.arange(t + self.pred_len, dtype=torch.float, device=x_freq.device).view(1, 1, -1, 1)
        amp = (x_freq.abs() / t).unsqueeze(2)
        phase = x_freq.angle().unsqueeze(2)
        return (amp * torch.cos(2 * math.pi * f * t_val + phase)).sum(dim=1)

    def topk_freq(self, x_freq):
        """The k largest-amplitude frequencies along dim 1 and their indices (TSLib returns its
        advanced-index tuple; here the [B, k, D] indices)."""
        indices = torch.topk(x_freq.abs(), self.k, dim=1, largest=True, sorted=True)[1]
        return torch.gather(x_freq, 1, indices), indices


class LevelLayer(nn.Module):
    """Level: exponential smoothing of (level - season) with the growth as the auxiliary input."""

    def __init__(self, d_model, c_out, dropout=0.1):
        super().__init__()
        self.d_model = d_model
        self.c_out = c_out
        self.es = ExponentialSmoothing(1, self.c_out, dropout=dropout, aux=True)
        self.growth_pred = nn.Linear(self.d_model, self.c_out)
        self.season_pred = nn.Linear(self.d_model, self.c_out)

    def forward(self, level, growth, season):
        batch, length, _ = level.shape
        growth = self.growth_pred(growth).view(batch, length, self.c_out, 1)
        season = self.season_pred(season).view(batch, length, self.c_out, 1)
        level = level.view(batch, length, self.c_out, 1)
        out = self.es(level - season, aux_values=growth)
        return rearrange(out, 'b t h d -> b t (h d)')


class EncoderLayer(nn.Module):
    """One ETS layer: remove the season, then the growth; feed-forward; update the level."""

    def __init__(self, d_model, nhead, c_out, seq_len, pred_len, k, dim_feedforward=None, dropout=0.1,
                 activation='sigmoid', layer_norm_eps=1e-5):
        super().__init__()
        self.d_model, self.nhead, self.c_out = d_model, nhead, c_out
        self.seq_len, self.pred_len = seq_len, pred_len
        dim_feedforward = dim_feedforward or 4 * d_model
        self.dim_feedforward = dim_feedforward
        self.growth_layer = GrowthLayer(d_model, nhead, dropout=dropout)
        self.seasonal_layer = FourierLayer(d_model, pred_len, k=k)
        self.level_layer = LevelLayer(d_model, c_out, dropout=dropout)
        self.ff = Feedforward(d_model, dim_feedforward, dropout=dropout, activation=activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, res, level, attn_mask=None):
        season = self._season_block(res)
        res = res - season[:, :-self.pred_len]
        growth = self._growth_block(res)
        res = self.norm1(res - growth[:, 1:])
        res = self.norm2(res + self.ff(res))
        level = self.level_layer(level, growth[:, :-1], season[:, :-self.pred_len])
        return res, level, growth, season

    def _growth_block(self, x):
        return self.dropout1(self.growth_layer(x))

    def _season_block(self, x):
        return self.dropout2(self.seasonal_layer(x))


class Encoder(nn.Module):
    """The ETS layers in turn; returns the final level and every layer's growth and season."""

    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, res, level, attn_mask=None):
        growths, seasons = [], []
        for layer in self.layers:
            res, level, growth, season = layer(res, level, attn_mask=None)
            growths.append(growth)
            seasons.append(season)
        return level, growths, seasons


class DampingLayer(nn.Module):
    """The last growth repeated over the horizon with cumulative damping (per head)."""

    def __init__(self, pred_len, nhead, dropout=0.1):
        super().__init__()
        self.pred_len = pred_len
        self.nhead = nhead
        self._damping_factor = nn.Parameter(torch.randn(1, nhead))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x.expand(-1, self.pred_len, -1)
        batch, steps, width = x.shape
        powers = (torch.arange(self.pred_len, device=self._damping_factor.device) + 1).view(-1, 1)
        damping = (self.damping_factor ** powers).cumsum(dim=0)
        x = self.dropout(x.reshape(batch, steps, self.nhead, -1)) * damping.unsqueeze(-1)
        return x.reshape(batch, steps, width)

    @property
    def damping_factor(self):
        return torch.sigmoid(self._damping_factor)


class DecoderLayer(nn.Module):
    """A layer's horizon: its damped growth and its season's extrapolated steps."""

    def __init__(self, d_model, nhead, c_out, pred_len, dropout=0.1):
        super().__init__()
        self.d_model, self.nhead, self.c_out, self.pred_len = d_model, nhead, c_out, pred_len
        self.growth_damping = DampingLayer(pred_len, nhead, dropout=dropout)
        self.dropout1 = nn.Dropout(dropout)

    def forward(self, growth, season):
        growth_horizon = self.dropout1(self.growth_damping(growth[:, -1:]))
        return growth_horizon, season[:, -self.pred_len:]


class Decoder(nn.Module):
    """Sums the layers' growth and season horizons, each projected to c_out channels."""

    def __init__(self, layers):
        super().__init__()
        self.d_model = layers[0].d_model
        self.c_out = layers[0].c_out
        self.pred_len = layers[0].pred_len
        self.nhead = layers[0].nhead
        self.layers = nn.ModuleList(layers)
        self.pred = nn.Linear(self.d_model, self.c_out)

    def forward(self, growths, seasons):
        horizons = [layer(growths[i], seasons[i]) for i, layer in enumerate(self.layers)]
        growth_repr = sum(h[0] for h in horizons)
        season_repr = sum(h[1] for h in horizons)
        return self.pred(growth_repr), self.pred(season_repr)
