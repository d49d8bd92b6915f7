"""TiDE: a channel-independent MLP encoder-decoder. Each channel's instance-normalised lookback,
flattened together with low-dimensional projections of the time features of the lookback and the
horizon, is encoded by residual MLP blocks, decoded into a small vector per horizon step, and a
temporal decoder turns each step's vector plus its projected time features into the forecast; a
linear map from lookback to horizon is added as a global residual. Das et al., "Long-term Forecasting
with TiDE: Time-series Dense Encoder", TMLR 2023; follows the TSLib implementation (one difference:
NORMALIZE_ONE_WIDE_OUTPUT below). Time features of the horizon are the last pred_len rows of x_mark_dec.

Speed (the mathematics is TSLib's, to float rounding): the time features are the same for every
channel, so their encoding and their share of the first encoder block run once per batch element and
are broadcast over the channels instead of being repeated; and the feature encoder and the temporal
decoder, whose hidden layers ([B * (L + H), d_model] and [B * C * H, d_ff], ~350 MB at the ETTh1
script's settings) are far wider than their inputs and outputs, compute that hidden layer a cache-sized
block of rows at a time on the CPU and recompute it in backward rather than storing it (WideHiddenMLP).
Dropout draws its masks itself (layers.dropout), a measured faster path: every block's at once
(Model.dropout_masks), 512 reseeds a step at batch 512 instead of 3 072, 244-245 against 250-252 ms a step;
and the LayerNorm over the feature encoder's two values is written out in elementwise ops (ATen's kernel
is slow per row).
"""
import torch
import torch.nn.functional as F
from torch import nn

from layers.dropout import dropout, dropout_noises, shared_rate
from layers.normalization import InstanceNorm

# Width each step's time features are projected to before they join the encoder input and the
# temporal decoder (TSLib's feature_encode_dim; the paper's "temporal width"). As in TSLib, the
# projection ends in a LayerNorm, which over two values leaves only their order (+-weight + bias).
FEATURE_ENCODE_DIM = 2
# TSLib (like the original code with layer norm on) also layer-normalises the temporal decoder's
# one-wide output. Normalising a single value returns the LayerNorm's bias whatever the input, so
# the temporal decoder becomes a constant and the feature encoder, dense encoder and dense decoder
# get zero gradient: the model is then a linear map on the normalised lookback plus a constant.
# False skips that LayerNorm so every block learns (same ETTh1 accuracy, test MSE 0.385 at horizon
# 96 either way); True reproduces TSLib exactly, state_dict included.
NORMALIZE_ONE_WIDE_OUTPUT = False
# Rows of a WideHiddenMLP block. Its [rows, hidden] tile is 4 MiB at hidden 256, so with two threads
# each one's half stays in its core's 2 MiB L2 (Xeon); smaller blocks gain nothing, and each block's
# ops cost a thread fork/join (which on a busy machine can wait a whole scheduler slice).
CHUNK_ROWS = 4096


class WideHiddenMLP(torch.autograd.Function):
    """relu(x @ w1.T + b1) @ w2.T for x [N, K] when the hidden width is much larger than K and than
    the output width O: the [N, hidden] activation, read and written several times over by plain
    ops (bias, ReLU, its mask, the gradient's outer product, two GEMMs), would cost far more memory
    traffic than arithmetic. Here it only ever exists CHUNK_ROWS rows at a time, in cache, and
    backward recomputes it instead of saving it. x gets a ones column (and w1 the bias as its last
    column) so that each block's pre-activation is one GEMM, with no bias copy.

    Backward needs only the ReLU's 0/1 mask M of each block, everything else being narrow. With g
    the output gradient, x1 = [x, 1], w1b = [w1, b1] and G[o] = (g_o * x1).T @ M, [K + 1, hidden]
    (MKL runs this orientation ~3x faster than M.T @ (g_o * x1)): grad w1b[j, :] =
    sum_o w2[o, j] G[o, :, j], grad w2[o, j] = G[o, :, j] . w1b[j, :] (as relu(p) = M * p), and
    grad x = sum_o g_o * (M @ (w2[o, :, None] * w1))."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2):
        x1 = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)
        w1b = torch.cat([w1, b1.unsqueeze(1)], dim=1)
        ctx.save_for_backward(x1, w1b, w2)
        n, w1b_t, w2_t = x.shape[0], w1b.t(), w2.t()
        out = x.new_empty(n, w2.shape[0])
        hidden = x.new_empty(min(CHUNK_ROWS, n), w1.shape[0])
        for start in range(0, n, CHUNK_ROWS):
            end = min(start + CHUNK_ROWS, n)
            h = torch.mm(x1[start:end], w1b_t, out=hidden[:end - start]).relu_()
            torch.mm(h, w2_t, out=out[start:end])
        return out

    @staticmethod
    def backward(ctx, grad):
        x1, w1b, w2 = ctx.saved_tensors
        (n, k1), (width, o) = x1.shape, w2.t().shape
        scaled = x1.new_empty(o, k1, n)  # (g_o * x1).T, in this layout
        torch.mul(grad.t().unsqueeze(1), x1.t().unsqueeze(0), out=scaled)
        scaled = scaled.view(o * k1, n)
        sums = x1.new_zeros(o * k1, width)  # G
        want_x = ctx.needs_input_grad[0]
        if want_x:
            w1_scaled = (w2.t().unsqueeze(2) * w1b[:, :-1].unsqueeze(1)).reshape(width, o * (k1 - 1))
            masked = x1.new_empty(n, o * (k1 - 1))  # M @ w1_scaled
        hidden, w1b_t = x1.new_empty(min(CHUNK_ROWS, n), width), w1b.t()
        for start in range(0, n, CHUNK_ROWS):
            end = min(start + CHUNK_ROWS, n)
            mask = torch.mm(x1[start:end], w1b_t, out=hidden[:end - start])
            torch.gt(mask, 0, out=mask)  # the ReLU's mask as 0/1, in place
            sums.addmm_(scaled[:, start:end], mask)
            if want_x:
                torch.mm(mask, w1_scaled, out=masked[start:end])
        sums = sums.view(o, k1, width)
        grad_w1b = torch.einsum("oj,okj->jk", w2, sums)
        grad_w2 = torch.einsum("okj,jk->oj", sums, w1b)
        grad_x = torch.einsum("no,nok->nk", grad, masked.view(n, o, k1 - 1)) if want_x else None
        return grad_x, grad_w1b[:, :-1], grad_w1b[:, -1], grad_w2


_ROW_HASH = -7046029254386353131  # 0x9E3779B97F4A7C15 as an int64: an odd multiplier for the row hash


def distinct_rows(x: torch.Tensor, at_most: float = 0.5):
    """(rows, inverse) with rows.index_select(0, inverse) equal to x [N, K] element for element; None when x
    has more than at_most * N distinct rows (too few repeats to gain) or a hash collision merged two rows.
    The rows are found by one sort of a 64-bit hash of each row's bits: torch.unique(x, dim=0) sorts the
    rows lexicographically, 165 ms for TiDE's 98 304 x 4 time features against 4 ms here."""
    integer = {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(x.element_size())
    if integer is None or x.dim() != 2 or len(x) == 0:
        return None
    bits = x.contiguous().view(integer).long()
    key = bits[:, 0].clone()
    for column in bits.unbind(1)[1:]:
        key.mul_(_ROW_HASH).add_(column)  # wraps modulo 2**64
    keys, inverse = torch.unique(key, return_inverse=True)
    if len(keys) > at_most * len(x):
        return None
    rows = x.new_empty(len(keys), x.shape[1]).index_copy_(0, inverse, x)
    return (rows, inverse) if torch.equal(rows.index_select(0, inverse), x) else None  # NaNs fail too


def layer_norm(ln, x):
    """LayerNorm `ln` of x. Over two values (a, b), the feature encoder's output, it is
    (d, -d) / sqrt(d^2 + 4 eps) * weight + bias with d = a - b (x minus its mean is (d, -d) / 2, the
    variance d^2 / 4): written so, several times faster than ATen's kernel, which spends most of its
    time per row, and more accurate (ATen's is off by ~1e-5 where a and b are close)."""
    if x.shape[-1] != 2 or x.device.type != "cpu":
        return ln(x)
    diff = x[..., :1] - x[..., 1:]
    normalized = diff * torch.rsqrt(torch.addcmul(diff.new_tensor(4 * ln.eps), diff, diff))
    return torch.addcmul(ln.bias, normalized, ln.weight * normalized.new_tensor([1.0, -1.0]))


class ResBlock(nn.Module):
    """TiDE's residual block: LayerNorm(Dropout(fc2(ReLU(fc1(x)))) + fc3(x)), the LayerNorm left out
    for a one-wide output unless NORMALIZE_ONE_WIDE_OUTPUT."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, output_dim)
        self.fc3 = nn.Linear(input_dim, output_dim)  # linear skip connection
        self.dropout = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(output_dim) if output_dim > 1 or NORMALIZE_ONE_WIDE_OUTPUT else None
        # the feature encoder and the temporal decoder: narrow ends around a wide hidden layer
        self.wide_hidden = 8 * max(input_dim, output_dim) <= hidden_dim

    def forward(self, x, noise=None):
        """`noise`: the block's dropout mask, if drawn already (Model.dropout_masks)."""
        return self.finish(*self.branches(x), noise)

    def branches(self, x):
        """fc2(ReLU(fc1(x))) and the skip connection fc3(x): the block before its dropout, a function of
        each row of x alone."""
        if self.wide_hidden and x.device.type == "cpu" and not torch.is_autocast_enabled("cpu"):
            flat = x.reshape(-1, x.shape[-1])
            hidden_out = WideHiddenMLP.apply(flat, self.fc1.weight, self.fc1.bias, self.fc2.weight)
            return (hidden_out + self.fc2.bias).view(*x.shape[:-1], -1), self.fc3(x)
        # in-place ReLU: fc1's output is not needed for its backward
        return self.fc2(torch.relu_(self.fc1(x))), self.fc3(x)

    def finish(self, hidden_out, skip, noise=None):
        """The block's output from fc2's output and the skip connection fc3(x)."""
        noise = None if noise is None else noise.to(hidden_out.dtype)
        out = dropout(hidden_out, self.dropout.p, self.training, noise) + skip
        return layer_norm(self.ln, out) if self.ln is not None else out


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc", "x_mark_enc", "x_mark_dec")
    not_from_data = ("c_out",)  # the decoded width per step (below), not a channel count

    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        self.mark_dim = int(getattr(configs, "mark_dim", 0) or 0)
        # TSLib takes the per-step decoded width from c_out (its scripts pass --c_out 8, the paper's
        # decoderOutputDim); the output still has one column per input channel.
        self.decode_dim = configs.c_out
        hidden, dropout = configs.d_model, configs.dropout
        feature_dim = FEATURE_ENCODE_DIM if self.mark_dim else 0  # no covariates for undated data
        self.normalize = InstanceNorm() if getattr(configs, "use_norm", 1) else None

        if self.mark_dim:
            self.feature_encoder = ResBlock(self.mark_dim, hidden, FEATURE_ENCODE_DIM, dropout)
        flatten_dim = self.seq_len + (self.seq_len + self.pred_len) * feature_dim
        # Names keep TSLib's state_dict keys. With e_layers or d_layers > 2, TSLib reuses one block
        # object for the repeated hidden layers (shared weights); here each layer has its own.
        self.encoders = nn.Sequential(
            ResBlock(flatten_dim, hidden, hidden, dropout),
            *(ResBlock(hidden, hidden, hidden, dropout) for _ in range(configs.e_layers - 1)))
        self.decoders = nn.Sequential(
            *(ResBlock(hidden, hidden, hidden, dropout) for _ in range(configs.d_layers - 1)),
            ResBlock(hidden, hidden, self.decode_dim * self.pred_len, dropout))
        self.temporalDecoder = ResBlock(self.decode_dim + feature_dim, configs.d_ff, 1, dropout)
        self.residual_proj = nn.Linear(self.seq_len, self.pred_len)

    def _covariates(self, x_enc, x_mark_enc, x_mark_dec):
        """Time features of the lookback and the horizon, [B, seq_len + pred_len, mark_dim]."""
        if x_mark_enc is None or x_mark_dec is None:  # as TSLib: zeros when no marks are passed
            return x_enc.new_zeros(x_enc.shape[0], self.seq_len + self.pred_len, self.mark_dim)
        return torch.cat([x_mark_enc, x_mark_dec[:, -self.pred_len:]], dim=1)

    def dropout_masks(self, x, batch, channels):
        """Every block's dropout mask, in the order forward runs the blocks (feature encoder, encoders,
        decoders, temporal decoder), drawn at once wherever layers.dropout draws masks itself: one draw per
        sample when masks follow the samples, where one per block cost a reseed per sample and block (on
        the CPU 3 072 a step at batch 512, 13 % of it). Else Nones, and each dropout draws its own or runs
        F.dropout (layers.dropout.fused_dropout)."""
        blocks = ([self.feature_encoder] if self.mark_dim else []) + [*self.encoders, *self.decoders, self.temporalDecoder]
        p = shared_rate(x, (b.dropout.p for b in blocks), self.training)
        if p is None:
            return [None] * len(blocks)
        rows = batch * channels
        shapes = [(rows, block.fc2.out_features) for block in (*self.encoders, *self.decoders)]
        if self.mark_dim:
            shapes.insert(0, (batch, self.seq_len + self.pred_len, FEATURE_ENCODE_DIM))
        return dropout_noises(x, p, *shapes, (rows * self.pred_len, 1))

    def _encode_features(self, covariates, noise=None):
        """The feature encoder on the time features [B, L + H, mark_dim]. A batch's windows share most of
        their calendar rows (98 304 rows, 8 474 distinct, at the ETTh1 script's batch of 512), and the block
        before its dropout is a function of each row alone: on the CPU that part runs once per distinct row
        and is gathered back (22.3 -> 11.4-11.9 ms forward + backward a step on 2 cores). Dropout and the rest stay per row."""
        block = self.feature_encoder
        found = None
        if covariates.device.type == "cpu" and not covariates.requires_grad and not torch.compiler.is_compiling():
            found = distinct_rows(covariates.reshape(-1, covariates.shape[-1]))
        if found is None:
            return block(covariates, noise)
        rows, inverse = found
        both = torch.cat(block.branches(rows), dim=1).index_select(0, inverse)  # one gather (and scatter-add)
        hidden_out, skip = both.view(*covariates.shape[:-1], -1).chunk(2, dim=-1)
        return block.finish(hidden_out, skip, noise)

    def _encode_with_features(self, series, features, noise=None):
        """The first encoder block on [series, its batch element's features.flatten(1)] (TSLib's
        encoder input) without building that [B * C, flatten_dim] input: fc1 and fc3 split into the
        series' columns, per series, and the features' columns, once per batch element."""
        block, batch = self.encoders[0], features.shape[0]

        def split_linear(fc):
            per_series = F.linear(series, fc.weight[:, :self.seq_len]).view(batch, -1, fc.out_features)
            per_batch = F.linear(features.flatten(1), fc.weight[:, self.seq_len:], fc.bias)
            return (per_series + per_batch.unsqueeze(1)).flatten(0, 1)

        return block.finish(block.fc2(torch.relu_(split_linear(block.fc1))), split_linear(block.fc3), noise)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_enc.shape[1] != self.seq_len:
            raise ValueError(f"TiDE expects seq_len={self.seq_len} input steps, got {x_enc.shape[1]}")
        batch, _, channels = x_enc.shape
        x = self.normalize.norm(x_enc) if self.normalize is not None else x_enc
        # Channel independence: fold the channels into the batch, [B * C, L].
        series = x.transpose(1, 2).reshape(batch * channels, self.seq_len)
        masks = iter(self.dropout_masks(x, batch, channels))

        if self.mark_dim:
            features = self._encode_features(self._covariates(x_enc, x_mark_enc, x_mark_dec), next(masks))  # [B, L+H, F]
            encoded = self._encode_with_features(series, features, next(masks))
            for block in (*self.encoders[1:], *self.decoders):
                encoded = block(encoded, next(masks))
            decoded = encoded
            # each step's input to the temporal decoder: its features (the same calendar for every
            # channel) and its decoded vector, [B, C, H, F + decode_dim]
            step_features = features[:, None, self.seq_len:].expand(-1, channels, -1, -1)
            decoded = torch.cat([step_features, decoded.view(batch, channels, self.pred_len, -1)], dim=-1)
        else:
            decoded = series
            for block in (*self.encoders, *self.decoders):
                decoded = block(decoded, next(masks))
        out = self.temporalDecoder(decoded.view(batch * channels * self.pred_len, -1), next(masks))
        out = out.view(-1, self.pred_len) + self.residual_proj(series)  # [B * C, H]

        out = out.view(batch, channels, self.pred_len).transpose(1, 2)
        return self.normalize.denorm(out) if self.normalize is not None else out
