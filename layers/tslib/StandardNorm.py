"""TSLib's reversible instance normalisation under its names, signature and state_dict keys
(Time-Series-Library, layers/StandardNorm.py; RevIN, Kim et al., ICLR 2022), on layers/normalization.py's
window_statistics, the statistics of this codebase's own InstanceNorm.
"""
import torch
from torch import nn

from layers.normalization import window_statistics


class Normalize(nn.Module):
    """forward(x, 'norm') z-scores x [B, L, ..., C] over every dimension between the batch and the channels
    (or subtracts the last step, subtract_last) and remembers the statistics; forward(y, 'denorm') undoes it.
    affine: a learned per-channel scale and shift after normalising; non_norm: both modes return x."""

    def __init__(self, num_features: int, eps=1e-5, affine=False, subtract_last=False, non_norm=False):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.affine = affine
        self.subtract_last = subtract_last
        self.non_norm = non_norm
        if self.affine:
            self._init_params()

    def forward(self, x, mode: str):
        if mode == 'norm':
            self._get_statistics(x)
            return self._normalize(x)
        if mode == 'denorm':
            return self._denormalize(x)
        raise NotImplementedError(f"Normalize mode must be 'norm' or 'denorm', got {mode!r}")

    def _init_params(self):
        self.affine_weight = nn.Parameter(torch.ones(self.num_features))
        self.affine_bias = nn.Parameter(torch.zeros(self.num_features))

    def _get_statistics(self, x):
        mean, self.stdev = window_statistics(x, self.eps, tuple(range(1, x.ndim - 1)))
        if self.subtract_last:
            self.last = x[:, -1, :].unsqueeze(1)
        else:
            self.mean = mean

    def _normalize(self, x):
        if self.non_norm:
            return x
        x = (x - (self.last if self.subtract_last else self.mean)) / self.stdev
        if self.affine:
            x = x * self.affine_weight + self.affine_bias
        return x

    def _denormalize(self, x):
        if self.non_norm:
            return x
        if self.affine:
            x = (x - self.affine_bias) / (self.affine_weight + self.eps * self.eps)
        return x * self.stdev + (self.last if self.subtract_last else self.mean)
