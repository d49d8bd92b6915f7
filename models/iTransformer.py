"""iTransformer: the Transformer turned on its side. Each variate's whole lookback window becomes one token
(time features join as extra tokens), self-attention mixes the variates, the feed-forward network works
within each variate, and one linear map turns every variate token into its forecast. Liu et al.,
"iTransformer: Inverted Transformers Are Effective for Time Series Forecasting", ICLR 2024; follows TSLib.

Dropout draws its masks itself (layers.dropout), a measured faster path: the embedding's and every layer's
four masks in one draw per sample (Model._dropout_masks), 32 draws a step instead of 96, 15.2-15.5 -> 13.8-14.1
ms a step on the CPU (benchmarks/results/speed_notes.md), on token-major tensors whose CPU attention is written out."""
import torch
import torch.nn.functional as F
from torch import nn

from layers.dropout import add_dropout, dropout, dropout_noises, fused_dropout, shared_rate
from layers.embedding import VariateTokenEmbedding
from layers.encoder import EncoderBlock, EncoderStack
from layers.normalization import InstanceNorm


class Model(nn.Module):
    """The modules (and state_dict keys) are TSLib's; forward runs them on token-major tensors
    [tokens, B, d_model] through _encoder_layer, which computes EncoderBlock.forward's function."""

    autoregressive = False
    inputs_used = ("x_enc", "x_mark_enc")

    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        self.use_norm = bool(configs.use_norm)
        self.normalizer = InstanceNorm()
        self.embedding = VariateTokenEmbedding(configs.seq_len, configs.d_model, configs.dropout)
        self.encoder = EncoderStack(
            [
                EncoderBlock(configs.d_model, configs.n_heads, configs.d_ff, configs.dropout, configs.activation)
                for _ in range(configs.e_layers)
            ],
            configs.d_model,
        )
        self.projector = nn.Linear(configs.d_model, configs.pred_len)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_enc.shape[1] != self.seq_len:
            raise ValueError(f"iTransformer expects seq_len={self.seq_len} input steps, got {x_enc.shape[1]}")
        n_vars = x_enc.shape[-1]
        if self.use_norm:
            x_enc = self.normalizer.norm(x_enc)

        # Token-major [tokens, B, d_model]: the batched matrix products of attention then read each head's
        # rows in place, where [B, tokens, d_model] needs a copy of q, k and v per layer to split the heads.
        tokens = x_enc.permute(2, 0, 1)
        if x_mark_enc is not None and x_mark_enc.shape[-1]:
            tokens = torch.cat([tokens, x_mark_enc.permute(2, 0, 1)])  # time features join as extra tokens
        layers = self.encoder.layers
        # Time-feature tokens only inform the variates through attention; they are not forecast, so the
        # last layer computes the C variate tokens only (the others' outputs would be dropped).
        n_outs = [n_vars if i == len(layers) - 1 else len(tokens) for i in range(len(layers))]
        embedding_mask, *layer_masks = self._dropout_masks(tokens, n_outs)
        tokens = dropout(self.embedding.linear(tokens), self.embedding.dropout.p, self.training, embedding_mask,
                         batch_dim=1)
        for layer, n_out, masks in zip(layers, n_outs, layer_masks):
            tokens = _encoder_layer(layer, tokens, n_out, masks)
        out = self.projector(self.encoder.norm(tokens[:n_vars])).permute(1, 2, 0)  # [B, pred_len, C]

        if self.use_norm:
            out = self.normalizer.denorm(out)
        return out

    def _dropout_masks(self, tokens: torch.Tensor, n_outs: list[int]):
        """The embedding's dropout mask and each layer's four (attention weights, attention output, hidden
        layer, feed-forward output), for token-major tokens [N, B, in]: drawn at once wherever layers.dropout
        draws masks itself (eager CPU training, or masks following the samples on any device), so that on
        the CPU a step pays one reseed per sample, not one per sample and layer; else Nones, and each
        dropout runs F.dropout (layers.dropout.fused_dropout). iTransformer builds every dropout with one rate."""
        layers, n_tokens, batch = self.encoder.layers, len(tokens), tokens.shape[1]
        rates = [self.embedding.dropout.p] + [rate for layer in layers for rate in (
            layer.attention.dropout.p, layer.dropout.p, layer.feed_forward.dropout.p)]
        p = shared_rate(tokens, rates, self.training)
        if p is None:
            return [None] + [(None, None, None, None)] * len(layers)
        d_model = self.embedding.linear.out_features
        shapes, batch_dims = [(n_tokens, batch, d_model)], [1]
        for layer, n_out in zip(layers, n_outs):
            shapes += [(batch * layer.attention.n_heads, n_tokens, n_out),  # [B * H, keys, queries], as _attention
                       (n_out, batch, d_model), (n_out, batch, layer.feed_forward.linear1.out_features),
                       (n_out, batch, d_model)]
            batch_dims += [0, 1, 1, 1]  # token-major tensors hold the samples along dim 1
        masks = dropout_noises(tokens, p, *shapes, batch_dims=batch_dims)
        return [masks[0]] + [tuple(masks[i:i + 4]) for i in range(1, len(masks), 4)]


def _encoder_layer(layer: EncoderBlock, x: torch.Tensor, n_out: int, masks=(None, None, None, None)) -> torch.Tensor:
    """EncoderBlock.forward on token-major x [N, B, d_model], for its first n_out tokens (all N attend).
    `masks`: the dropout masks of the attention weights, attention output, hidden layer and feed-forward
    output, if drawn already (Model._dropout_masks); each residual addition is fused with its dropout."""
    training = layer.training
    queries = x if n_out == len(x) else x[:n_out]
    attention_noise, out_noise, hidden_noise, ff_noise = masks
    attended = _attention(layer.attention, queries, x, attention_noise)
    x = layer.norm1(add_dropout(queries, attended, layer.dropout.p, training, out_noise))
    ff = layer.feed_forward
    hidden = dropout(ff.activation(ff.linear1(x)), ff.dropout.p, training, hidden_noise)
    return layer.norm2(add_dropout(x, ff.linear2(hidden), ff.dropout.p, training, ff_noise))


def _attention(attention, queries: torch.Tensor, x: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """MultiHeadAttention.forward(queries, x, x) on token-major tensors [N, B, d_model]; `noise`: the attention
    weights' dropout mask, if drawn already."""
    n_q, batch, d_model = queries.shape
    n_heads = attention.n_heads
    d_head = d_model // n_heads
    q, k, v = attention.query(queries), attention.key(x), attention.value(x)
    p = attention.dropout.p if attention.training else 0.0
    if noise is None and (p == 0.0 or fused_dropout(x)):
        q, k, v = (t.view(len(t), batch, n_heads, d_head).permute(1, 2, 0, 3) for t in (q, k, v))  # [B, H, N, E]
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return attention.out(attended.permute(2, 0, 1, 3).reshape(n_q, batch, d_model))
    # CPU training with dropout, where scaled_dot_product_attention takes its unfused math path anyway: the
    # same arithmetic with the cheaper dropout mask, and with the keys along dim 1 of the scores, since the
    # CPU softmax over a middle dimension is some 3x faster than over a last dimension of a few tokens.
    q, k, v = (t.view(len(t), batch * n_heads, d_head).transpose(0, 1) for t in (q, k, v))  # [B * H, N, E] views
    weights = torch.softmax(torch.bmm(k, q.transpose(1, 2)).mul_(d_head**-0.5), dim=1)  # [B * H, keys, queries]
    attended = torch.bmm(dropout(weights, p, True, noise).transpose(1, 2), v)  # [B * H, queries, E]
    return attention.out(attended.transpose(0, 1).reshape(n_q, batch, d_model))
