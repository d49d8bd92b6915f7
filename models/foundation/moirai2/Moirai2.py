"""Moirai 2.0: Salesforce's decoder-only zero-shot forecaster (11.4M parameters, Salesforce/moirai-2.0-R-small).
Patches of 16 steps, each embedded with its observed mask; a causal transformer (pre-RMSNorm, RMSNorm on q and
k, rotary position on half of each head, gated SiLU feed-forward); from each token the quantiles 0.1 ... 0.9 of
the next 4 patches. Liu et al., "Moirai 2.0: When Less Is More for Time Series Forecasting", arXiv 2511.11698.

A native implementation, plain torch, written from uni2ts 2.0.0 (uni2ts/model/moirai2/{module,forecast}.py and
the modules they build) read as facts; why not the package: it pins torch < 2.5 and numpy 1.26.
crosscheck.py and tests/test_moirai2.py hold ours to the package's
Moirai2Forecast.predict (official uni2ts 2.0.0 run under torch 2.13: see that benchmark's docstring).

What a forecast is (Moirai2Forecast.forward, univariate):
- the context is left-padded with zeros to whole patches (padding unobserved); scaling is the packed std scaler:
  per series, the mean and the std (correction 1, + 1e-5 under the root) of its observed values, in float64;
- the network reads [scaled patch, observed mask] tokens at time ids 0, 1, ...; causal attention;
- the last context token gives num_predict_token (4) patches of 9 quantiles, scaled back. A horizon of more
  tokens rolls out by recursive multi-quantile decoding: each of the 9 quantile paths of the tokens so far is fed
  back as if observed (a batch 9 times larger), the scaler now counting those values too; each path forecasts 9
  quantiles of its next tokens, and the 81 values per step collapse to the 9 levels (torch.quantile, linear).
Ours feeds each step only the tokens up to the last one filled: the reference's later tokens are masked from
them (causal) and from the scaler (prediction mask), so the outputs are the same.

Any-variate attention: the release adds a learned bias per head for "same variate" / "other variate". Each
channel is its own univariate series here (Moirai2Forecast.predict supports univariate only, and the release's
GIFT-Eval evaluation forecasts every variate alone), so every pair is "same variate": a constant per head,
which softmax ignores. Ours therefore runs plain causal attention (PyTorch's fused kernel) and keeps the biases
only as frozen weights, `moirai.variate_bias.<layer>` (loaded and exported; their true gradient is 0, so
fine-tuning leaves them as they are: declared in unused_parameters).

Dropout: nn.Dropout modules after attention and in the feed-forward, and the attention weights' through
layers.dropout.attention, the dropout that follows the sample (keyed by window inside the experiment); the
release's rates are 0 (Moirai2Forecast sets them to 0 for inference too). A folder's config.json gives the
rates (attn_dropout_p, dropout_p); --dropout only without a folder.

All channels of a batch are one call: [B, seq_len, C] -> B*C univariate series -> [B, pred_len, C, 9].

Fine-tuning (--adaptation): computes_loss. The decoder-only objective over the whole causal sequence: context ++
horizon as tokens (the horizon's true values fed as observed, teacher forcing), every token's num_predict_token
heads forecasting the next patches, the quantile (pinball) loss averaged over the 9 levels and over every
observed step that some head forecasts, in the model's scaled space (scaler from the context only, as at
inference); a window's loss is the mean over its channels. uni2ts 2.0.0 publishes no Moirai 2.0 training code;
this is the paper's objective (quantile loss over the causal sequence, multi-token prediction) with its loss
function (PackedQuantileMAELoss: pinball, mean over levels) without the patch-level random masking.

Shapes: with --pretrain_model_path DIR (config.json + model.safetensors) every size from config.json; without
it, the released architecture with --d_model, --d_ff, --e_layers, --n_heads, --dropout in place of the released
sizes (utils/moirai2.RELEASED). A context ++ horizon of more tokens than max_seq_len (512 released: 8192 steps)
is refused: the reference would extend its rotary table to positions it was never trained on."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from layers.dropout import attention
from models.foundation.moirai2 import adapter as release


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)
    computes_loss = True
    unused_parameters = {"moirai.variate_bias": "the any-variate attention bias: a constant per head for one "
                                                "variate, which softmax ignores (kept frozen for the release)"}
    quantile_levels = release.QUANTILES
    checkpoint_adapters = (release.MOIRAI2,)
    series_as_given = True  # forecasts the user's series as the file holds it (exp.adaptation)

    def __init__(self, configs):
        super().__init__()
        path = getattr(configs, "pretrain_model_path", None)
        config = release.folder_config(path) if path else None
        config = config or release.generic_config(configs)
        if config["d_model"] % config["num_heads"]:
            raise ValueError(f"d_model {config['d_model']} is not divisible by n_heads {config['num_heads']}")
        if (config["d_model"] // config["num_heads"]) % 4:
            raise ValueError(f"the head size {config['d_model'] // config['num_heads']} must be a multiple of 4 "
                             "(rotary position on pairs of its first half)")
        self.patch, self.tokens_ahead = int(config["patch_size"]), int(config["num_predict_token"])
        self.seq_len, self.pred_len = configs.seq_len, configs.pred_len
        tokens = math.ceil(self.seq_len / self.patch) + math.ceil(self.pred_len / self.patch)
        if tokens > config["max_seq_len"]:
            longest = config["max_seq_len"] * self.patch
            raise ValueError(f"Moirai 2.0 reads at most {config['max_seq_len']} tokens of {self.patch} steps "
                             f"(max_seq_len): --seq_len {self.seq_len} + --pred_len {self.pred_len} make {tokens}; "
                             f"keep their patches within {longest} steps")
        self.moirai = Network(config)
        # the levels' float32 bits as int32: a buffer moves with the model (no copy from the host per roll-out step
        # or batch), and an integer one keeps its bits when the model is cast to half precision (a float buffer
        # would round 0.1 -> 0.10009765625 in bfloat16); not persistent, so not in the state dict
        self.register_buffer("level_bits", torch.tensor(self.quantile_levels, dtype=torch.float32).view(torch.int32),
                             persistent=False)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None, target=None):
        batch, length, channels = x_enc.shape
        series = x_enc.permute(0, 2, 1).reshape(batch * channels, length).to(torch.float32)
        if target is not None:  # training: each window's loss [B]
            future = target.permute(0, 2, 1).reshape(batch * channels, -1).to(torch.float32)
            return self.training_loss(series, future).view(batch, channels).mean(1)
        quantiles = self.forecast(series)  # [B*C, Q, pred_len]
        return quantiles.reshape(batch, channels, -1, self.pred_len).permute(0, 3, 1, 2).to(x_enc.dtype)

    # ---------------------------------------------------------------- forecasting
    def forecast(self, context):
        """Moirai2Forecast.forward on univariate series: [N, L] -> [N, Q, pred_len] (module docstring)."""
        tokens, observed = self.patches(context, left=True)
        wanted = math.ceil(self.pred_len / self.patch)
        ahead = self.moirai(tokens, observed, last_only=True)[:, -1]  # [N, tokens_ahead, Q, patch]
        steps = [ahead[:, :wanted]]
        filled = ahead.shape[1]
        if wanted > filled:
            levels = len(self.quantile_levels)
            # one path per quantile level, (series, level) order: each fed its own level's tokens
            tokens = torch.cat([tokens.repeat_interleave(levels, 0), ahead.transpose(1, 2).flatten(0, 1)], 1)
            observed = torch.cat([observed.repeat_interleave(levels, 0), self.horizon_observed(0, filled, tokens)], 1)
        while wanted > filled:
            take = min(self.tokens_ahead, wanted - filled)
            out = self.moirai(tokens, observed, last_only=True)[:, -1, :take]  # [N*Q, take, Q, patch]
            out = out.unflatten(0, (-1, levels)).permute(0, 2, 4, 1, 3).flatten(3)  # [N, take, patch, Q*Q]
            step = torch.quantile(out, self.levels(), dim=-1).permute(1, 2, 0, 3)  # [N, take, Q, patch]
            steps.append(step)
            tokens = torch.cat([tokens, step.transpose(1, 2).flatten(0, 1)], 1)
            observed = torch.cat([observed, self.horizon_observed(filled, filled + take, tokens)], 1)
            filled += take
        forecast = torch.cat(steps, 1)  # [N, tokens, Q, patch]
        return forecast.transpose(1, 2).flatten(2)[..., :self.pred_len]

    def levels(self):
        """The quantile levels, float32 on the model's device whatever its dtype (`level_bits`)."""
        return self.level_bits.view(torch.float32)

    def patches(self, values, left):
        """[N, steps] -> ([N, tokens, patch] values, [N, tokens, patch] observed): padded with unobserved zeros
        to whole patches on the left (context) or right (horizon), as Moirai2Forecast._patched_seq_pad."""
        pad = -values.shape[1] % self.patch
        observed = torch.ones_like(values, dtype=torch.bool)
        padding = (pad, 0) if left else (0, pad)
        values, observed = F.pad(values, padding), F.pad(observed, padding)
        return values.unflatten(1, (-1, self.patch)), observed.unflatten(1, (-1, self.patch))

    def horizon_observed(self, start, stop, like):
        """The observed mask of horizon tokens start..stop-1: every step but those past pred_len (the last
        token's right padding, fed back as forecast but unobserved, as in the reference's rollout)."""
        steps = torch.arange(start * self.patch, stop * self.patch, device=like.device)
        return (steps < self.pred_len).view(1, stop - start, self.patch).expand(like.shape[0], -1, -1)

    # ---------------------------------------------------------------- fine-tuning
    def training_loss(self, context, future):
        """Each series' decoder-only quantile loss over context ++ horizon (module docstring): [N]."""
        past, past_observed = self.patches(context, left=True)
        ahead, ahead_observed = self.patches(future, left=False)
        tokens, observed = torch.cat([past, ahead], 1), torch.cat([past_observed, ahead_observed], 1)
        out, loc, scale = self.moirai(tokens, observed, scaled_output=True, scaling=std_scaler(past, past_observed))
        truth = (tokens - loc) / scale  # [N, T, patch], the targets in the model's space
        levels = self.levels().view(-1, 1)
        total = out.new_zeros(out.shape[0])
        count = out.new_zeros(out.shape[0])
        for head in range(self.tokens_ahead):  # head h of token t forecasts token t + 1 + h
            lead = head + 1
            if lead >= tokens.shape[1]:
                break
            pred, true = out[:, :-lead, head], truth[:, lead:].unsqueeze(2)  # [N, T-lead, Q, patch], [.., 1, ..]
            error = true - pred
            pinball = torch.where(error > 0, levels * error, (levels - 1) * error).mean(2)  # [N, T-lead, patch]
            mask = observed[:, lead:].to(pinball.dtype)
            total = total + (pinball * mask).sum((1, 2))
            count = count + mask.sum((1, 2))
        return total / count.clamp(min=1)


class Network(nn.Module):
    """Moirai2Module for univariate series: scaler, patch embedding, causal encoder, quantile head. Module names
    are the release's (adapter.py's key table)."""

    def __init__(self, config):
        super().__init__()
        d_model, patch, heads = int(config["d_model"]), int(config["patch_size"]), int(config["num_heads"])
        self.quantiles, self.patch, self.ahead = len(config["quantile_levels"]), patch, int(config["num_predict_token"])
        self.in_proj = ResidualBlock(2 * patch, d_model, d_model)
        self.encoder = Encoder(d_model, heads, int(config["d_ff"]), int(config["num_layers"]),
                               float(config["attn_dropout_p"]), float(config["dropout_p"]))
        self.out_proj = ResidualBlock(d_model, d_model, self.ahead * self.quantiles * patch)
        self.variate_bias = nn.ModuleList(VariateBias(heads) for _ in range(int(config["num_layers"])))
        self.variate_bias.requires_grad_(False)

    def forward(self, tokens, observed, last_only=False, scaled_output=False, scaling=None):
        """tokens, observed: [N, T, patch]. Returns [N, T (or 1), ahead, Q, patch] forecasts scaled back; with
        scaled_output, (those in the scaled space, loc, scale). `scaling`: (loc, scale) [N, 1, 1], by default
        the scaler's of all the tokens given (training passes the context's)."""
        loc, scale = std_scaler(tokens, observed) if scaling is None else scaling
        scaled = (tokens - loc) / scale
        dtype = self.in_proj.hidden_layer.weight.dtype  # the network's (a half-precision copy: its own)
        hidden = self.in_proj(torch.cat([scaled, observed.to(scaled.dtype)], -1).to(dtype))
        hidden = self.encoder(hidden)
        if last_only:
            hidden = hidden[:, -1:]
        out = self.out_proj(hidden).float().unflatten(-1, (self.ahead, self.quantiles, self.patch))
        if scaled_output:
            return out, loc, scale
        return out * scale.unsqueeze(-1).unsqueeze(-1) + loc.unsqueeze(-1).unsqueeze(-1)


def std_scaler(tokens, observed, minimum_scale=1e-5):
    """uni2ts's PackedStdScaler for one series a row: (loc, scale) [N, 1, 1] of the observed values, computed in
    float64 and returned in float32: mean, and sqrt(var with correction 1 + minimum_scale)."""
    values, mask = tokens.double(), observed.double()
    count = mask.sum((1, 2), keepdim=True)
    loc = (values * mask).sum((1, 2), keepdim=True) / torch.where(count == 0, 1.0, count)
    spread = ((values - loc) ** 2 * mask).sum((1, 2), keepdim=True)
    denominator = count - 1
    var = spread / torch.where(denominator == 0, 1.0, denominator)
    return loc.float(), torch.sqrt(var + minimum_scale).float()


class ResidualBlock(nn.Module):
    """uni2ts's ResidualBlock: output(silu(hidden(x))) + residual(x)."""

    def __init__(self, inputs, hidden, outputs):
        super().__init__()
        self.hidden_layer = nn.Linear(inputs, hidden)
        self.output_layer = nn.Linear(hidden, outputs)
        self.residual_layer = nn.Linear(inputs, outputs)

    def forward(self, x):
        return self.output_layer(F.silu(self.hidden_layer(x))) + self.residual_layer(x)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, in the input's dtype, as uni2ts.module.norm.RMSNorm (eps 1e-5)."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # fused; the same numbers here (float32)


class Encoder(nn.Module):
    def __init__(self, d_model, heads, d_ff, layers, attn_dropout, dropout):
        super().__init__()
        self.layers = nn.ModuleList(Layer(d_model, heads, d_ff, attn_dropout, dropout) for _ in range(layers))
        self.norm = RMSNorm(d_model)

    def forward(self, x):
        positions = torch.arange(x.shape[1], device=x.device)
        rotary = self.layers[0].self_attn.rotary_tables(positions) if len(self.layers) else None
        for layer in self.layers:
            x = layer(x, rotary)
        return self.norm(x)


class Layer(nn.Module):
    """Pre-norm: x + dropout(attention(norm1(x))), then x + ffn(norm2(x))."""

    def __init__(self, d_model, heads, d_ff, attn_dropout, dropout):
        super().__init__()
        self.self_attn = Attention(d_model, heads, attn_dropout)
        self.ffn = GatedFeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = RMSNorm(d_model), RMSNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, rotary):
        x = x + self.dropout(self.self_attn(self.norm1(x), rotary))
        return x + self.ffn(self.norm2(x))


class GatedFeedForward(nn.Module):
    """fc2(dropout(silu(fc_gate(x)) * fc1(x))), dropped out again; no biases."""

    def __init__(self, d_model, d_ff, dropout):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=False)
        self.fc_gate = nn.Linear(d_model, d_ff, bias=False)
        self.fc2 = nn.Linear(d_ff, d_model, bias=False)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout2(self.fc2(self.dropout1(F.silu(self.fc_gate(x)) * self.fc1(x))))


class VariateBias(nn.Module):
    """The release's any-variate attention bias (per head: other variate, same variate). Held as a weight only:
    with one variate per series it is a constant per head, which softmax ignores (module docstring). The
    release keeps it in each layer's attention (encoder.layers.<i>.self_attn.var_attn_bias)."""

    def __init__(self, heads):
        super().__init__()
        self.emb = nn.Embedding(2, heads)


class Attention(nn.Module):
    """Causal multi-head attention, bias-free projections, RMSNorm on each head's q and k, then rotary position
    (base 10000, interleaved pairs) on the first half of each head's dimensions, by time id."""

    def __init__(self, d_model, heads, attn_dropout):
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model, bias=False)
                                                                for _ in range(4))
        self.q_norm, self.k_norm = RMSNorm(self.head_dim), RMSNorm(self.head_dim)
        self.attn_dropout = nn.Dropout(attn_dropout)

    def rotary_tables(self, positions):
        """(cos, sin) [T, 1, pairs]: one angle per pair of the rotated half and time id, in float32 whatever the
        network's dtype (as the reference's tables), the tables then in it."""
        width = self.head_dim // 2  # the rotated half; theta_i = 10000^(-2i / width), float32 as uni2ts's buffer
        theta = 1.0 / torch.pow(10000, torch.arange(0, width, 2, dtype=torch.float, device=positions.device) / width)
        angles = (positions.float()[:, None] * theta[None]).unsqueeze(1)
        return angles.cos().to(self.q_proj.weight.dtype), angles.sin().to(self.q_proj.weight.dtype)

    @staticmethod
    def rotate(x, rotary):
        """x [B, T, heads, head_dim]: each pair (x0, x1) of the first half turned to (x0 cos - x1 sin, x1 cos +
        x0 sin), the reference's cos * x + sin * (-x1, x0) term for term; the second half as it is."""
        cos, sin = rotary
        pairs = x[..., :2 * cos.shape[-1]].unflatten(-1, (-1, 2))
        first, second = pairs[..., 0], pairs[..., 1]
        turned = torch.stack([first * cos - second * sin, second * cos + first * sin], -1).flatten(-2)
        return torch.cat([turned, x[..., turned.shape[-1]:]], -1)

    def forward(self, x, rotary):
        """Norms and rotation on [B, T, heads, dim], contiguous, before the heads move forward for attention."""
        batch, length, _ = x.shape
        q, k, v = (proj(x).view(batch, length, self.heads, self.head_dim)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = self.rotate(self.q_norm(q), rotary), self.rotate(self.k_norm(k), rotary)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = attention(q, k, v, self.attn_dropout, is_causal=True, scale=self.head_dim ** -0.5)
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, -1))
