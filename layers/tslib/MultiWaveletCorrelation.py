"""FEDformer's multiwavelet blocks (Zhou et al., "FEDformer", ICML 2022; the multiwavelet transform of
Gupta, Xiao and Bogdan, "Multiwavelet-based Operator Learning for Differential Equations", NeurIPS 2021)
under TSLib's module, class and argument names.

A series is split level by level into detail (d) and smooth (s) coefficients with Legendre multiwavelet
filters (Alpert's construction: the scaling functions are the first k normalised shifted Legendre
polynomials on [0, 1], the wavelets are made orthogonal to them by Gram-Schmidt, and the two-scale
filters are Gauss-Legendre quadratures). The filters are fixed buffers in the state_dict, as in TSLib.
Only the Legendre base is offered ('chebyshev' is refused in one line).
"""
import math

import numpy as np
import torch
from torch import nn
from scipy.special import eval_legendre

from layers.tslib.FourierCorrelation import _attend, _complex_weights, _rfft


# ---------- Legendre multiwavelet filters (float64 NumPy, built once per block) ----------
# Every function here is a polynomial of degree < k on each half of [0, 1], so it is represented by its
# values at the k Gauss-Legendre nodes of each half, where quadrature is exact: the Gram-Schmidt stays
# well conditioned (TSLib's runs on monomial coefficients; see get_filter).

def _phi(degree, points):
    """The normalised shifted Legendre polynomial sqrt(2d + 1) P_d(2x - 1) at points in [0, 1]."""
    return np.sqrt(2 * degree + 1) * eval_legendre(degree, 2 * points - 1)


def _wavelets_on_halves(k, low, high, weights):
    """[k, 2k] values of the k wavelets at the nodes `low` (in [0, 1/2]) then `high` (in [1/2, 1]): the
    finer scaling functions sqrt(2) phi(2x) made orthonormal to every phi and to the earlier wavelets."""
    inner = np.concatenate([weights, weights])
    phi = np.stack([np.concatenate([_phi(d, low), _phi(d, high)]) for d in range(k)])
    psi = np.zeros((k, 2 * k))
    for degree in range(k):
        v = np.concatenate([np.sqrt(2) * _phi(degree, 2 * low), np.zeros(k)])
        for basis in (phi, psi[:degree]):
            for _ in range(2):  # Gram-Schmidt twice: orthogonal to rounding
                v = v - ((basis * inner) @ v) @ basis
        psi[degree] = v / np.sqrt((v * v * inner).sum())
    return psi


def get_filter(base, k):
    """TSLib's (H0, H1, G0, G1, PHI0, PHI1): the two-scale filters of the order-k Legendre multiwavelets
    (Alpert 1993), H for the scaling functions, G for the wavelets, 0 / 1 for the two halves.

    The exact filters (orthogonal to 1e-15). TSLib builds the same ones from monomial coefficients, which
    loses digits as k grows (about 1e-13 off at k = 3, visibly off at its default k = 8); its filters are
    buffers in the state_dict, so a TSLib checkpoint brings its own."""
    if base != 'legendre':
        raise ValueError(f"multiwavelet base {base!r} is not offered here; use base='legendre'")
    nodes, weights = np.polynomial.legendre.leggauss(k)
    x, w = (nodes + 1) / 2, weights / 2  # Gauss-Legendre on [0, 1]
    psi = _wavelets_on_halves(k, x / 2, (x + 1) / 2, w / 2)
    phi_x = np.stack([_phi(d, x) for d in range(k)])  # [k, nodes]
    h0 = np.stack([_phi(d, x / 2) for d in range(k)]) * w @ phi_x.T / np.sqrt(2)
    h1 = np.stack([_phi(d, (x + 1) / 2) for d in range(k)]) * w @ phi_x.T / np.sqrt(2)
    g0 = psi[:, :k] * w @ phi_x.T / np.sqrt(2)
    g1 = psi[:, k:] * w @ phi_x.T / np.sqrt(2)
    for f in (h0, h1, g0, g1):
        f[np.abs(f) < 1e-8] = 0
    return h0, h1, g0, g1, np.eye(k), np.eye(k)


class _WaveletFilters(nn.Module):
    """The decomposition (ec_s, ec_d) and reconstruction (rc_e, rc_o) buffers and their two steps."""

    def _register_filters(self, base, k):
        h0, h1, g0, g1, phi0, phi1 = get_filter(base, k)
        rc = [m for m in (h0 @ phi0, g0 @ phi0, h1 @ phi1, g1 @ phi1)]
        for m in rc:
            m[np.abs(m) < 1e-8] = 0
        self.register_buffer('ec_s', torch.tensor(np.concatenate((h0.T, h1.T)), dtype=torch.float32))
        self.register_buffer('ec_d', torch.tensor(np.concatenate((g0.T, g1.T)), dtype=torch.float32))
        self.register_buffer('rc_e', torch.tensor(np.concatenate((rc[0], rc[1])), dtype=torch.float32))
        self.register_buffer('rc_o', torch.tensor(np.concatenate((rc[2], rc[3])), dtype=torch.float32))

    def wavelet_transform(self, x):
        """(detail, smooth) of x [B, N, c, k] at half the length."""
        pairs = torch.cat([x[:, ::2], x[:, 1::2]], -1)
        return torch.matmul(pairs, self.ec_d), torch.matmul(pairs, self.ec_s)

    def evenOdd(self, x):
        """Reconstruction: [B, N, c, 2k] (smooth ++ detail) to [B, 2N, c, k], even and odd steps interleaved."""
        batch, length, c, width = x.shape
        assert width == 2 * self.k
        even, odd = torch.matmul(x, self.rc_e), torch.matmul(x, self.rc_o)
        return torch.stack([even, odd], dim=2).reshape(batch, 2 * length, c, self.k)


def _pad_to_power_of_two(x):
    """x [B, N, ...] continued with its own first steps up to the next power of two; (x, levels)."""
    length = x.shape[1]
    padded = 2 ** math.ceil(math.log2(length))
    return torch.cat([x, x[:, :padded - length]], 1), math.floor(math.log2(length))


def _pad_or_cut(length, keys, values, like):
    """Keys and values zero-padded or cut to the queries' length."""
    if length > values.shape[1]:
        zeros = torch.zeros_like(like[:, :length - values.shape[1]]).float()
        return torch.cat([keys, zeros], dim=1), torch.cat([values, zeros], dim=1)
    return keys[:, :length], values[:, :length]


class sparseKernelFT1d(nn.Module):
    """A learned complex linear map on the lowest `alpha` Fourier modes of x [B, N, c, k]."""

    def __init__(self, k, alpha, c=1, nl=1, initializer=None, **kwargs):
        super().__init__()
        self.modes1 = alpha
        self.scale = 1 / (c * k * c * k)
        self.weights1 = nn.Parameter(self.scale * torch.rand(c * k, c * k, self.modes1, dtype=torch.float))
        self.weights2 = nn.Parameter(self.scale * torch.rand(c * k, c * k, self.modes1, dtype=torch.float))
        self.k = k

    def forward(self, x):
        batch, length, c, k = x.shape
        x_fft = torch.fft.rfft(x.reshape(batch, length, -1).permute(0, 2, 1).float())  # float32: see _rfft
        kept = min(self.modes1, length // 2 + 1)
        weights = _complex_weights(self.weights1, self.weights2)[:, :, :kept]
        out_ft = x_fft.new_zeros(batch, c * k, length // 2 + 1)
        out_ft[:, :, :kept] = torch.einsum("bix,iox->box", x_fft[:, :, :kept], weights)
        return torch.fft.irfft(out_ft, n=length).permute(0, 2, 1).reshape(batch, length, c, k).to(x.dtype)


class MWT_CZ1d(_WaveletFilters):
    """One multiwavelet layer: decompose, a sparse Fourier kernel per level, reconstruct."""

    def __init__(self, k=3, alpha=64, L=0, c=1, base='legendre', initializer=None, **kwargs):
        super().__init__()
        self.k, self.L = k, L
        self.max_item = 3
        self.A = sparseKernelFT1d(k, alpha, c)
        self.B = sparseKernelFT1d(k, alpha, c)
        self.C = sparseKernelFT1d(k, alpha, c)
        self.T0 = nn.Linear(k, k)
        self._register_filters(base, k)

    def forward(self, x):
        length = x.shape[1]
        x, levels = _pad_to_power_of_two(x)
        details, smooths = [], []
        for _ in range(levels - self.L):
            d, x = self.wavelet_transform(x)
            details.append(self.A(d) + self.B(x))
            smooths.append(self.C(d))
        x = self.T0(x)  # the coarsest scale
        for i in range(levels - 1 - self.L, -1, -1):
            x = self.evenOdd(torch.cat((x + smooths[i], details[i]), -1))
        return x[:, :length]


class MultiWaveletTransform(nn.Module):
    """Multiwavelet self-attention replacement: values lifted to c x k, nCZ multiwavelet layers, back."""

    def __init__(self, ich=1, k=8, alpha=16, c=128, nCZ=1, L=0, base='legendre', attention_dropout=0.1):
        super().__init__()
        self.k, self.c, self.L, self.nCZ, self.ich = k, c, L, nCZ, ich
        self.Lk0 = nn.Linear(ich, c * k)
        self.Lk1 = nn.Linear(c * k, ich)
        self.MWT_CZ = nn.ModuleList(MWT_CZ1d(k, alpha, L, c, base) for _ in range(nCZ))

    def forward(self, queries, keys, values, attn_mask):
        batch, length = queries.shape[:2]
        width = values.shape[-1]
        keys, values = _pad_or_cut(length, keys, values, queries)
        v = self.Lk0(values.reshape(batch, length, -1)).view(batch, length, self.c, -1)
        for i in range(self.nCZ):
            v = self.MWT_CZ[i](v)
            if i < self.nCZ - 1:
                v = torch.relu(v)
        v = self.Lk1(v.reshape(batch, length, -1)).view(batch, length, -1, width)
        return v.contiguous(), None


class FourierCrossAttentionW(nn.Module):
    """Cross-attention between the lowest Fourier modes of q and k, for one wavelet level (no weights)."""

    def __init__(self, in_channels, out_channels, seq_len_q, seq_len_kv, modes=16, activation='tanh',
                 mode_select_method='random'):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.modes1 = modes
        self.activation = activation

    def forward(self, q, k, v, mask):
        length = q.shape[1]
        xq_ft = _rfft(q.permute(0, 3, 2, 1))[..., :min(length // 2, self.modes1)]
        xk_ft = _rfft(k.permute(0, 3, 2, 1))[..., :min(v.shape[1] // 2, self.modes1)]
        xqkv_ft = _attend(xq_ft, xk_ft, self.activation)
        out_ft = xqkv_ft.new_zeros(*xqkv_ft.shape[:-1], length // 2 + 1)
        out_ft[..., :xqkv_ft.shape[-1]] = xqkv_ft
        out = torch.fft.irfft(out_ft / self.in_channels / self.out_channels, n=length)
        return out.permute(0, 3, 2, 1).to(q.dtype), None


class MultiWaveletCross(_WaveletFilters):
    """Multiwavelet cross-attention: q, k, v decomposed level by level, Fourier cross-attention on
    each level's details and smooth parts, then reconstructed."""

    def __init__(self, in_channels, out_channels, seq_len_q, seq_len_kv, modes, c=64, k=8, ich=512, L=0,
                 base='legendre', mode_select_method='random', initializer=None, activation='tanh', **kwargs):
        super().__init__()
        self.c, self.k, self.L = c, k, L
        self.max_item = 3
        for name in ('attn1', 'attn2', 'attn3', 'attn4'):
            setattr(self, name, FourierCrossAttentionW(in_channels, out_channels, seq_len_q, seq_len_kv, modes,
                                                       activation, mode_select_method))
        self.T0 = nn.Linear(k, k)
        self._register_filters(base, k)
        self.Lk = nn.Linear(ich, c * k)
        self.Lq = nn.Linear(ich, c * k)
        self.Lv = nn.Linear(ich, c * k)
        self.out = nn.Linear(c * k, ich)
        self.modes1 = modes

    def _lift(self, projection, x):
        return projection(x.reshape(x.shape[0], x.shape[1], -1)).view(x.shape[0], x.shape[1], self.c, self.k)

    def _decompose(self, x, levels):
        parts = []
        for _ in range(levels - self.L):
            d, x = self.wavelet_transform(x)
            parts.append((d, x))
        return parts, x

    def forward(self, q, k, v, mask=None):
        batch, length = q.shape[:2]
        q, k, v = self._lift(self.Lq, q), self._lift(self.Lk, k), self._lift(self.Lv, v)
        k, v = _pad_or_cut(length, k, v, q)
        (q, levels), (k, _), (v, _) = (_pad_to_power_of_two(t) for t in (q, k, v))
        (parts_q, q), (parts_k, k), (parts_v, v) = (self._decompose(t, levels) for t in (q, k, v))
        details, smooths = [], []
        for (dq, sq), (dk, sk), (dv, sv) in zip(parts_q, parts_k, parts_v):
            details.append(self.attn1(dq, dk, dv, mask)[0] + self.attn2(sq, sk, sv, mask)[0])
            smooths.append(self.attn3(dq, dk, dv, mask)[0])  # TSLib attends the details here too
        v = self.attn4(q, k, v, mask)[0]
        for i in range(levels - 1 - self.L, -1, -1):
            v = self.evenOdd(torch.cat((v + smooths[i], details[i]), -1))
        return self.out(v[:, :length].contiguous().view(batch, length, -1)).contiguous(), None
