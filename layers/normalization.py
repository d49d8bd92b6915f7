"""Instance normalisation over time (RevIN without, or with, a learned affine map).

Used by the channel-independent and Transformer forecasters: each window is z-scored per
channel with its own statistics before the network, and the forecast is mapped back.
"""
import torch
from torch import nn


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
        self.mean = x.mean(1, keepdim=True).detach()
        self.std = torch.sqrt(x.var(1, keepdim=True, unbiased=False) + self.eps).detach()
        x = (x - self.mean) / self.std
        return x * self.weight + self.bias if self.affine else x

    def denorm(self, y: torch.Tensor) -> torch.Tensor:
        """y [B, T, C] (or [B, T, C'] where C' <= C keeps the last C' channels' statistics)."""
        mean, std = self.mean[..., -y.shape[-1]:], self.std[..., -y.shape[-1]:]
        if self.affine:
            y = (y - self.bias[-y.shape[-1]:]) / (self.weight[-y.shape[-1]:] + self.eps * self.eps)
        return y * std + mean
