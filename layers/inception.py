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

    def __init__(self, in_channels: int, out_channels: int, num_kernels: int = 6, init_weight: bool = True):
        super().__init__()
        if num_kernels < 1:
            raise ValueError(f"num_kernels must be at least 1, got {num_kernels}")
        self.num_kernels = num_kernels
        self.kernels = nn.ModuleList(self.convolutions(in_channels, out_channels, num_kernels))
        if init_weight:
            for conv in self.kernels:
                nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(conv.bias)
        # the merged kernel's half sizes (rows, columns): the largest of its convolutions'
        self.reach = tuple(max(conv.kernel_size[d] // 2 for conv in self.kernels) for d in (0, 1))

    @staticmethod
    def convolutions(in_channels, out_channels, num_kernels):
        """The parallel convolutions, "same" zero padding: square, sizes 1, 3, 5, ... (TSLib's V1)."""
        return [nn.Conv2d(in_channels, out_channels, kernel_size=2 * i + 1, padding=i) for i in range(num_kernels)]

    def merged_kernel(self):
        """(weight [out, in, 2 reach + 1], bias [out]) of the single equivalent convolution."""
        reach_h, reach_w = self.reach
        weight = sum(
            F.pad(conv.weight, [reach_w - conv.kernel_size[1] // 2] * 2 + [reach_h - conv.kernel_size[0] // 2] * 2)
            for conv in self.kernels
        ) / len(self.kernels)
        bias = torch.stack([conv.bias for conv in self.kernels]).mean(0)
        return weight, bias

    def forward(self, x: torch.Tensor, merged=None) -> torch.Tensor:
        """`merged`: this block's merged_kernel(), when the caller applies the block to several inputs
        and builds it once (TimesNet, once per period)."""
        weight, bias = merged if merged is not None else self.merged_kernel()
        (widest_h, widest_w), (height, width) = self.reach, x.shape[-2:]
        # Kernel taps further than (size - 1) from the centre only ever meet zero padding: crop them.
        reach_h, reach_w = min(widest_h, height - 1), min(widest_w, width - 1)
        weight = weight[..., widest_h - reach_h: widest_h + reach_h + 1, widest_w - reach_w: widest_w + reach_w + 1]
        return F.conv2d(x, weight, bias, padding=(reach_h, reach_w))
