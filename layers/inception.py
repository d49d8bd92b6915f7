"""Inception block of TimesNet (TSLib's Inception_Block_V1): `num_kernels` parallel 2-D convolutions with
square kernels 1, 3, 5, ... ("same" zero padding), whose outputs are averaged.

The average of convolutions is one convolution with the averaged (centre-aligned, zero-filled) kernel, so
the forward pass runs a single Conv2d instead of `num_kernels`: the same function with fewer operations.
The per-size kernels stay separate parameters, initialised and named as in TSLib (kernels.<i>.weight).
"""
import torch
from torch import nn
from torch.nn import functional as F


class InceptionBlock(nn.Module):
    """[B, in_channels, H, W] -> [B, out_channels, H, W]."""

    def __init__(self, in_channels: int, out_channels: int, num_kernels: int = 6):
        super().__init__()
        if num_kernels < 1:
            raise ValueError(f"num_kernels must be at least 1, got {num_kernels}")
        self.num_kernels = num_kernels
        self.kernels = nn.ModuleList(
            nn.Conv2d(in_channels, out_channels, kernel_size=2 * i + 1, padding=i) for i in range(num_kernels)
        )
        for conv in self.kernels:
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(conv.bias)

    def merged_kernel(self):
        """(weight [out, in, 2n-1, 2n-1], bias [out]) of the single equivalent convolution."""
        widest = self.num_kernels - 1
        weight = sum(
            F.pad(conv.weight, [widest - i] * 4) for i, conv in enumerate(self.kernels)
        ) / self.num_kernels
        bias = torch.stack([conv.bias for conv in self.kernels]).mean(0)
        return weight, bias

    def forward(self, x: torch.Tensor, merged=None) -> torch.Tensor:
        """`merged`: this block's merged_kernel(), when the caller applies the block to several inputs
        and builds it once (TimesNet, once per period)."""
        weight, bias = merged if merged is not None else self.merged_kernel()
        widest = self.num_kernels - 1
        # Kernel taps further than (size - 1) from the centre only ever meet zero padding: crop them.
        reach_h, reach_w = min(widest, x.shape[-2] - 1), min(widest, x.shape[-1] - 1)
        weight = weight[..., widest - reach_h: widest + reach_h + 1, widest - reach_w: widest + reach_w + 1]
        return F.conv2d(x, weight, bias, padding=(reach_h, reach_w))
