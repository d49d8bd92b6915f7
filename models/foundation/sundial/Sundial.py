"""Sundial: thuml's generative time-series foundation model (thuml/sundial-base-128m, 128M parameters). A causal
Transformer decoder reads a series as tokens of 16 steps (a patch MLP of the values and their mask); a small
flow-matching network (TimeFlow: an MLP with adaptive layer norms, conditioned on the last token's state) turns
Gaussian noise into samples of the next 720 steps. Liu et al., "Sundial: A Family of Highly Capable Time Series
Foundation Models", ICML 2025.

A native implementation, plain torch, written from the reference code's facts (the release's modeling_sundial.py
and flow_loss.py, which run only through transformers' trust_remote_code and, for generate, transformers 4.40):
the same weights (adapter.py maps the released keys), the same arithmetic, the same sampler and rollout.
crosscheck.py holds it to the reference: equal velocities, losses and samples for the same
noise.

What a forecast is (the reference's generate(revin=True, num_samples=S)): each series is normalised by its
context's mean and standard deviation (population, plus 1e-5); the decoder reads it, left-padded with zeros to
whole tokens (the padding's mask 0); the flow head starts S paths from N(0, 1) noise and takes
`num_sampling_steps` Euler steps, x += (v(x, t) - noise) / steps with t = i / steps (the network predicts the
clean sample, so v - noise is the straight path's velocity). A horizon past one output token (720) rolls out:
the samples' (lower) median is appended to the normalised context and the decoder reads the longer series again
(the reference keeps a key-value cache; the same tokens, the same attention). The median is read from the sorted
samples (lower_median: torch.median's values), as median(dim) has no deterministic CUDA kernel (--deterministic).
The samples are scaled back, and the model returns their quantiles at `quantile_levels`: [B, pred_len, C, 9].
The experiment scores the 0.5 level as the point forecast; the paper scores the samples' mean (README.md here).

Randomness follows the window: every draw (the sampler's noise, the flow-matching noise and times) goes through
layers.noise, rows window-major ((window, channel, sample) order), so samples and metrics are the same on any
number of processes and at any --eval_batch_size, and fine-tuning is world-size exact.

Training (`computes_loss`): given the window's future, the loss is the reference's flow-matching loss over every
whole token of the context: each token's target is the next 720 steps of context ++ future (the first pred_len
of them scored, as sktime's collator masks them), repeated diffusion_batch_mul times with fresh noise and times,
weighted 1/k at the k-th step, inputs normalised per series as the reference's forward(revin=True). It returns
one loss per window (the mean over its scored rows).

Shapes: with --pretrain_model_path DIR the architecture is DIR/config.json's; without it the released one with
--d_model, --n_heads, --e_layers, --d_ff and --dropout in place of the released sizes.

The attention weights' dropout runs through layers.dropout.attention: a dropout that follows the sample (keyed
by the window, so fine-tuning is the same on any number of processes), where the fused kernel's dropout_p would
draw from each process's generator."""
import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from layers import noise
from layers.dropout import attention
from models.foundation.sundial import adapter as release
from utils.errors import UserError

QUANTILE_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
DEFAULT_SAMPLES = 20  # the release's model card and GIFT-Eval submission draw 20 samples
GENERATE_EPS = 1e-5  # generate's revin: std + 1e-5
LOSS_MIN_STD = 1e-2  # forward(revin=True) for training: std <= 1e-2 is replaced by 1
ROTARY_BASE = 10000  # the reference's rotary embedding ignores rope_theta and keeps this base
TIME_SCALE = 1000  # the flow network reads t in [0, 1) as t * 1000
FREQUENCY_DIM = 256  # sinusoidal embedding size of that time
FLOW_NORM_EPS = 1e-6
ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu, "relu": F.relu}


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)
    computes_loss = True  # trained on its own flow-matching objective (exp.forward.training_loss)
    quantile_levels = QUANTILE_LEVELS
    default_num_samples = DEFAULT_SAMPLES
    checkpoint_adapters = (release.SUNDIAL,)
    series_as_given = True  # forecasts the user's series as the file holds it (exp.adaptation)

    def __init__(self, configs):
        super().__init__()
        path = getattr(configs, "pretrain_model_path", None)
        config = release.folder_config(path) if path else None
        if config is None:  # no folder: the released architecture at TSLib's sizes
            config = release.generic_config(configs)
        self.token = int(config["input_token_len"])
        self.output_len = int(config["output_token_lens"][-1])
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not divisible by {heads} attention heads")
        if configs.seq_len < self.token:
            raise ValueError(f"Sundial reads tokens of {self.token} steps and --seq_len {configs.seq_len} is shorter "
                             f"than one, which leaves no whole token to train on: use --seq_len {self.token} or more")
        self.seq_len, self.pred_len = configs.seq_len, configs.pred_len
        self.num_samples = int(getattr(configs, "num_samples", None) or DEFAULT_SAMPLES)
        self.sampling_steps = int(getattr(configs, "sampling_steps", None) or config["num_sampling_steps"])
        self.diffusion_batch_mul = int(config["diffusion_batch_mul"])
        act = ACTIVATIONS[config["hidden_act"]]
        dropout = float(config["dropout_rate"])
        self.embed_layer = PatchEmbedding(self.token, int(config["intermediate_size"]), hidden, act, dropout)
        self.layers = nn.ModuleList(DecoderLayer(hidden, heads, int(config["intermediate_size"]), act, dropout)
                                    for _ in range(int(config["num_hidden_layers"])))
        self.norm = nn.LayerNorm(hidden)
        self.flow = FlowNetwork(self.output_len, hidden, hidden, int(config["flow_loss_depth"]))
        self.rotary = Rotary(hidden // heads)
        self.register_buffer(release.FIELDS_KEY, release.fields_tensor(config))  # config.json's other fields
        # moved with the model once, no key: not built and copied to the device every batch
        self.register_buffer("levels", torch.tensor(QUANTILE_LEVELS, device="cpu"), persistent=False)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Weights of another head count load (no weight shows it) and attend wrongly: refused."""
        theirs = state_dict.get(prefix + release.FIELDS_KEY)
        ours = int(getattr(self, release.FIELDS_KEY)[0])
        if theirs is not None and int(theirs[0]) != ours:
            raise UserError(f"these Sundial weights attend with {int(theirs[0])} heads and this model with {ours}: "
                            "build it from the release they came from (--pretrain_model_path) or with --n_heads "
                            f"{int(theirs[0])}")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ------------------------------------------------------------ the decoder
    def encode(self, series):
        """[N, L] normalised series -> [N, tokens, hidden]: the decoder's last hidden states."""
        hidden = self.embed_layer(series)
        cos, sin = self.rotary(hidden.shape[1], hidden.dtype, hidden.device)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin)
        return self.norm(hidden)

    # ------------------------------------------------------------ forecasting
    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None, target=None):
        batch, length, channels = x_enc.shape
        series = x_enc.transpose(1, 2).reshape(batch * channels, length)  # window-major: a window's channels together
        # The experiment keys the draws by window (training steps, evaluation batches); a model used on its own
        # keys them by the window's values, so the same window gets the same forecast in any batch.
        keys = contextlib.nullcontext() if noise.keyed() else noise.draws_follow_windows(content_keys(x_enc))
        with keys:
            if target is not None:
                future = target.transpose(1, 2).reshape(batch * channels, -1)
                return self.loss(series, future).view(batch, channels).mean(1)  # [B]: each window's loss
            samples = self.samples(series).float()  # [B * C, S, pred_len]; quantile needs float32 or 64
        levels = self.levels  # float32, as torch.quantile needs; a model cast to another dtype builds them anew
        if levels.dtype != torch.float32:
            levels = torch.tensor(QUANTILE_LEVELS, device=samples.device)
        quantiles = torch.quantile(samples, levels, dim=1).to(x_enc.dtype)  # [Q, B * C, pred_len]
        return quantiles.view(-1, batch, channels, self.pred_len).permute(1, 3, 2, 0)  # [B, pred_len, C, Q]

    def samples(self, series, num_samples=None, steps=None):
        """[N, S, pred_len] sample paths of N series [N, L], as the reference's generate(revin=True) draws them."""
        num_samples = num_samples or self.num_samples
        means = series.mean(dim=-1, keepdim=True)
        stdev = series.std(dim=-1, keepdim=True, unbiased=False) + GENERATE_EPS
        context = (series - means) / stdev
        blocks, remaining = [], self.pred_len
        while remaining > 0:
            last = self.encode(context)[:, -1]
            block = self.flow.sample(last, num_samples, steps or self.sampling_steps)[..., :remaining]
            blocks.append(block)
            remaining -= block.shape[-1]
            if remaining > 0:  # roll out: the samples' lower median extends the context
                context = torch.cat([context, lower_median(block, dim=1)], dim=-1)
        return torch.cat(blocks, dim=-1) * stdev.unsqueeze(1) + means.unsqueeze(1)

    # ------------------------------------------------------------ training
    def loss(self, series, future):
        """[N] flow-matching losses of N series [N, L] given their futures [N, H] (module docstring)."""
        means = series.mean(1, keepdim=True)
        stdev = series.std(dim=1, keepdim=True, unbiased=False)
        stdev = torch.where(stdev > LOSS_MIN_STD, stdev, torch.ones_like(stdev))
        context, future = (series - means) / stdev, (future - means) / stdev
        hidden = self.encode(context)  # [N, T, D]
        targets, scored, whole = self.token_targets(context, future, hidden.shape[1])
        rows, mul = hidden.shape[0], self.diffusion_batch_mul
        # (series, repeat, token) rows: window-major, so each window's draws follow it
        condition = hidden.unsqueeze(1).expand(-1, mul, -1, -1).reshape(-1, hidden.shape[-1])
        targets = targets.unsqueeze(1).expand(-1, mul, -1, -1).reshape(-1, self.output_len)
        eps = noise.randn(targets.shape[0], self.output_len, device=targets.device, dtype=targets.dtype)
        t = noise.rand(targets.shape[0], device=targets.device, dtype=targets.dtype)
        noised = t[:, None] * targets + (1 - t[:, None]) * eps
        velocity = self.flow(noised, t * TIME_SCALE, condition)
        weights = 1.0 / torch.arange(1, self.output_len + 1, dtype=targets.dtype, device=targets.device)
        per_row = (scored * weights * (velocity - targets) ** 2).sum(dim=-1).view(rows, mul, -1)
        return (per_row * whole).sum(dim=(1, 2)) / (mul * whole.sum())

    def token_targets(self, context, future, tokens):
        """Each token's target, the next output_len steps of context ++ future [N, T, out] (zeros past the end),
        the mask of its scored steps (the first pred_len) [out], and of the tokens scored (whole ones) [T]."""
        pad = tokens * self.token - context.shape[1]
        useful = min(future.shape[1], self.output_len)
        full = torch.cat([context, future], dim=1)
        start = self.token - pad  # token 0 ends here in the series' own steps
        labels = full[:, start:start + (tokens - 1) * self.token + useful]
        labels = F.pad(labels, (0, self.output_len - useful))
        targets = labels.unfold(-1, self.output_len, self.token)  # [N, T, out]
        steps = torch.arange(self.output_len, device=context.device)
        scored = (steps < useful).to(context.dtype)
        whole = torch.ones(tokens, dtype=context.dtype, device=context.device)
        whole[0] = 1.0 if pad == 0 else 0.0  # a token part padding is not scored (sktime's collator)
        return targets, scored, whole


def lower_median(x, dim):
    """torch.median(x, dim).values (the lower of the two middle values of an even count; NaN where the slice holds
    one) from a sort, which CUDA runs deterministically."""
    ordered = x.sort(dim=dim).values  # NaN sorts last
    last = ordered.select(dim, -1)
    return torch.where(last.isnan(), last, ordered.select(dim, (x.shape[dim] - 1) // 2))


def content_keys(x_enc):
    """One integer per window of x_enc [B, L, C] from its values' bits (a fixed weighted sum, wrapping in int64):
    the same on any device and process, whatever else the batch holds."""
    bits = x_enc.detach().float().reshape(x_enc.shape[0], -1).contiguous().view(torch.int32).to(torch.int64)
    weights = torch.arange(1, bits.shape[1] + 1, dtype=torch.int64, device=bits.device) * 0x9E3779B1
    return (bits * weights).sum(dim=1).tolist()


class PatchEmbedding(nn.Module):
    """Tokens of `token` steps, left-padded with zeros to whole tokens, read with their mask (1 for a value, 0
    for padding): a residual two-layer MLP of [values, mask]."""

    def __init__(self, token, intermediate, hidden, act, dropout):
        super().__init__()
        self.token, self.act = token, act
        self.hidden_layer = nn.Linear(2 * token, intermediate)
        self.output_layer = nn.Linear(intermediate, hidden)
        self.residual_layer = nn.Linear(2 * token, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, series):
        pad = -series.shape[-1] % self.token
        values = F.pad(series, (pad, 0))
        mask = F.pad(torch.ones_like(series), (pad, 0))
        tokens = torch.cat([values.unfold(-1, self.token, self.token), mask.unfold(-1, self.token, self.token)], -1)
        out = self.dropout(self.output_layer(self.act(self.hidden_layer(tokens))))
        return out + self.residual_layer(tokens)


class Rotary(nn.Module):
    """Rotary positions over the whole head (rotate-half), base 10000, positions 0..T-1: the cosines and sines
    computed as the reference's cache is (float32 outer product, cat of the two halves)."""

    def __init__(self, dim):
        super().__init__()
        inv_freq = 1.0 / (ROTARY_BASE ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, tokens, dtype, device):
        positions = torch.arange(tokens, device=device, dtype=torch.int64).type_as(self.inv_freq)
        freqs = torch.outer(positions, self.inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class DecoderLayer(nn.Module):
    """Pre-norm causal self-attention (biased q, k, v; no bias on o) with rotary positions, then a gated
    feed-forward without biases: down(act(gate(x)) * up(x))."""

    def __init__(self, hidden, heads, intermediate, act, dropout):
        super().__init__()
        self.heads, self.act = heads, act
        self.self_attn = nn.Module()
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(self.self_attn, name, nn.Linear(hidden, hidden))
        self.self_attn.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.attention_dropout = nn.Dropout(dropout)  # on the attention weights (the reference's sdpa dropout_p)
        self.ffn_layer = nn.Module()
        self.ffn_layer.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.ffn_layer.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.ffn_layer.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

    def forward(self, x, cos, sin):
        batch, tokens, hidden = x.shape
        h = self.norm1(x)
        q, k, v = (getattr(self.self_attn, name)(h).view(batch, tokens, self.heads, -1).transpose(1, 2)
                   for name in ("q_proj", "k_proj", "v_proj"))
        out = attention(rotate(q, cos, sin), rotate(k, cos, sin), v, self.attention_dropout, is_causal=True)
        x = x + self.self_attn.o_proj(out.transpose(1, 2).reshape(batch, tokens, hidden))
        h = self.norm2(x)
        ffn = self.ffn_layer
        return x + ffn.down_proj(self.act(ffn.gate_proj(h)) * ffn.up_proj(h))


class FlowNetwork(nn.Module):
    """TimeFlow's network (the reference's SimpleMLPAdaLN): v(x, t, z), an MLP over the output token whose
    residual blocks are modulated (shift, scale, gate) by embed(t) + cond(z)."""

    def __init__(self, channels, width, condition, depth):
        super().__init__()
        self.time_embed = nn.Module()
        self.time_embed.mlp = nn.Sequential(nn.Linear(FREQUENCY_DIM, width), nn.SiLU(), nn.Linear(width, width))
        self.cond_embed = nn.Linear(condition, width)
        self.input_proj = nn.Linear(channels, width)
        self.res_blocks = nn.ModuleList(ResBlock(width) for _ in range(depth))
        self.final_layer = FinalLayer(width, channels)
        # the embedding's frequencies, computed on the host as the reference does and moved with the model once
        self.register_buffer("frequencies", frequencies(torch.float32), persistent=False)

    def time(self, t):
        """The sinusoidal embedding of t (already * 1000) through the time MLP: [R] -> [R, width]."""
        freqs = self.frequencies
        if not freqs.dtype == t.dtype == torch.float32:  # computed in t's dtype as the reference does (the buffer
            freqs = frequencies(t.dtype).to(t.device)    # is float32's; cast with the model it would be rounded)
        angles = t[:, None] * freqs[None]
        return self.time_embed.mlp(torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1))

    def forward(self, x, t, z):
        """Velocities of rows x [R, channels] at times t [R] (* 1000) under conditions z [R, condition]."""
        return self.velocity(x, self.time(t) + self.cond_embed(z))

    def velocity(self, x, y):
        """x [..., channels] under modulation inputs y broadcastable to [..., width]."""
        x = self.input_proj(x)
        for block in self.res_blocks:
            x = block(x, y)
        return self.final_layer(x, y)

    def sample(self, z, num_samples, steps):
        """[N, S, channels]: S paths per condition z [N, condition], Euler steps from noise (the reference's
        FlowLoss.sample). The modulations depend on the condition and the step only, so they are computed once per
        series, not once per sample as the reference's repeated rows are: the same values."""
        rows = z.shape[0]
        start = noise.randn(rows * num_samples, self.input_proj.in_features, device=z.device, dtype=z.dtype)
        start = start.view(rows, num_samples, -1)
        condition = self.cond_embed(z).unsqueeze(1)  # [N, 1, width]
        x, dt = start, 1.0 / steps
        for i in range(steps):
            t = torch.full((1,), float(i), dtype=z.dtype, device=z.device) / steps
            x = torch.add(x, self.velocity(x, self.time(t * TIME_SCALE) + condition) - start, alpha=dt)
        return x


def frequencies(dtype):
    """The sinusoidal time embedding's FREQUENCY_DIM / 2 frequencies in `dtype`, on the host (the reference's)."""
    half = FREQUENCY_DIM // 2
    return torch.exp(-math.log(10000) * torch.arange(0, half, dtype=dtype, device="cpu") / half)


class ResBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=FLOW_NORM_EPS)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x, y):
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        # x * (1 + scale) + shift and x + gate * h, each one fused pass (the sampler runs them on every sample row)
        return torch.addcmul(x, gate, self.mlp(torch.addcmul(shift, self.in_ln(x), 1 + scale)))


class FinalLayer(nn.Module):
    def __init__(self, width, channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=FLOW_NORM_EPS)
        self.linear = nn.Linear(width, channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x, y):
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(torch.addcmul(shift, self.norm_final(x), 1 + scale))
