"""Encoder/decoder Transformer blocks (Vaswani et al. 2017, post-norm), as TSLib's Transformer,
iTransformer and PatchTST use them. Attention runs through PyTorch's fused
scaled_dot_product_attention (flash/memory-efficient kernels where the device has them).
"""
import torch
import torch.nn.functional as F
from torch import nn

from layers.dropout import attention

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def activation_fn(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


class MultiHeadAttention(nn.Module):
    """Multi-head attention: project queries/keys/values, attend per head, project back."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.1, causal: bool = False):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads, self.causal = n_heads, causal
        self.dropout = nn.Dropout(dropout)  # on the attention weights
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # [B, L, d] -> [B, H, L, d / H]
        return x.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        attended = attention(self._heads(self.query(queries)), self._heads(self.key(keys)),
                             self._heads(self.value(values)), self.dropout, is_causal=self.causal)
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


class EncoderBlock(nn.Module):
    """x = norm1(x + attn(x)); out = norm2(x + FFN(x))."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, dropout: float = 0.1,
                 activation: str = "gelu", norm: str = "layer"):
        super().__init__()
        self.attention = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff or 4 * d_model, dropout, activation)
        self.norm1, self.norm2 = _norm(norm, d_model), _norm(norm, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.attention(x, x, x)))
        return self.norm2(x + self.feed_forward(x))


class EncoderStack(nn.Module):
    """A stack of EncoderBlocks and a final norm."""

    def __init__(self, layers: list[nn.Module], d_model: int, norm: str = "layer"):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = _norm(norm, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention to the encoder output, feed-forward; post-norm."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, dropout: float = 0.1,
                 activation: str = "gelu"):
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, n_heads, dropout, causal=True)
        self.cross_attention = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = FeedForward(d_model, d_ff or 4 * d_model, dropout, activation)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.self_attention(x, x, x)))
        x = self.norm2(x + self.dropout(self.cross_attention(x, memory, memory)))
        return self.norm3(x + self.feed_forward(x))


class DecoderStack(nn.Module):
    """A stack of DecoderBlocks, a final LayerNorm and an optional output projection."""

    def __init__(self, layers: list[DecoderBlock], d_model: int, projection: nn.Module | None = None):
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
