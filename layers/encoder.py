"""Encoder/decoder Transformer blocks (Vaswani et al. 2017, post-norm), as TSLib's Transformer,
iTransformer and PatchTST use them. Attention runs through PyTorch's fused
scaled_dot_product_attention (flash/memory-efficient kernels where the device has them).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def activation_fn(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


def dropout_noise(like: torch.Tensor, p: float) -> torch.Tensor:
    """The factor F.dropout multiplies by, for a tensor like `like`: 1 / (1 - p) with probability 1 - p, else 0.

    The same distribution as F.dropout's mask (its draws differ for the same seed) from fewer random
    numbers, which is what counts on the CPU, whose serial generator is, with F.dropout's double per
    element, the dearest part of a small training step after the matrix products. For the usual small p
    only the dropped positions are drawn (dropped_positions: some p random numbers per element); otherwise
    one 31-bit integer per element, kept if below (1 - p) * 2**31.
    """
    keep = 1.0 - p
    if keep == 0.0:
        return torch.zeros_like(like)
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    if p < 0.25:
        noise = torch.full(like.shape, 1.0 / keep, dtype=dtype, device=like.device)
        noise.view(-1).index_fill_(0, dropped_positions(noise.numel(), p, like.device), 0.0)
        return noise.to(like.dtype)
    bits = torch.empty(like.shape, dtype=torch.int32, device=like.device).random_()  # uniform on [0, 2**31)
    return bits.to(dtype).lt_(keep * 2.0**31).div_(keep).to(like.dtype)


def dropout_noises(like: torch.Tensor, p: float, *shapes) -> list[torch.Tensor]:
    """dropout_noise for tensors of several shapes (dtype and device of `like`), drawn at once."""
    sizes = [math.prod(shape) for shape in shapes]
    noise = dropout_noise(like.new_empty(sum(sizes)), p)
    return [part.view(shape) for part, shape in zip(noise.split(sizes), shapes)]


def dropped_positions(n: int, p: float, device=None) -> torch.Tensor:
    """The positions in [0, n) that independent Bernoulli(p) trials hit, in increasing order.

    Sampled by the gaps between hits, geometric: floor(log(u) / log(1 - p)) misses before each hit for u
    uniform on (0, 1] with 31 random bits (so the distribution is exact to 2**-31); about n * p draws."""
    if n == 0:
        return torch.empty(0, dtype=torch.long, device=device)
    log_miss = math.log1p(-p)
    chunks, start = [], 0
    while start < n:  # a second round has a probability of about 1e-9
        expected = (n - start) * p
        draws = int(expected + 6.0 * math.sqrt(expected) + 16)
        u = torch.empty(draws, dtype=torch.int32, device=device).random_().to(torch.float64).add_(1.0).mul_(2.0**-31)
        steps = u.log_().div_(log_miss).floor_().add_(1.0)  # from one hit to the next
        positions = steps.cumsum_(0).add_(start - 1)  # integers in float64: exact below 2**53
        chunks.append(positions)
        start = int(positions[-1]) + 1
    positions = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
    return positions[: int(torch.searchsorted(positions, float(n)))].long()


def dropout(x: torch.Tensor, p: float, training: bool, noise: torch.Tensor | None = None) -> torch.Tensor:
    """F.dropout(x, p, training), with dropout_noise's cheaper mask on the CPU (GPUs have a fused kernel);
    `noise`: that mask, drawn already (dropout_noises)."""
    if noise is not None:
        return x * noise
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return x * dropout_noise(x, p)


def add_dropout(x: torch.Tensor, y: torch.Tensor, p: float, training: bool,
                noise: torch.Tensor | None = None) -> torch.Tensor:
    """x + dropout(y, p, training, noise), the residual connection after a sublayer: one multiply-add
    on the CPU."""
    if noise is None and (not training or p == 0.0):
        return x + y
    if noise is None and y.device.type != "cpu":
        return x + F.dropout(y, p, True)
    return torch.addcmul(x, y, dropout_noise(y, p) if noise is None else noise)


class AttentionLayer(nn.Module):
    """Multi-head attention: project queries/keys/values, attend per head, project back."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.1, causal: bool = False):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads, self.causal, self.dropout = n_heads, causal, dropout
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # [B, L, d] -> [B, H, L, d / H]
        return x.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        attended = F.scaled_dot_product_attention(
            self._heads(self.query(queries)), self._heads(self.key(keys)), self._heads(self.value(values)),
            dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal)
        return self.out(attended.transpose(1, 2).flatten(-2))


class FeedForward(nn.Module):
    """d_model -> d_ff -> d_model, pointwise (TSLib's kernel-size-1 Conv1d pair, as Linear layers)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1, activation: str = "gelu"):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = activation_fn(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class EncoderLayer(nn.Module):
    """x = norm1(x + attn(x)); out = norm2(x + FFN(x))."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, dropout: float = 0.1,
                 activation: str = "gelu", norm: str = "layer"):
        super().__init__()
        self.attention = AttentionLayer(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff or 4 * d_model, dropout, activation)
        self.norm1, self.norm2 = _norm(norm, d_model), _norm(norm, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.attention(x, x, x)))
        return self.norm2(x + self.feed_forward(x))


class Encoder(nn.Module):
    """A stack of EncoderLayers and a final norm."""

    def __init__(self, layers: list[nn.Module], d_model: int, norm: str = "layer"):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = _norm(norm, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder output, feed-forward; post-norm."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, dropout: float = 0.1,
                 activation: str = "gelu"):
        super().__init__()
        self.self_attention = AttentionLayer(d_model, n_heads, dropout, causal=True)
        self.cross_attention = AttentionLayer(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff or 4 * d_model, dropout, activation)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.self_attention(x, x, x)))
        x = self.norm2(x + self.dropout(self.cross_attention(x, memory, memory)))
        return self.norm3(x + self.feed_forward(x))


class Decoder(nn.Module):
    """A stack of DecoderLayers, a final LayerNorm and an optional output projection."""

    def __init__(self, layers: list[DecoderLayer], d_model: int, projection: nn.Module | None = None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(d_model)
        self.projection = projection

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, memory)
        x = self.norm(x)
        return self.projection(x) if self.projection is not None else x


class _BatchNormTokens(nn.Module):
    """BatchNorm over d_model for [B, N, d_model] tokens (PatchTST's choice over LayerNorm)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.norm = nn.BatchNorm1d(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


def _norm(kind: str, d_model: int) -> nn.Module:
    if kind == "layer":
        return nn.LayerNorm(d_model)
    if kind == "batch":
        return _BatchNormTokens(d_model)
    raise ValueError(f"norm must be 'layer' or 'batch', got {kind!r}")
