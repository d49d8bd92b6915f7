"""TSLib's attention classes under its names, signatures and state_dict keys (Time-Series-Library,
layers/SelfAttention_Family.py), so that TSLib's model files import them unchanged.

Inner attentions take and return [B, L, H, E] heads, as in TSLib; masks follow utils/masking.py (True =
hidden). FullAttention (Vaswani et al., NeurIPS 2017) runs through layers.dropout.attention, the fused
scaled_dot_product_attention this codebase's own Transformers use, with its dropout keyed by the sample
in training (layers/dropout.py); the weights are formed here only when asked for (output_attention).
ProbAttention is Informer's ProbSparse attention (Zhou et al., AAAI 2021), DSAttention the Non-stationary
Transformer's de-stationary attention (Liu et al., NeurIPS 2022), TwoStageAttentionLayer Crossformer's
(Zhang & Yan, ICLR 2023), ReformerLayer Reformer's LSH attention (Kitaev et al., ICLR 2020) from the
reformer_pytorch package, which is optional.
"""
import importlib
import math

import torch
from torch import nn

from layers.dropout import attention, sample_seeds
from utils.errors import UserError
from utils.masking import ProbMask, TriangularCausalMask


KEY_SAMPLE_SEED = 2021  # ProbAttention's keys in eval mode: one fixed draw


def eval_key_generator():
    """The generator of ProbAttention's key sample in eval mode: seeded afresh at each call (None: the global
    one, as TSLib; lab/tslib_layers.py compares so)."""
    return torch.Generator().manual_seed(KEY_SAMPLE_SEED)


def _scale(scale, head_dim):
    return scale or 1. / math.sqrt(head_dim)


def _weights_and_values(module, scores, values, scale):
    """softmax(scale * scores) with the module's dropout on the weights, applied to values [B, S, H, D]:
    ([B, L, H, D], weights [B, H, L, S] or None as module.output_attention asks)."""
    weights = module.dropout(torch.softmax(scale * scores, dim=-1))
    out = (weights @ values.transpose(1, 2)).transpose(1, 2).contiguous()
    return out, (weights if module.output_attention else None)


def _causal(scores, attn_mask, mask_flag):
    """scores [B, H, L, S] with hidden positions at -inf: attn_mask's, or the causal mask when None."""
    if not mask_flag:
        return scores
    if attn_mask is None:
        attn_mask = TriangularCausalMask(scores.shape[0], scores.shape[-2], device=scores.device)
    return scores.masked_fill(attn_mask.mask, float("-inf"))


class FullAttention(nn.Module):
    """softmax(scale q.k) v over all keys; causal when mask_flag (attn_mask None: every step sees its past)."""

    def __init__(self, mask_flag=True, factor=5, scale=None, attention_dropout=0.1, output_attention=False):
        super().__init__()
        self.scale = scale
        self.mask_flag = mask_flag
        self.output_attention = output_attention
        self.dropout = nn.Dropout(attention_dropout)

    def forward(self, queries, keys, values, attn_mask, tau=None, delta=None):
        scale = _scale(self.scale, queries.shape[-1])
        if self.output_attention:  # the weights are wanted: form them
            scores = queries.transpose(1, 2) @ keys.permute(0, 2, 3, 1)
            return _weights_and_values(self, _causal(scores, attn_mask, self.mask_flag), values, scale)
        causal = self.mask_flag and attn_mask is None
        visible = ~attn_mask.mask if self.mask_flag and attn_mask is not None else None
        out = attention(queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), self.dropout,
                        attn_mask=visible, is_causal=causal, scale=scale)
        return out.transpose(1, 2).contiguous(), None


class DSAttention(nn.Module):
    """De-stationary attention: softmax(scale (tau q.k + delta)) v, tau [B, 1] and delta [B, S] learned from
    the raw series' statistics (tau 1 and delta 0 when None)."""

    def __init__(self, mask_flag=True, factor=5, scale=None, attention_dropout=0.1, output_attention=False):
        super().__init__()
        self.scale = scale
        self.mask_flag = mask_flag
        self.output_attention = output_attention
        self.dropout = nn.Dropout(attention_dropout)

    def forward(self, queries, keys, values, attn_mask, tau=None, delta=None):
        tau = 1.0 if tau is None else tau.unsqueeze(1).unsqueeze(1)  # [B, 1, 1, 1]
        delta = 0.0 if delta is None else delta.unsqueeze(1).unsqueeze(1)  # [B, 1, 1, S]
        scores = (queries.transpose(1, 2) @ keys.permute(0, 2, 3, 1)) * tau + delta
        scores = _causal(scores, attn_mask, self.mask_flag)
        return _weights_and_values(self, scores, values, _scale(self.scale, queries.shape[-1]))


class ProbAttention(nn.Module):
    """ProbSparse attention: only the u = factor * ceil(ln L_Q) queries whose scores against a random sample
    of factor * ceil(ln L_K) keys are least uniform (max minus mean) attend; the other queries take the mean
    of the values (their cumulative sum when causal). The key sample is random in training, fixed in eval
    (_key_sample). No dropout: TSLib builds one and never applies it."""

    def __init__(self, mask_flag=True, factor=5, scale=None, attention_dropout=0.1, output_attention=False):
        super().__init__()
        self.factor = factor
        self.scale = scale
        self.mask_flag = mask_flag
        self.output_attention = output_attention
        self.dropout = nn.Dropout(attention_dropout)

    def _key_sample(self, Q, L_K, sample_k):
        """The keys each query is scored against: [L_Q, sample_k] shared by the batch, or [B, L_Q, sample_k].
        Training in the experiment (masks_follow_samples), each sample draws its own from its key, so a
        window gets the same sample on any number of processes; training elsewhere, one draw from the global
        generator, as TSLib; in eval, one fixed draw (KEY_SAMPLE_SEED): forecasts do not vary from call to call."""
        B, L_Q = Q.shape[0], Q.shape[2]
        seeds = sample_seeds(Q) if self.training else None
        if seeds is not None:
            rows = B // len(seeds)
            return torch.cat([torch.randint(L_K, (rows, L_Q, sample_k), generator=torch.Generator().manual_seed(s))
                              for s in seeds]).to(Q.device)
        generator = None if self.training else eval_key_generator()
        return torch.randint(L_K, (L_Q, sample_k), generator=generator).to(Q.device)

    def _prob_QK(self, Q, K, sample_k, n_top):
        """Q, K [B, H, L, E] -> (scores of the n_top chosen queries against every key, their indices)."""
        B, H, L_K, _ = K.shape
        sampled = self._key_sample(Q, L_K, sample_k)
        if sampled.dim() == 2:
            K_sample = K[:, :, sampled, :]  # [B, H, L_Q, sample_k, E]
        else:
            K_sample = K[torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None], sampled[:, None]]
        Q_K_sample = torch.matmul(Q.unsqueeze(-2), K_sample.transpose(-2, -1)).squeeze(-2)
        sparsity = Q_K_sample.max(-1)[0] - Q_K_sample.sum(-1) / L_K
        top = sparsity.topk(n_top, sorted=False)[1]  # [B, H, n_top]
        Q_reduce = Q[torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], top, :]
        return torch.matmul(Q_reduce, K.transpose(-2, -1)), top

    def _get_initial_context(self, V, L_Q):
        """What the queries not chosen receive: the values' mean, or when causal their cumulative sum."""
        B, H, L_V, D = V.shape
        if not self.mask_flag:
            return V.mean(dim=-2, keepdim=True).expand(B, H, L_Q, D).clone()
        if L_Q != L_V:
            raise ValueError(f"causal ProbAttention is self-attention: {L_Q} queries, {L_V} keys")
        return V.cumsum(dim=-2)

    def _update_context(self, context_in, V, scores, index, L_Q, attn_mask):
        """context_in with the chosen queries' rows replaced by their attention over V."""
        B, H, L_V, _ = V.shape
        if self.mask_flag:
            scores = scores.masked_fill(ProbMask(B, H, L_Q, index, scores, device=V.device).mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        batch, head = torch.arange(B)[:, None, None], torch.arange(H)[None, :, None]
        context_in[batch, head, index, :] = torch.matmul(weights, V).type_as(context_in)
        if not self.output_attention:
            return context_in, None
        attns = torch.full([B, H, L_V, L_V], 1. / L_V, dtype=weights.dtype, device=weights.device)
        attns[batch, head, index, :] = weights
        return context_in, attns

    def forward(self, queries, keys, values, attn_mask, tau=None, delta=None):
        L_Q, L_K, D = queries.shape[1], keys.shape[1], queries.shape[-1]
        queries, keys, values = queries.transpose(2, 1), keys.transpose(2, 1), values.transpose(2, 1)
        U_part = min(self.factor * math.ceil(math.log(L_K)), L_K)  # keys sampled per query
        u = min(self.factor * math.ceil(math.log(L_Q)), L_Q)  # queries that attend
        scores_top, index = self._prob_QK(queries, keys, sample_k=U_part, n_top=u)
        scores_top = scores_top * _scale(self.scale, D)
        context = self._get_initial_context(values, L_Q)
        context, attn = self._update_context(context, values, scores_top, index, L_Q, attn_mask)
        return context.contiguous(), attn


class AttentionLayer(nn.Module):
    """Multi-head attention around an inner attention: project to n_heads heads, attend, project back."""

    def __init__(self, attention, d_model, n_heads, d_keys=None, d_values=None):
        super().__init__()
        d_keys = d_keys or (d_model // n_heads)
        d_values = d_values or (d_model // n_heads)
        self.inner_attention = attention
        self.query_projection = nn.Linear(d_model, d_keys * n_heads)
        self.key_projection = nn.Linear(d_model, d_keys * n_heads)
        self.value_projection = nn.Linear(d_model, d_values * n_heads)
        self.out_projection = nn.Linear(d_values * n_heads, d_model)
        self.n_heads = n_heads

    def forward(self, queries, keys, values, attn_mask, tau=None, delta=None):
        B, L, _ = queries.shape
        S, H = keys.shape[1], self.n_heads
        out, attn = self.inner_attention(
            self.query_projection(queries).view(B, L, H, -1),
            self.key_projection(keys).view(B, S, H, -1),
            self.value_projection(values).view(B, S, H, -1),
            attn_mask, tau=tau, delta=delta)
        return self.out_projection(out.view(B, L, -1)), attn


def _reformer_pytorch():
    """The reformer_pytorch module, or one line saying how to install it."""
    try:
        return importlib.import_module("reformer_pytorch")
    except ImportError:
        raise UserError("ReformerLayer (TSLib's Reformer) needs the reformer_pytorch package, which is not "
                        "installed: pip install reformer-pytorch") from None


class ReformerLayer(nn.Module):
    """Reformer's LSH self-attention (queries attend to themselves; keys and values are not read), the
    series padded with zeros to a multiple of 2 * bucket_size as LSHSelfAttention requires."""

    def __init__(self, attention, d_model, n_heads, d_keys=None, d_values=None, causal=False, bucket_size=4,
                 n_hashes=4):
        super().__init__()
        self.bucket_size = bucket_size
        self.attn = _reformer_pytorch().LSHSelfAttention(dim=d_model, heads=n_heads, bucket_size=bucket_size,
                                                         n_hashes=n_hashes, causal=causal)

    def fit_length(self, queries):
        B, N, C = queries.shape
        short = -N % (self.bucket_size * 2)
        if not short:
            return queries
        return torch.cat([queries, queries.new_zeros(B, short, C)], dim=1)

    def forward(self, queries, keys, values, attn_mask, tau, delta):
        return self.attn(self.fit_length(queries))[:, :queries.shape[1], :], None


def _full(configs):
    """Crossformer's unmasked attention, its dropout configs.dropout."""
    return FullAttention(False, configs.factor, attention_dropout=configs.dropout, output_attention=False)


class TwoStageAttentionLayer(nn.Module):
    """Crossformer's two-stage attention on [B, D variates, L segments, d_model]: attention across time
    within each variate, then across variates within each segment through `factor` learned routers per
    segment (dim_sender gathers the variates into the routers, dim_receiver hands them back)."""

    def __init__(self, configs, seg_num, factor, d_model, n_heads, d_ff=None, dropout=0.1):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.time_attention = AttentionLayer(_full(configs), d_model, n_heads)
        self.dim_sender = AttentionLayer(_full(configs), d_model, n_heads)
        self.dim_receiver = AttentionLayer(_full(configs), d_model, n_heads)
        self.router = nn.Parameter(torch.randn(seg_num, factor, d_model))
        self.dropout = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.norm4 = nn.LayerNorm(d_model)
        self.MLP1 = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
        self.MLP2 = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def _sublayer(self, x, attended, norm_a, mlp, norm_b):
        x = norm_a(x + self.dropout(attended))
        return norm_b(x + self.dropout(mlp(x)))

    def forward(self, x, attn_mask=None, tau=None, delta=None):
        batch, variates, segments, d_model = x.shape
        time_in = x.reshape(batch * variates, segments, d_model)  # sample-major rows: dropout keyable
        time_enc, _ = self.time_attention(time_in, time_in, time_in, attn_mask=None, tau=None, delta=None)
        dim_in = self._sublayer(time_in, time_enc, self.norm1, self.MLP1, self.norm2)

        dim_send = dim_in.view(batch, variates, segments, d_model).transpose(1, 2).reshape(-1, variates, d_model)
        batch_router = self.router.repeat(batch, 1, 1)  # [batch * segments, factor, d_model]
        dim_buffer, _ = self.dim_sender(batch_router, dim_send, dim_send, attn_mask=None, tau=None, delta=None)
        dim_receive, _ = self.dim_receiver(dim_send, dim_buffer, dim_buffer, attn_mask=None, tau=None, delta=None)
        dim_enc = self._sublayer(dim_send, dim_receive, self.norm3, self.MLP2, self.norm4)
        return dim_enc.view(batch, segments, variates, d_model).transpose(1, 2)
