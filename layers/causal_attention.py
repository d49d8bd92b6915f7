"""Plain causal self-attention with the call signature of layers.transformer.TimerLayer.

TimerLayer calls its attention as `attention(x, n_vars, n_tokens)`, which suits Timer-XL's
multivariate TimeAttention. Channel-independent token models (Timer) put every channel in its
own batch row, so they need nothing but a causal mask over that row's tokens: this module
adapts layers.encoder.MultiHeadAttention (fused SDPA, is_causal) to that signature.
"""
import torch
from torch import nn

from layers.encoder import MultiHeadAttention


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where token n sees tokens 0..n of its own sequence only."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.causal = MultiHeadAttention(d_model, n_heads, dropout, causal=True)

    def forward(self, x: torch.Tensor, n_vars: int = 1, n_tokens: int | None = None) -> torch.Tensor:
        # One variable per row: anything else means the caller flattened several variables into
        # one sequence, which a plain causal mask would silently mix in time order.
        if n_vars != 1 or (n_tokens is not None and x.shape[1] != n_tokens):
            raise ValueError(f"expected one variable of {n_tokens} tokens per row, got n_vars={n_vars}, "
                             f"{x.shape[1]} tokens")
        return self.causal(x, x, x)
