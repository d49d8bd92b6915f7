"""Attention with sample-keyed dropout on its weights in bounded memory: what KeyedDropout.attend runs where
the weights are formed (the CPU, which has no fused kernel with dropout).

Written out, softmax(q k^T * scale + mask) * dropout_noise @ v keeps for backward the scores' softmax, its
float32 mask and the dropped weights, each [B, H, L, S], and forms int64 and float temporaries of that size
while drawing the masks: at 1 280 tokens a Timer-XL step held several hundred MiB above its start.
Here the weights exist one query block of one sample at a time, O(block x S) per head, as flash attention
does (Dao et al., "FlashAttention", NeurIPS 2022, section 3.1: recompute in backward, keep only the inputs):

- forward, per sample: its bool keep mask [rows, H, L, S] from the sample's key (layers.dropout draws
  it: the very draws of its _keyed_noise, so the same keys give the same masks, bit for bit), then per
  query block the scores, their softmax, the dropped weights and the output rows;
- backward, per sample: the mask drawn again from the same key (nothing of size L x S is saved), and per
  query block the same weights recomputed, then the gradients of the softmax, of q, k, v and of an additive
  mask that needs one (Timer-XL's learned variable bias).

Every output row is the sum, in the same order, of the products the written-out form takes (the same
matrix products on fewer rows), so the forward agrees with it; the gradients of k, v and the mask add the
blocks' parts one after another, so they agree to rounding. The blocks depend on one sample's shape only,
never on the micro-batch, so a sample's numbers do not depend on the number of processes.

`fused_weights_attention` is the same computation for every sample of the call at once, for a device where a
launch costs more than the arithmetic (a GPU): each query block covers all samples, and its keep mask is
hashed there for every sample, head, query and key from the samples' keys (layers.dropout's hashed masks, the
very masks a sample's own hash gives), so a call is some twenty operations whatever the number of samples.

Backward runs under the autocast state its forward ran under (device type, dtype, enabled), so the recomputed
weights have the forward's dtypes; gradients of half-precision inputs are summed in float32.
"""
import contextlib
import math

import torch

BLOCK_ELEMENTS = 1 << 18  # weights per block (1 MiB in float32): queries per block = this / (rows x H x S)
FUSED_BLOCK_ELEMENTS = 1 << 24  # weights per block of all samples (64 MiB in float32; its hashes 128 MiB)


def weights_attention(query, key, value, samples, sample_mask, attn_mask=None, is_causal=False, scale=None):
    """scaled_dot_product_attention's math path, its weights dropped by keyed masks: query's first dimension
    holds `samples` samples' rows; sample_mask(s) gives sample s's (bool keep mask [rows, ..., L, S], the
    factor of the kept weights), the same each time it is asked (layers.dropout draws it from the key)."""
    scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    return _apply(query, key, value, _Plan(samples, sample_mask, None, scale, is_causal), attn_mask)


def fused_weights_attention(query, key, value, samples, block_keep, attn_mask=None, is_causal=False, scale=None):
    """weights_attention for every sample at once: block_keep(queries, sample_shape) gives the (bool keep mask
    [N, ..., len(queries), S] of a query block over all the call's rows, the factor of the kept weights), equal
    to the block of each sample's own mask (layers.dropout hashes it)."""
    scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    return _apply(query, key, value, _Plan(samples, None, block_keep, scale, is_causal), attn_mask)


def _apply(query, key, value, plan, attn_mask):
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        return _KeyedWeightsAttention.apply(query, key, value, attn_mask, plan)
    plan.bool_mask = attn_mask
    return _KeyedWeightsAttention.apply(query, key, value, None, plan)


class _Plan:
    """What a call's forward and backward share besides tensors."""

    def __init__(self, samples, sample_mask, block_keep, scale, is_causal):
        self.samples, self.sample_mask, self.block_keep = samples, sample_mask, block_keep
        self.scale, self.is_causal = scale, is_causal
        self.bool_mask = None
        self.autocast = None  # the forward's (device type, dtype, enabled), for backward
        self.kept = None  # fused, in one block: the forward's (keep mask, factor), for backward
        self.backward_follows = False  # whether some input needs a gradient


def _autocast_state(device_type):
    if not torch.amp.is_autocast_available(device_type):
        return None
    return device_type, torch.get_autocast_dtype(device_type), torch.is_autocast_enabled(device_type)


def _summed_in(t):
    """The dtype a gradient of `t` is summed in over the blocks: float32 for a half-precision t."""
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


class _KeyedWeightsAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, additive, plan):
        ctx.plan = plan
        plan.autocast = _autocast_state(query.device.type)
        plan.backward_follows = any(ctx.needs_input_grad[:4])
        ctx.save_for_backward(query, key, value, additive)
        parts = list(_parts(query, key, plan))
        if _whole(parts, query):  # one block of every row and query: the product is the output
            rows, (block,), noise_of = parts[0]
            weights, _ = _weights(query, key, additive, plan, rows, block, noise_of)
            return (weights @ value).to(value.dtype)
        out = torch.empty(*query.shape[:-1], value.shape[-1], dtype=value.dtype, device=value.device)
        for rows, blocks, noise_of in parts:
            for block in blocks:
                weights, _ = _weights(query, key, additive, plan, rows, block, noise_of)
                out[rows][..., block, :] = weights @ value[rows]
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        query, key, value, additive = ctx.saved_tensors
        plan = ctx.plan
        inputs = (query, key, value, additive)
        parts = list(_parts(query, key, plan))
        whole = _whole(parts, query)
        grads = [None if not need else _WHOLE if whole else torch.zeros_like(t, dtype=_summed_in(t))
                 for t, need in zip(inputs, ctx.needs_input_grad)]
        autocast = torch.autocast(*plan.autocast[:2], enabled=plan.autocast[2]) if plan.autocast else None
        with autocast or contextlib.nullcontext():
            _backward(grad_out, query, key, value, additive, plan, parts, grads)
        return (*(g if g is None or g.dtype == t.dtype else g.to(t.dtype) for g, t in zip(grads, inputs)), None)


_WHOLE = object()  # a gradient of a call in one block: set by its only part rather than summed into zeros


def _whole(parts, query):
    """Whether the call is one block of every row and every query (fused within its budget, or one sample)."""
    return (len(parts) == 1 and parts[0][0] == slice(0, query.shape[0]) and len(parts[0][1]) == 1
            and parts[0][1][0] == slice(0, query.shape[-2]))


def _sum_into(grads, i, part, view=lambda grad: grad):
    """Adds a block's `part` into the view of gradient i (in place: no copy back), or sets it, _WHOLE."""
    if grads[i] is _WHOLE:
        grads[i] = part
    else:
        view(grads[i]).add_(part)


def _backward(grad_out, query, key, value, additive, plan, parts, grads):
    """The gradients of a call, added into `grads` (those of query, key, value and the additive mask: a tensor,
    _WHOLE or None)."""
    for rows, blocks, noise_of in parts:
        for block in blocks:
            weights, (probabilities, noise) = _weights(query, key, additive, plan, rows, block, noise_of)
            grad_rows = grad_out[rows][..., block, :]
            if grads[2] is not None:
                _sum_into(grads, 2, weights.transpose(-2, -1) @ grad_rows, lambda grad: grad[rows])
            # in the weights' dtype, as autograd hands an autocast product's gradient back through its cast
            grad_weights = (grad_rows @ value[rows].transpose(-2, -1)).to(noise.dtype).mul_(noise)
            # softmax's backward: p * (g - sum(g * p)) along the keys
            grad_scores = grad_weights.sub_((grad_weights * probabilities).sum(-1, keepdim=True))
            grad_scores.mul_(probabilities)
            if grads[3] is _WHOLE:  # (a copy where nothing is summed: grad_scores is scaled in place below)
                total = grad_scores.sum_to_size(_mask_part(additive, rows, block, query).shape)
                grads[3] = (total.clone() if total.shape == grad_scores.shape else total).view(additive.shape)
            elif grads[3] is not None:
                _add_to_mask(grads[3], grad_scores, rows, block, query)
            grad_scores.mul_(plan.scale)
            if grads[0] is not None:
                _sum_into(grads, 0, grad_scores @ key[rows], lambda grad: grad[rows][..., block, :])
            if grads[1] is not None:
                _sum_into(grads, 1, grad_scores.transpose(-2, -1) @ query[rows][..., block, :], lambda grad: grad[rows])


def _parts(query, key, plan):
    """(rows along dim 0, their query blocks, the function giving a block's dropout factor) for each part of the
    call: each sample, or (fused) all samples together."""
    per_sample = query.shape[0] // plan.samples
    queries, keys_ = query.shape[-2], key.shape[-2]
    rows = query.shape[0] if plan.block_keep is not None else per_sample
    budget = FUSED_BLOCK_ELEMENTS if plan.block_keep is not None else BLOCK_ELEMENTS
    block = max(1, budget // max(1, rows * math.prod(query.shape[1:-2]) * keys_))
    blocks = [slice(start, min(start + block, queries)) for start in range(0, queries, block)]
    if plan.block_keep is not None:
        sample_shape = (per_sample, *query.shape[1:-1], keys_)
        yield slice(0, query.shape[0]), blocks, _fused_noise(plan, sample_shape, query, len(blocks) == 1)
        return
    for sample in range(plan.samples):
        yield slice(sample * per_sample, (sample + 1) * per_sample), blocks, _noise(plan, sample, query)


def _weights(query, key, additive, plan, rows, block, noise_of):
    """The dropped weights of one sample's query block, and (their softmax, the noise they were dropped by),
    by the operations of layers.dropout's written-out form, in its order."""
    scores = query[rows][..., block, :] @ key[rows].transpose(-2, -1) * plan.scale
    if plan.is_causal:
        # the block's rows of SDPA's lower-triangular mask
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril(block.start)
        scores = scores.masked_fill(~causal, float("-inf"))
    if plan.bool_mask is not None:
        scores = scores.masked_fill(~_mask_part(plan.bool_mask, rows, block, query), float("-inf"))
    elif additive is not None:
        scores = scores + _mask_part(additive, rows, block, query)
    probabilities = scores.softmax(-1)
    noise = noise_of(block).to(probabilities.dtype)
    return probabilities * noise, (probabilities, noise)


def _mask_part(mask, rows, block, query):
    """The part of an SDPA mask (broadcastable to [..., L, S]) that meets these rows and query block."""
    mask = mask[(None,) * (query.dim() - mask.dim())]  # a view, also of a gradient being summed into
    if mask.shape[0] != 1:
        mask = mask[rows]
    return mask[..., block, :] if mask.shape[-2] != 1 else mask


def _add_to_mask(grad_mask, grad_scores, rows, block, query):
    """Adds a block's score gradient into an additive mask's gradient, summed over the dims it broadcasts."""
    target = _mask_part(grad_mask, rows, block, query)
    target += grad_scores.sum_to_size(target.shape)


def _noise(plan, sample, query):
    """A function of a query block giving the sample's dropout factor there: the keep mask as the noise's
    dtype (float64 for float64 weights, else float32, as layers.dropout's), times the factor."""
    keep, factor = plan.sample_mask(sample)
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32

    def noise(block):
        return keep[..., block, :].to(dtype).mul_(factor)

    return noise


def _fused_noise(plan, sample_shape, query, single):
    """_noise for all samples at once: a block's keep mask over every row, hashed for that block alone; a call
    that is `single` block keeps its bool mask (a byte a weight, within FUSED_BLOCK_ELEMENTS) for backward
    rather than hash it again: a dozen launches fewer where launches cost more than the bytes."""
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32

    def noise(block):
        if plan.kept is not None:  # backward, after a single block's forward
            (keep, factor), plan.kept = plan.kept, None
        else:
            keep, factor = plan.block_keep(block, sample_shape)
            if single and plan.backward_follows:
                plan.kept = keep, factor
        return keep.to(dtype).mul_(factor)

    return noise
