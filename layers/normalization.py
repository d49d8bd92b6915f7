"""Instance normalisation over time (RevIN without, or with, a learned affine map).

Used by the channel-independent and Transformer forecasters: each window is z-scored per
channel with its own statistics before the network, and the forecast is mapped back. TSLib's
layers/tslib/StandardNorm.Normalize (its names and keys) computes with this module's window_statistics.
"""
import torch
from torch import nn


def window_statistics(x: torch.Tensor, eps: float, dims=(1,)):
    """Mean and standard deviation (biased, eps inside the root) of x over `dims`, kept for broadcasting and
    detached: RevIN's statistics (Kim et al., ICLR 2022), InstanceNorm's and TSLib's StandardNorm.Normalize's."""
    mean = x.mean(dims, keepdim=True).detach()
    std = torch.sqrt(x.var(dims, keepdim=True, unbiased=False) + eps).detach()
    return mean, std


class InstanceNorm(nn.Module):
    """`norm(x)` z-scores x [B, L, C] over L and remembers the statistics; `denorm(y)` undoes it.

    The statistics are detached, as in PatchTST/iTransformer/TimeMixer: gradients do not flow
    through the mean and standard deviation.
    """

    def __init__(self, num_features: int = 0, eps: float = 1e-5, affine: bool = False):
        super().__init__()
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        self.mean, self.std = window_statistics(x, self.eps)
        x = (x - self.mean) / self.std
        return x * self.weight + self.bias if self.affine else x

    def denorm(self, y: torch.Tensor) -> torch.Tensor:
        """y [B, T, C] (or [B, T, C'] where C' <= C keeps the last C' channels' statistics)."""
        mean, std = self.mean[..., -y.shape[-1]:], self.std[..., -y.shape[-1]:]
        if self.affine:
            y = (y - self.bias[-y.shape[-1]:]) / (self.weight[-y.shape[-1]:] + self.eps * self.eps)
        return y * std + mean
