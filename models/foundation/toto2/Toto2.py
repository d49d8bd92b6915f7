"""Toto 2.0: Datadog's decoder-only zero-shot forecaster (Datadog/Toto-2.0-313m, -1B, -2.5B; 2,454,281,792
parameters at 2.5B). Patches of 32 steps, causally scaled (a running mean and standard deviation, float64, at
each patch's last step) and squashed by asinh, embedded with their unobserved mask; a stack of u-muP transformer
layers, causal attention over time (rotary position with xPos on the first half of each head) and, in a few
layers, attention across a series' variates at each patch; from each position the quantiles 0.1 ... 0.9 of the
next patch.

A native implementation, plain torch, written from the toto2 package (timecopilot-toto-2 0.1.1 = DataDog/toto's
toto2/model.py) and the unit-scaling functions it calls, read as facts; why not the package: it pins gluonts and
so pandas < 3. crosscheck.py and tests/test_toto2.py hold ours to the package's Toto2Model.forecast.

What a forecast is (Toto2Model.forecast, decode_block_size None: one forward, the leaderboard setting):
- the context (whole patches) and the horizon's patches as unobserved zeros, the last context patch counted as
  observed whatever its mask; the causal scaler over the whole row: per step the mean and standard deviation
  (Welford, correction 1, floor 1e-6) of the observed values so far, in float64, taken at each patch's last step;
  the horizon's are the context's last (it observes nothing);
- each patch [asinh((x - loc) / scale) where observed else 0, 1 where unobserved] -> InputResidualMLP;
- the layers: pre-RMSNorm (no weights), attention, tau-weighted residual (x tau + skip) / sqrt(1 + tau^2) with
  the release's attn_tau / mlp_tau buffers; RMSNorm, SwiGLU (fc1 -> [gate, x], gate * silu(x)), fc2, the same
  residual. A time layer attends causally over the series' patches (patches observing nothing are keys only of
  each other); a variate layer attends, at each patch, across the variates of the same series (non-causal, no
  position). u-muP's forward multipliers: every linear layer's output times 1 / sqrt(fan_in), the output head's
  readouts 1 / fan_in, attention scores 1 / qk_dim, silu times a fixed constant in the residual MLPs;
- the last context position and the horizon's but last give the horizon's patches: 9 quantiles each, sinh, times
  the scale plus the location, sorted (never crossing).
Block decoding (the package's decode_block_size, for long horizons): the horizon in blocks of whole patches, one
forward each over everything so far, each block's median fed back as observed (and flagged observed for every
row) and the causal scaler run again. The package keeps the keys of earlier forwards in a KV cache, rotated and
xPos-scaled at their own forward's centre; ours recomputes them and gives each position that centre, which the
cache implies, so the forecasts agree. --decode_block_size or Model.forecast's `block`; without either a forecast
is one forward, the setting of the release's leaderboard results.

Each channel of a window is a series of its own: [B, L, C] -> B*C rows, so a variate layer sees one variate, and
attention over one key is that key's value (computed so). In evaluation the rows are padded to a multiple of 8
(copies of the first, dropped after): the matrix kernels then round a row the same in any batch (measured on one
thread; 1 ULP apart otherwise), so a forecast does not depend on --eval_batch_size or the process count.
Model.forecast takes several variates of one series together (series ids), the package's multivariate mode.

A context that is not whole patches loses its oldest seq_len % patch_size steps (the package's GluonTS wrapper
cuts its context so); context plus horizon past the rotary table (8192 patches) is refused. The released
residual_attn_ratio (sqrt(S / ln S)) says it was trained on S = 128 patches, 4096 steps; longer contexts run.

Fine-tuning (--adaptation): computes_loss. The forecast's own forward (context, then the horizon as unobserved
zeros), the pinball loss of its raw quantile outputs against asinh((y - loc) / scale) of the horizon's true
values, mean over the 9 levels and the pred_len steps, then over a window's channels. Datadog publishes no Toto 2.0
training code or objective. Gradients are plain autograd: u-muP's backward rescaling (dd_unit_scaling's, by the
local batch size times a cached world size) is an optimizer-side choice that changes gradients with the batch
layout; without it the gradient is the loss's, the same on any number of processes.

Shapes: with --pretrain_model_path DIR (config.json + model.safetensors) every size from config.json; without it
the 2.5B release's flags at --d_model, --n_heads, --e_layers, --d_ff (one variate layer, the last)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from models.foundation.toto2 import adapter as release

SILU_SCALE = math.exp(0.8 * math.log((2 / (1 - 1 / math.pi)) ** 0.5) + 0.2 * math.log(2.0))  # unit_scaling's silu
ROW_MULTIPLE = 8  # a forecast's rows padded to a multiple of this (Model.forward): the same bits in any batch
SOFTPLUS_SCALE = 0.52103  # unit_scaling's softplus output scale, which per_dim_scale's compensates


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)
    computes_loss = True
    quantile_levels = release.QUANTILES
    checkpoint_adapters = (release.TOTO2,)
    series_as_given = True

    def __init__(self, configs):
        super().__init__()
        path = getattr(configs, "pretrain_model_path", None)
        config = release.folder_config(path) if path else None
        config = config or release.generic_config(configs)
        self.patch = int(config["patch_size"])
        self.seq_len, self.pred_len = configs.seq_len, configs.pred_len
        if self.seq_len < self.patch:
            raise ValueError(f"--seq_len {self.seq_len} is shorter than one Toto 2.0 patch ({self.patch} steps)")
        self.context = self.seq_len // self.patch * self.patch
        positions = self.context // self.patch + math.ceil(self.pred_len / self.patch)
        if positions > release.ROPE_POSITIONS:
            raise ValueError(f"Toto 2.0 reads at most {release.ROPE_POSITIONS} patches of {self.patch} steps (its "
                             f"rotary table): --seq_len {self.seq_len} + --pred_len {self.pred_len} make {positions}; "
                             f"keep their patches within {release.ROPE_POSITIONS * self.patch} steps")
        # the package's decode_block_size (--decode_block_size; None: one forward, the leaderboard setting)
        self.decode_block = getattr(configs, "decode_block_size", None) or None
        if self.decode_block is not None and (self.decode_block <= 0 or self.decode_block % self.patch):
            raise ValueError(f"--decode_block_size {self.decode_block} is not a positive multiple of the Toto 2.0 "
                             f"patch ({self.patch} steps)")
        self.toto = Network(config)
        # the levels' float32 bits as int32: on the model's device (no copy from the host per step) and exact in a
        # half-precision copy; not persistent, so not in the state dict
        self.register_buffer("level_bits", torch.tensor(self.quantile_levels, dtype=torch.float32).view(torch.int32),
                             persistent=False)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None, target=None):
        batch, _, channels = x_enc.shape
        rows = x_enc[:, -self.context:].permute(0, 2, 1).reshape(batch * channels, 1, self.context).float()
        if target is not None:  # training: each window's loss [B]
            future = target.permute(0, 2, 1).reshape(batch * channels, 1, -1).float()
            return self.training_loss(rows, future).view(batch, channels).mean(1)
        count = rows.shape[0]  # evaluating, padded to a multiple of 8 rows: the kernels round a row alike in any batch
        if not self.training:
            rows = torch.cat([rows, rows[:1].expand(-count % ROW_MULTIPLE, -1, -1)])
        quantiles = self.toto.forecast(rows, None, None, self.pred_len, block=self.decode_block)[:, :count]
        return quantiles.reshape(len(self.quantile_levels), batch, channels, self.pred_len).permute(1, 3, 2, 0) \
            .to(x_enc.dtype)

    def forecast(self, target, mask=None, series_ids=None, horizon=None, known=None, known_mask=None, known_ids=None,
                 block=None):
        """The package's Toto2Model.forecast: target [..., V, T] (T whole patches), series_ids [..., V] (variates
        of one series attend to each other in the variate layers; None: each its own) -> [9, ..., V, horizon].
        known [..., K, T + horizon] (known_mask, known_ids [..., K]): the package's known_dynamic rows, future-known
        covariates read beside the targets and not forecast. block: its decode_block_size (default the model's)."""
        return self.toto.forecast(target, mask, series_ids, horizon or self.pred_len, known=known,
                                  known_mask=known_mask, known_ids=known_ids, block=block or self.decode_block)

    def training_loss(self, rows, future):
        """Each row's pinball loss of the forecast's raw quantiles in the model's space (module docstring): [N]."""
        raw, loc, scale = self.toto.forecast(rows, None, None, self.pred_len, raw=True)
        steps = future.shape[-1]
        truth = torch.asinh((future - loc[..., :steps]) / scale[..., :steps])  # [N, 1, H]
        error = truth.unsqueeze(0) - raw[..., :steps]  # [Q, N, 1, H]
        levels = self.level_bits.view(torch.float32).to(error.dtype).view(-1, 1, 1, 1)
        return torch.maximum(levels * error, (levels - 1) * error).mean((0, 2, 3))


def causal_scaler(values, mask, patch, minimum=1e-6):
    """toto2's PatchedCausalStdScaler: (loc, scale) [..., T] in the values' dtype, the running mean and standard
    deviation (Welford, correction 1) of the observed values up to each patch's last step, in float64."""
    data, seen = values.double(), mask.double()
    count = seen.cumsum(-1).clamp_min(1)
    loc = (data * seen).cumsum(-1) / count
    previous = torch.cat([torch.zeros_like(loc[..., :1]), loc[..., :-1]], -1)
    spread = ((data - previous) * (data - loc) * seen).cumsum(-1)
    scale = torch.sqrt(spread / (count - 1).clamp(min=1)).clamp(min=minimum)

    def per_patch(x):
        return x.unflatten(-1, (-1, patch))[..., -1:].expand(*x.shape[:-1], -1, patch).flatten(-2)

    return per_patch(loc).to(values.dtype), per_patch(scale).to(values.dtype)


def rms_norm(x, eps):
    """x / sqrt(mean(x^2) + eps), the mean in float32 (unit_scaling's rms), no weight."""
    return x / (x.float().pow(2).mean(-1, keepdim=True) + eps).sqrt().to(x.dtype)


class Network(nn.Module):
    """toto2's Toto2Model: scaler, patch embedding, the layers, the quantile head. Module names are the release's."""

    def __init__(self, config):
        super().__init__()
        d_model, patch = int(config["d_model"]), int(config["patch_size"])
        self.patch, self.config = patch, dict(config)
        self.patch_proj = ResidualMLP(2 * patch, 4 * d_model, d_model, readout=False)
        self.transformer = Transformer(config)
        self.output_head = OutputHead(d_model, patch * len(release.QUANTILES))

    def forecast(self, target, mask, series_ids, horizon, raw=False, known=None, known_mask=None, known_ids=None,
                 block=None):
        """Toto2Model.forecast (module docstring): [..., V, T] -> [9, ..., V, horizon]; with raw, (the head's
        quantiles in the model's space [9, ..., V, Hp * patch], loc, scale over the horizon), one forward. `mask`
        None: every step observed (a run's windows; no value is read on the host). `block` (steps, a multiple of
        the patch): the package's decode_block_size, blocks of the horizon decoded in turn, each block's median fed
        back as observed."""
        patch, lead = self.patch, target.shape[:-2]
        whole = mask is None
        mask = torch.ones_like(target, dtype=torch.bool) if whole else mask
        targets, length = target.shape[-2:]
        ahead = math.ceil(horizon / patch)
        full = torch.cat([target, target.new_zeros(*target.shape[:-1], ahead * patch)], -1)
        seen = torch.cat([mask[..., :-patch], torch.ones_like(mask[..., -patch:]),
                          torch.zeros_like(mask[..., :1]).expand(*mask.shape[:-1], ahead * patch)], -1)
        if known is not None:  # future-known rows over context and horizon, their own mask, then unobserved
            pad = length + ahead * patch - known.shape[-1]
            full = torch.cat([full, F.pad(known.to(full.dtype), (0, pad))], -2)
            seen = torch.cat([seen, F.pad(known_mask, (0, pad))], -2)
            series_ids = torch.cat([series_ids, known_ids], -1)
        variates = full.shape[-2]
        context_patches = length // patch
        empty = seen[..., :length].unflatten(-1, (-1, patch)).sum(-1) == 0  # [..., V, context patches]
        if series_ids is None:
            ids = None if whole or not empty.any() else torch.zeros(*lead, variates, dtype=torch.long,
                                                                    device=full.device)
        else:
            ids = series_ids
        groups = None
        if ids is not None:
            groups = ids.unsqueeze(-1).expand(*ids.shape, context_patches + ahead).clone()
            groups[..., :context_patches][empty] = -1
        if block is not None and block % patch:
            raise ValueError(f"decode block {block} is not a multiple of the patch ({patch} steps)")
        step = ahead if not block else min(block // patch, ahead)
        ends = [context_patches + min(done + step, ahead) for done in range(0, ahead, step)]  # tokens of each pass
        # xPos centres the positions of each forward at (its last + 1) // 2; the package keeps keys of earlier
        # passes (its KV cache) with their pass's centre: a position keeps the centre of the pass it entered as
        # observed (the context: the first; a block's medians: the next), a pass's placeholders take its own
        centres = torch.empty(ends[-1], dtype=torch.long, device=full.device)
        starts = [context_patches, *ends[:-1]]
        centres[:context_patches] = ends[0] // 2
        for first, last, after in zip(starts, ends, ends[1:]):
            centres[first:last] = after // 2
        fed = torch.zeros_like(seen)  # steps fed back as medians: flagged observed for every row
        pieces = []
        for first, last in zip(starts, ends):
            loc, scale = causal_scaler(full, seen, patch)  # again: the medians fed back count
            scaled = torch.where(seen, (full - loc) / scale, torch.zeros_like(full)).asinh()
            dtype = self.patch_proj.linear1.weight.dtype  # the network's (a half-precision copy: its own)
            unobserved = (~(seen | fed)).to(full.dtype)
            tokens = self.patch_proj(torch.cat([scaled[..., :last * patch].unflatten(-1, (-1, patch)),
                                                unobserved[..., :last * patch].unflatten(-1, (-1, patch))],
                                               -1).to(dtype))
            hidden = self.transformer(tokens.flatten(0, -3) if lead else tokens,
                                      None if groups is None else groups[..., :last], variates,
                                      singletons=series_ids is None,
                                      centres=torch.cat([centres[:first], centres.new_full((last - first,), last // 2)]))
            hidden = hidden.reshape(*lead, variates, *hidden.shape[-2:])
            anchors = hidden[..., first - 1:last - 1, :]  # each predicts the next patch
            out = self.output_head(anchors).float().movedim(-1, 0)  # [Q, ..., V, patches, patch]
            span = slice(first * patch, last * patch)
            if raw:
                return out[..., :targets, :, :].flatten(-2), loc[..., :targets, span], scale[..., :targets, span]
            real = out.sinh() * scale[..., span].unflatten(-1, (-1, patch)) + loc[..., span].unflatten(-1, (-1, patch))
            real = clamp_nonfinite(real).sort(dim=0).values
            pieces.append(real)
            if last < ends[-1]:  # the block's median, fed back as observed
                full = full.clone()
                full[..., :targets, span] = real[len(release.QUANTILES) // 2, ..., :targets, :, :].flatten(-2)
                seen, fed = seen.clone(), fed.clone()
                seen[..., :targets, span] = True
                fed[..., span] = True
        return torch.cat(pieces, -2).flatten(-2)[..., :targets, :horizon]


def clamp_nonfinite(values):
    """+-inf replaced by the largest / smallest finite value of its patch, as the package does."""
    top = torch.where(values.isfinite(), values, -float("inf")).amax(-1, keepdim=True)
    bottom = torch.where(values.isfinite(), values, float("inf")).amin(-1, keepdim=True)
    return torch.where(values == float("inf"), top, torch.where(values == -float("inf"), bottom, values))


class ResidualMLP(nn.Module):
    """toto2's Input/OutputResidualMLP at tau 1: (linear2(silu(linear1 x)) + skip_proj(x)) / sqrt(2), u-muP's
    multipliers: 1 / sqrt(fan_in), the output's readouts (linear2, skip_proj) 1 / fan_in."""

    def __init__(self, inputs, hidden, outputs, readout):
        super().__init__()
        self.linear1 = nn.Linear(inputs, hidden)
        self.linear2 = nn.Linear(hidden, outputs)
        self.skip_proj = nn.Linear(inputs, outputs)
        power = 1.0 if readout else 0.5
        self.scales = (inputs ** -0.5, 1.0 / hidden ** power, 1.0 / inputs ** power)
        self.half = 1 / (1 + 1.0 ** 2) ** 0.5

    def forward(self, x):
        first, second, skip = self.scales
        hidden = F.silu(self.linear1(x) * first) * SILU_SCALE
        return (self.linear2(hidden) * second) * self.half + (self.skip_proj(x) * skip) * self.half


class OutputHead(nn.Module):
    """toto2's QuantileKnotsOutputHead: d_model -> [patch, 9] through an output residual MLP."""

    def __init__(self, d_model, outputs):
        super().__init__()
        self.param_projection = nn.Module()
        self.param_projection.proj = ResidualMLP(d_model, 4 * d_model, outputs, readout=True)

    def forward(self, x):
        return self.param_projection.proj(x).unflatten(-1, (-1, len(release.QUANTILES)))


class Transformer(nn.Module):
    """toto2's VariateTimeTransformerDecoder: the layers, then a weightless RMSNorm."""

    def __init__(self, config):
        super().__init__()
        layers, group = int(config["num_layers"]), int(config["layer_group_size"])
        variate = int(config["num_variate_layers_per_group"])
        first = bool(config["variate_layer_first"])
        self.variate = [(i % group < variate) if first else (i % group >= group - variate) for i in range(layers)]
        self.eps = float(config["norm_eps"])
        self.layers = nn.ModuleList(Layer(config, i, v) for i, v in enumerate(self.variate))

    def forward(self, state, groups, variates, singletons, centres):
        """state [N*V, S, d]; groups [N, V, S] (series ids, -1 for patches observing nothing) or None (every
        patch observed, every variate of its own series); variates V; centres [S], each position's xPos centre."""
        rows, length, _ = state.shape
        time_mask = variate_mask = None
        if groups is not None:
            flat = groups.reshape(-1, length)  # [N*V, S]
            causal = torch.ones(length, length, dtype=torch.bool, device=state.device).tril()
            time_mask = (causal & (flat[:, :, None] == flat[:, None, :])).unsqueeze(1)  # [N*V, 1, S, S]
            if not singletons and variates > 1:
                by_position = groups.reshape(-1, variates, length).transpose(1, 2).reshape(-1, variates)
                variate_mask = (by_position[:, :, None] == by_position[:, None, :]).unsqueeze(1)  # [N*S, 1, V, V]
        positions = torch.arange(length, device=state.device)
        for layer, is_variate in zip(self.layers, self.variate):
            if is_variate:
                across = state.unflatten(0, (-1, variates)).transpose(1, 2).flatten(0, 1)  # [N*S, V, d]
                across = layer(across, mask=variate_mask, alone=singletons or variates == 1)
                state = across.unflatten(0, (-1, length)).transpose(1, 2).flatten(0, 1)
            else:
                state = layer(state, mask=time_mask, positions=positions, centres=centres)
        return rms_norm(state, self.eps)


class Layer(nn.Module):
    """toto2's SelfAttentionTransformerLayer: pre-norm attention and SwiGLU, each a tau-weighted residual."""

    def __init__(self, config, index, variate):
        super().__init__()
        self.eps = float(config["norm_eps"])
        self.attn = Attention(config, variate)
        self.ffn = SwiGLU(int(config["d_model"]), int(config["d_ff"]), bool(config["mlp_bias"]))
        layers = int(config["num_layers"])
        mult, ratio = float(config["residual_mult"]), float(config["residual_attn_ratio"])
        self.register_buffer("attn_tau", torch.tensor(tau(2 * index, 2 * layers, mult, ratio)))
        self.register_buffer("mlp_tau", torch.tensor(tau(2 * index + 1, 2 * layers, mult, ratio)))

    @staticmethod
    def residual(branch, skip, weight):
        denominator = (1 + weight ** 2) ** 0.5
        return (weight / denominator) * branch + (1 / denominator) * skip

    def forward(self, x, **attention):
        x = self.residual(self.attn(rms_norm(x, self.eps), **attention), x, self.attn_tau)
        return self.residual(self.ffn(rms_norm(x, self.eps)), x, self.mlp_tau)


def tau(index, depth, mult, ratio):
    """unit_scaling's transformer_residual_scaling_rule: the weight of residual branch `index` of `depth`."""
    alpha_mlp = mult * (2 / (1 + ratio ** 2)) ** 0.5
    alpha_attn = ratio * alpha_mlp
    attns, mlps = (index + 1) // 2, index // 2
    return (alpha_attn if index % 2 == 0 else alpha_mlp) / (depth / 2 + attns * alpha_attn ** 2
                                                              + mlps * alpha_mlp ** 2) ** 0.5


class SwiGLU(nn.Module):
    """fc1 -> [gate, x]; fc2(gate * silu(x)); u-muP's 1 / sqrt(fan_in) on each."""

    def __init__(self, d_model, d_ff, bias):
        super().__init__()
        self.fc1 = nn.Linear(d_model, 2 * d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)
        self.scales = (d_model ** -0.5, d_ff ** -0.5)

    def forward(self, x):
        gate, value = (self.fc1(x) * self.scales[0]).chunk(2, -1)
        return self.fc2(gate * F.silu(value)) * self.scales[1]


class PerDimScale(nn.Module):
    """dd_unit_scaling's PerDimScale on the queries: q * softplus(p) / ln 2 (1 at p = 0), per dimension."""

    def __init__(self, dim):
        super().__init__()
        self.per_dim_scale = nn.Parameter(torch.zeros(dim))

    def forward(self, q):
        factor = (F.softplus(self.per_dim_scale) * (1.0 / SOFTPLUS_SCALE) / math.log(2.0)).to(q.dtype)
        return SOFTPLUS_SCALE * (q * factor)


class Attention(nn.Module):
    """toto2's SelfAttention: fused [q | k | v] projection (GQA: num_groups key/value heads), optional qk RMSNorm,
    per-dimension query scale, in a time layer rotary position (xPos if configured) on the first half of each head;
    scores times 1 / qk_dim (muP)."""

    def __init__(self, config, variate):
        super().__init__()
        d_model, self.heads, self.groups = int(config["d_model"]), int(config["num_heads"]), int(config["num_groups"])
        self.qk, self.v = int(config["qk_dim"]), int(config["v_dim"])
        self.variate, self.eps = variate, float(config["norm_eps"])
        self.qk_norm, self.xpos = bool(config["qk_norm"]), bool(config["use_xpos"])
        bias = bool(config["attn_bias"])
        self.in_proj = nn.Linear(d_model, self.qk * self.heads + (self.qk + self.v) * self.groups, bias=bias)
        self.out_proj = nn.Linear(self.v * self.heads, d_model, bias=bias)
        self._pds = PerDimScale(self.qk) if config["per_dim_scale"] else None
        self.scales = (d_model ** -0.5, (self.v * self.heads) ** -0.5)

    def rotary(self, q, k, positions, centres):
        """Rotary position on the first half of each head's dimensions (interleaved pairs, base 10000); with xPos
        the queries times base_scale ** ((pos - centre) / 256), the keys divided so."""
        width = self.qk // 2
        theta = 1.0 / torch.pow(10000, torch.arange(0, width, 2, dtype=torch.float, device=q.device) / width)
        angles = (positions.float()[:, None] * theta[None]).repeat_interleave(2, -1)  # [S, width]
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)

        def turn(x):
            pairs = x.unflatten(-1, (-1, 2))
            return torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)

        q_rot, k_rot = q[..., :width], k[..., :width]
        q_rot, k_rot = cos * q_rot + sin * turn(q_rot), cos * k_rot + sin * turn(k_rot)
        if self.xpos:
            base = (torch.arange(0, width, 2, device=q.device).float() + 0.4 * width) / (1.4 * width)
            power = (positions.float() - centres) / 256
            scale = (base ** power.unsqueeze(-1)).repeat_interleave(2, -1)
            q_rot = q_rot * (scale ** 1.0).to(q.dtype)
            k_rot = k_rot * (scale ** -1.0).to(q.dtype)
        return torch.cat([q_rot, q[..., width:]], -1), torch.cat([k_rot, k[..., width:]], -1)

    def forward(self, x, mask=None, positions=None, centres=None, alone=False):
        batch, length, _ = x.shape
        q, k, v = (self.in_proj(x) * self.scales[0]).split(
            [self.qk * self.heads, self.qk * self.groups, self.v * self.groups], -1)
        if alone:  # one variate: attention over one key is its value (exact whatever the batch)
            out = v.unflatten(-1, (self.groups, self.v)).repeat_interleave(self.heads // self.groups, -2)
            return self.out_proj(out.flatten(-2)) * self.scales[1]
        q = q.unflatten(-1, (self.heads, self.qk)).transpose(1, 2)
        k = k.unflatten(-1, (self.groups, self.qk)).transpose(1, 2)
        v = v.unflatten(-1, (self.groups, self.v)).transpose(1, 2)
        if self.qk_norm:
            q, k = rms_norm(q, self.eps), rms_norm(k, self.eps)
        if self._pds is not None:
            q = self._pds(q)
        if not self.variate:
            q, k = self.rotary(q, k, positions, centres)
        causal = not self.variate and mask is None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=1.0 / self.qk,
                                             enable_gqa=self.heads != self.groups)
        return self.out_proj(out.transpose(1, 2).flatten(-2)) * self.scales[1]
