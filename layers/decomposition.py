"""Series decomposition into a moving-average trend and a seasonal remainder (Autoformer / DLinear).

One moving average, two ways to compute it: `moving_average` pools (O(L k), TSLib's own arithmetic:
Autoformer's family, layers/tslib/Autoformer_EncDec, uses it), `moving_average_matrix` is the same linear map
as an [L, L] matrix, which DLinear and TimeMixer fold into their own products.
"""
import torch
import torch.nn.functional as F
from torch import nn


def moving_average(x: torch.Tensor, kernel_size: int, stride: int = 1, same_length: bool = True) -> torch.Tensor:
    """Replicate-padded moving average of x [B, L, C] over time: (kernel_size - 1) // 2 copies of the first
    value in front, and at the end as many as keep the length (same_length) or, as TSLib's moving_avg
    pads, (kernel_size - 1) // 2 (one fewer output for an even kernel); then averages with `stride`."""
    front = (kernel_size - 1) // 2
    end = kernel_size - 1 - front if same_length else front
    padded = torch.cat([x[:, :1].expand(-1, front, -1), x, x[:, -1:].expand(-1, end, -1)], dim=1)
    return F.avg_pool1d(padded.transpose(1, 2), kernel_size, stride).transpose(1, 2)


def moving_average_matrix(length: int, kernel_size: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """[length, length] matrix A with (A @ x)[t] = replicate-padded moving average of x at t.

    The padding repeats the first value (kernel_size - 1) // 2 times in front and the last value
    kernel_size - 1 - (kernel_size - 1) // 2 times at the end, then averages `kernel_size` values with
    stride 1. For odd kernels (the only ones TSLib's `moving_avg` accepts without a shape error) this is
    exactly TSLib's `front/end repeat + AvgPool1d(kernel_size, stride=1)`.
    """
    if kernel_size < 1:
        raise ValueError(f"kernel_size must be >= 1, got {kernel_size}")
    front = (kernel_size - 1) // 2
    # Padded position t + j maps back to the clamped original index: that is what replication means.
    source = (torch.arange(length).unsqueeze(1) + torch.arange(kernel_size).unsqueeze(0) - front).clamp_(0, length - 1)
    matrix = torch.zeros(length, length, dtype=torch.float64)
    matrix.scatter_add_(1, source, torch.full(source.shape, 1.0 / kernel_size, dtype=torch.float64))
    return matrix.to(dtype=dtype, device=device)


class SeriesDecomposition(nn.Module):
    """Split x [B, L, C] into (seasonal, trend), trend = replicate-padded moving average over time.

    The moving average is a fixed linear map on the time axis, so it is applied as one [L, L] matmul.
    The matrix is a non-persistent buffer (not in the state_dict); it is built for `length` up front
    when given, and rebuilt lazily whenever a different input length (or device) shows up.
    pooled=True computes the same average by pooling instead (O(L k) rather than O(L^2); TSLib's
    series_decomp, which wide Autoformer-family layers call many times).
    """

    def __init__(self, kernel_size: int, length: int | None = None, pooled: bool = False):
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"kernel_size must be >= 1, got {kernel_size}")
        self.kernel_size, self.pooled = kernel_size, pooled
        initial = moving_average_matrix(length, kernel_size) if length and not pooled else torch.empty(0, 0)
        self.register_buffer("averaging_matrix", initial, persistent=False)

    def forward(self, x: torch.Tensor):
        if self.pooled:
            trend = moving_average(x, self.kernel_size)
            return x - trend, trend
        length = x.shape[1]
        if self.averaging_matrix.shape[0] != length or self.averaging_matrix.device != x.device:
            self.averaging_matrix = moving_average_matrix(length, self.kernel_size, device=x.device)
        trend = torch.matmul(self.averaging_matrix.to(x.dtype), x)  # [L, L] @ [B, L, C] -> [B, L, C]
        return x - trend, trend

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}"
