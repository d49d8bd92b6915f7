"""Attention masks under TSLib's names (Time-Series-Library, utils/masking.py), for its model files.

Both hold a boolean `.mask` that is True where a query must NOT see a key, TSLib's convention (the
opposite of F.scaled_dot_product_attention's boolean masks, which mark what may be seen).
"""
import torch


class TriangularCausalMask:
    """[B, 1, L, L]: step i sees steps <= i (Vaswani et al. 2017's decoder mask)."""

    def __init__(self, B, L, device="cpu"):
        self._mask = torch.ones(L, L, dtype=torch.bool, device=device).triu(1).expand(B, 1, L, L)

    @property
    def mask(self):
        return self._mask


class ProbMask:
    """ProbSparse attention's causal mask (Zhou et al., AAAI 2021, Informer): the causal rows of the
    selected queries `index` [B, H, u], shaped like their `scores` [B, H, u, L_K]."""

    def __init__(self, B, H, L, index, scores, device="cpu"):
        causal = torch.ones(L, scores.shape[-1], dtype=torch.bool, device=device).triu(1)
        self._mask = causal[index].view(scores.shape)

    @property
    def mask(self):
        return self._mask
