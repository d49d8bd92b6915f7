"""FEDformer's frequency-enhanced blocks (Zhou et al., "FEDformer: Frequency Enhanced Decomposed
Transformer for Long-term Series Forecasting", ICML 2022) under TSLib's module, class and argument names.

Both blocks work on a fixed subset of Fourier modes chosen at construction: the lowest `modes` ones, or
(mode_select_method='random', the default) `modes` of them drawn from NumPy's global generator, as TSLib
draws them, so a seeded run builds the same model.
"""
import numpy as np
import torch
from torch import nn


def get_frequency_modes(seq_len, modes=64, mode_select_method='random'):
    """The sorted mode indices a block keeps out of seq_len // 2: random draws or the lowest ones."""
    modes = min(modes, seq_len // 2)
    if mode_select_method == 'random':
        index = list(range(seq_len // 2))
        np.random.shuffle(index)  # NumPy's global generator, as TSLib (the seed picks the modes)
        index = index[:modes]
    else:
        index = list(range(modes))
    return sorted(index)


def _complex_weights(weights1, weights2):
    return torch.complex(weights1.float(), weights2.float())


def _rfft(x):
    """rfft over the last dim in float32 (half precision has no CPU FFT); blocks return their input's dtype."""
    return torch.fft.rfft(x.float(), dim=-1)


def _select_modes(x_ft, index):
    """x_ft[..., index] with a zero column where an index lies past the spectrum (a shorter input)."""
    out = x_ft.new_zeros(*x_ft.shape[:-1], len(index))
    kept = [i for i, j in enumerate(index) if j < x_ft.shape[-1]]
    if kept:
        out[..., kept] = x_ft[..., [index[i] for i in kept]]
    return out


def _attend(xq_ft, xk_ft, activation):
    """Attention between query and key modes, in the frequency domain: [B, H, E, Mq] x [B, H, E, Mk]."""
    scores = torch.einsum("bhex,bhey->bhxy", xq_ft, xk_ft)
    if activation == 'tanh':
        scores = torch.complex(scores.real.tanh(), scores.imag.tanh())
    elif activation == 'softmax':
        scores = torch.softmax(scores.abs(), dim=-1)
        scores = torch.complex(scores, torch.zeros_like(scores))
    else:
        raise ValueError(f"{activation} activation function is not implemented (tanh or softmax)")
    return torch.einsum("bhxy,bhey->bhex", scores, xk_ft)


class FourierBlock(nn.Module):
    """Frequency-enhanced self-attention: a learned complex linear map per kept mode, per head."""

    def __init__(self, in_channels, out_channels, n_heads, seq_len, modes=0, mode_select_method='random'):
        super().__init__()
        self.index = get_frequency_modes(seq_len, modes=modes, mode_select_method=mode_select_method)
        self.n_heads = n_heads
        self.scale = 1 / (in_channels * out_channels)
        shape = (n_heads, in_channels // n_heads, out_channels // n_heads, len(self.index))
        self.weights1 = nn.Parameter(self.scale * torch.rand(*shape, dtype=torch.float))
        self.weights2 = nn.Parameter(self.scale * torch.rand(*shape, dtype=torch.float))

    def forward(self, q, k, v, mask):
        length = q.shape[1]
        x_ft = _rfft(q.permute(0, 2, 3, 1))  # [B, H, E, L // 2 + 1]
        # TSLib writes the w-th kept mode's output to frequency w (not to the mode's own frequency).
        kept = [w for w, i in enumerate(self.index) if i < x_ft.shape[-1] and w < x_ft.shape[-1]]
        out_ft = x_ft.new_zeros(x_ft.shape)
        if kept:
            selected = x_ft[..., [self.index[w] for w in kept]]
            weights = _complex_weights(self.weights1, self.weights2)[..., kept]
            out_ft[..., kept] = torch.einsum("bhim,hiom->bhom", selected, weights)
        return torch.fft.irfft(out_ft, n=length).to(q.dtype), None


class FourierCrossAttention(nn.Module):
    """Frequency-enhanced cross-attention between the kept modes of queries and keys."""

    def __init__(self, in_channels, out_channels, seq_len_q, seq_len_kv, modes=64, mode_select_method='random',
                 activation='tanh', policy=0, num_heads=8):
        super().__init__()
        self.activation = activation
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.index_q = get_frequency_modes(seq_len_q, modes=modes, mode_select_method=mode_select_method)
        self.index_kv = get_frequency_modes(seq_len_kv, modes=modes, mode_select_method=mode_select_method)
        self.scale = 1 / (in_channels * out_channels)
        shape = (num_heads, in_channels // num_heads, out_channels // num_heads, len(self.index_q))
        self.weights1 = nn.Parameter(self.scale * torch.rand(*shape, dtype=torch.float))
        self.weights2 = nn.Parameter(self.scale * torch.rand(*shape, dtype=torch.float))

    def forward(self, q, k, v, mask):
        length = q.shape[1]
        xq_ft = _select_modes(_rfft(q.permute(0, 2, 3, 1)), self.index_q)
        xk_ft = _select_modes(_rfft(k.permute(0, 2, 3, 1)), self.index_kv)
        xqkv_ft = _attend(xq_ft, xk_ft, self.activation)
        xqkvw = torch.einsum("bhex,heox->bhox", xqkv_ft, _complex_weights(self.weights1, self.weights2))
        out_ft = xqkvw.new_zeros(*xqkvw.shape[:-1], length // 2 + 1)
        kept = [i for i, j in enumerate(self.index_q) if j < out_ft.shape[-1]]
        if kept:
            out_ft[..., [self.index_q[i] for i in kept]] = xqkvw[..., kept]
        return torch.fft.irfft(out_ft / self.in_channels / self.out_channels, n=length).to(q.dtype), None
