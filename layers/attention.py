"""Attention pieces for Timer-XL (Liu et al., ICLR 2025): RoPE, binary variable bias, Kronecker mask, TimeAttention.

Tokens of C variables with N patches each are flattened variable-major: token index = c * N + n.
"""
import math

import torch
from torch import nn

from layers.dropout import attention


def token_ids(n_vars: int, n_tokens: int, device=None):
    """(variable id, time id) of every flattened token, each a LongTensor [n_vars * n_tokens]."""
    flat = torch.arange(n_vars * n_tokens, device=device)
    return flat // n_tokens, flat % n_tokens


def timer_xl_blocked_mask(n_vars: int, n_tokens: int, covariate: bool = False, device=None,
                          window_covariates: bool = False) -> torch.Tensor:
    """Boolean [S, S] mask (S = n_vars * n_tokens), True where query token i must NOT attend to key token j.

    Multivariate: Kronecker product of an all-ones variable dependency with a causal time mask, i.e. token
    (c, n) sees (c', n') iff n' <= n. Covariate (last variable is the target, as in OpenLTM): every variable
    sees only its own past, the target sees the past of all variables, so no covariate token ever depends
    on the target. `window_covariates` (OpenLTM's code, TimerCovariateMask): the target sees every
    covariate token of the window, later ones included, and its own past.
    """
    var_id, time_id = token_ids(n_vars, n_tokens, device)
    blocked = time_id.unsqueeze(0) > time_id.unsqueeze(1)
    if covariate:
        same_var = var_id.unsqueeze(0) == var_id.unsqueeze(1)
        query_is_target = (var_id == n_vars - 1).unsqueeze(1)
        if window_covariates:  # OpenLTM's code: the target reads every covariate token of the window
            key_is_covariate = (var_id != n_vars - 1).unsqueeze(0)
            return (blocked | ~same_var) & ~(query_is_target & key_is_covariate)
        blocked = blocked | ~(same_var | query_is_target)
    return blocked


class RotaryEmbedding(nn.Module):
    """Rotary position embedding on the first `rotary_dim` features of each head (interleaved pairs).

    Timer-XL rotates only part of each head (OpenLTM: the first half), leaving the rest position-free.
    Has no parameters; cos/sin are recomputed per call because they are tiny ([N, rotary_dim]).
    """

    def __init__(self, rotary_dim: int, base: float = 10000.0):
        super().__init__()
        if rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
        self.rotary_dim = rotary_dim
        self.base = base

    def cos_sin(self, positions: torch.Tensor, dtype=torch.float32):
        """cos, sin of shape [len(positions), rotary_dim] for integer positions."""
        exponent = torch.arange(0, self.rotary_dim, 2, device=positions.device, dtype=torch.float32) / self.rotary_dim
        inv_freq = self.base ** -exponent
        angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # [S, rotary_dim / 2]
        angles = angles.repeat_interleave(2, dim=-1)  # each pair shares one frequency
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [..., S, E] rotated by positions [S] on its first rotary_dim features."""
        if self.rotary_dim == 0:
            return x
        cos, sin = self.cos_sin(positions, x.dtype)
        rotated, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        pairs = rotated.unflatten(-1, (-1, 2))
        # (a, b) -> (-b, a): multiplying by i in each 2-d plane.
        turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        return torch.cat((rotated * cos + turned * sin, rest), dim=-1)


class BinaryAttentionBias(nn.Module):
    """Learned per-head scalar added to attention logits: row 0 for different variables, row 1 for the same one."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.emb = nn.Embedding(2, n_heads)

    def forward(self, var_id_q: torch.Tensor, var_id_k: torch.Tensor) -> torch.Tensor:
        """Bias [H, Sq, Sk] for variable ids var_id_q [Sq], var_id_k [Sk]."""
        same_var = var_id_q.unsqueeze(1) == var_id_k.unsqueeze(0)
        different, same = self.emb.weight[0], self.emb.weight[1]
        return torch.where(same_var, same[:, None, None], different[:, None, None])


# What TimeAttention computes: "paper" follows the Timer-XL paper; "openltm" OpenLTM's code
# (layers/SelfAttention_Family.py), which its released weights were trained with. They differ only
# with more than one variable (see TimeAttention).
ATTENTION_KINDS = ("paper", "openltm")


class TimeAttention(nn.Module):
    """Multi-head self-attention over C * N flattened patch tokens with Timer-XL's Kronecker mask.

    kind="paper" (the default): queries and keys are rotated by each token's time index n, so every
    variable shares the same positional frame (the paper's R_{i-j}); a binary same/different-variable
    bias is added to the scaled logits; with `covariate` the target sees the past of every variable.
    kind="openltm", OpenLTM's code: rotated by the flattened index c * N + n (OpenLTM issue #10),
    the bias added before the 1/sqrt(E) scaling, and with `covariate` the target sees every covariate
    token of the window (TimerCovariateMask). With one variable the two are the same function.
    The causal (and optionally covariate) mask is folded into the same float additive mask so
    F.scaled_dot_product_attention can use a fused kernel.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, covariate: bool = False,
                 rotary_fraction: float = 0.5, kind: str = "paper"):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"kind must be one of {ATTENTION_KINDS}, got {kind!r}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = nn.Dropout(dropout)  # on the attention weights
        self.covariate = covariate
        self.kind = kind
        self.query_projection = nn.Linear(d_model, d_model)
        self.key_projection = nn.Linear(d_model, d_model)
        self.value_projection = nn.Linear(d_model, d_model)
        self.out_projection = nn.Linear(d_model, d_model)
        self.rotary = RotaryEmbedding(int(self.head_dim * rotary_fraction) // 2 * 2)
        self.variable_bias = BinaryAttentionBias(n_heads)

    def attention_mask(self, n_vars: int, n_tokens: int, device, dtype) -> torch.Tensor:
        """Float additive mask [1, H, S, S]: variable bias where allowed, -inf where blocked."""
        var_id, _ = token_ids(n_vars, n_tokens, device)
        openltm = self.kind == "openltm"
        blocked = timer_xl_blocked_mask(n_vars, n_tokens, self.covariate, device, window_covariates=openltm)
        bias = self.variable_bias(var_id, var_id)
        if openltm:  # OpenLTM: softmax(scale * (q.k + bias)), the bias scaled with the scores
            bias = bias / math.sqrt(self.head_dim)
        return bias.masked_fill(blocked, float("-inf")).unsqueeze(0).to(dtype)

    def forward(self, x: torch.Tensor, n_vars: int, n_tokens: int) -> torch.Tensor:
        batch, seq, _ = x.shape
        if seq != n_vars * n_tokens:
            raise ValueError(f"expected {n_vars} * {n_tokens} tokens, got {seq}")

        def split_heads(t):  # [B, S, D] -> [B, H, S, E]
            return t.view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)

        query = split_heads(self.query_projection(x))
        key = split_heads(self.key_projection(x))
        value = split_heads(self.value_projection(x))

        _, time_id = token_ids(n_vars, n_tokens, x.device)
        positions = torch.arange(seq, device=x.device) if self.kind == "openltm" else time_id
        query = self.rotary(query, positions)
        key = self.rotary(key, positions)

        mask = self.attention_mask(n_vars, n_tokens, x.device, query.dtype)
        out = attention(
            query, key, value, self.dropout, attn_mask=mask,
            scale=1.0 / math.sqrt(self.head_dim),
        )
        return self.out_projection(out.transpose(1, 2).reshape(batch, seq, -1))
