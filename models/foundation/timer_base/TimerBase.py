"""TimerBase: Timer as released on the Hugging Face hub (thuml/timer-base-84m, 84M parameters), a decoder-only
Transformer over patches of 96 steps pre-trained on 260B time points (UTSD and more), zero-shot or fine-tuned.
Liu et al., "Timer: Generative Pre-trained Transformers Are Large Time Series Models", ICML 2024; the release's
modeling_timer.py / configuration_timer.py / ts_generation_mixin.py (its own code, trust_remote_code; sktime 1.2
vendors it as sktime.libs.timer), read for the facts below. A native implementation (plain torch): the release's
code needs trust_remote_code and transformers 4.40 (its generate does not run under transformers 5).

What it computes (README.md here):
- each channel a series of its own, all of a batch in one forward ([B, L, C] -> B*C series -> [B, pred_len, C]);
- the context is the window's last floor(L / 96) * 96 steps (the release's generate cuts a context that is not a
  whole number of tokens from the front), normalised by its mean and (unbiased) standard deviation;
- tokens of 96 steps embedded linearly (no bias); 8 post-norm layers (x = LayerNorm(x + attention(x)), then
  x = LayerNorm(x + ffn(x))) of causal attention with biased q/k/v, an unbiased output projection and rotary
  positions over the whole head (rotate-half, base 10000: the release's rotary takes no rope_theta), and a gated
  SiLU feed-forward without biases; a final LayerNorm; the last token's head forecasts the next 96 steps;
- a longer horizon is rolled out as the release's generate (its default use_cache=True) does: each forecast is
  appended as new tokens, which attend to the cached keys and values of all before them, and are normalised by
  their OWN mean and standard deviation (the release's forward normalises whatever input_ids it is given, and with
  the cache that is only the new tokens); the step's forecast is scaled back with those; the head is the one of
  the longest output_token_lens not past the steps still wanted (the first otherwise), cut to them.
One deliberate difference: a constant context (standard deviation 0) divides by 1 here, where the release divides
by 0 and forecasts NaN. The forecasts are batch invariant (the comment at ROPE_BASE below says how), so zero-shot
metrics are the same at any --eval_batch_size and number of processes.

Training (`computes_loss`): next-token MSE over every token of the window's context ++ future (the release's
calc_ar_loss: token i predicts the next output_token_len steps after it, squared error averaged per token, then
over tokens and heads), on the series normalised by the context's mean and standard deviation as zero-shot
forecasting normalises it; a last token whose label runs past the future is scored on the steps it has.

Shapes: with --pretrain_model_path a release folder every size comes from its config.json (adapter.py);
without one, the release's architecture at --d_model, --n_heads, --e_layers, --d_ff, --input_token_len and one
head of --output_token_len, --dropout as the attention weights' dropout (the release's attention_dropout, 0.0).

The attention weights' dropout runs through layers.dropout.attention: a dropout that follows the sample (keyed
by the window, so fine-tuning is the same on any number of processes), where the fused kernel's dropout_p would
draw from each process's generator."""
import torch
import torch.nn.functional as F
from torch import nn

from layers.dropout import attention as sdpa
from models.foundation.timer_base import adapter as timer_hf
from utils.errors import UserError

ROPE_BASE = 10000.0  # the release's TimeMoeRotaryEmbedding is built without its config's rope_theta
# Batch invariance (zero-shot metrics the same at any batch size and number of processes): ATen computes an
# elementwise op 2 vectors at a time and the few elements left at the end of its range one by one, by another
# formula (F.silu's scalar exp rounds otherwise than the vectorised one), so which elements are left over would
# depend on the batch. SiLU therefore runs on blocks of whole rows, each under ATen's grain size (run serially, in
# one range) and a multiple of 32 elements (2 AVX-512 vectors: nothing left over). And MKL's GEMM sums a row in
# another order when the rows are not a multiple of 4 and few (under 4 rows on one thread; 5-11 on 2 or 8 threads,
# also 17-27 on 16: measured, x86 CPU), so in evaluation the series are padded to a multiple of ROW_MULTIPLE rows
# (not in training, where the rows must stay the windows' for the dropout masks keyed by them). The roll-out's
# attention to the cache is matrix products (Attention.after_cache), not scaled_dot_product_attention. The SiLU
# blocks are a CPU measure: on another device (a GPU's kernels have no such scalar tail) SiLU is one call.
SERIAL_ELEMENTS = 32768  # at::internal::GRAIN_SIZE: a smaller elementwise op runs in one thread, one range
VECTOR_PAIR = 32
ROW_MULTIPLE = 4


class Rotary(nn.Module):
    """Rotary positions over the whole head, rotate-half: (x * cos + rotate_half(x) * sin) at each position."""

    def __init__(self, head_dim):
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.register_buffer("inv_freq", 1.0 / (ROPE_BASE ** exponents), persistent=False)

    def forward(self, x, start):
        """x [N, heads, T, head_dim] at positions start, start + 1, ...: rotated."""
        positions = torch.arange(start, start + x.shape[2], device=x.device).to(self.inv_freq.dtype)
        angles = torch.outer(positions, self.inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, d_model, n_heads, dropout):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.rotary = Rotary(self.head_dim)
        self.weights_dropout = nn.Dropout(dropout)  # keyed by the sample once the experiment converts it

    def forward(self, x, cache=None):
        """x [N, T, D] after the `cache` (keys, values) of the tokens before it (None: T tokens from position 0):
        (output [N, T, D], the cache including x's tokens)."""
        batch, steps, _ = x.shape
        q, k, v = (proj(x).view(batch, steps, self.n_heads, self.head_dim).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        past = 0 if cache is None else cache[0].shape[2]
        q, k = self.rotary(q, past), self.rotary(k, past)
        if cache is None:
            out = sdpa(q, k, v, self.weights_dropout, is_causal=steps > 1)
        else:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
            out = self.after_cache(q, k, v, past)
        return self.out(out.transpose(1, 2).reshape(batch, steps, -1)), (k, v)

    def after_cache(self, q, k, v, past):
        """Attention of new tokens (positions past, past + 1, ...) to the cached ones and theirs before them, as
        matrix products: PyTorch's CPU scaled_dot_product_attention sums a one-token query in an order that depends
        on the batch (measured: 1e-7 apart at 4 and 20 series), these do not."""
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if q.shape[2] > 1:  # several new tokens: each sees the cache and the new ones up to itself
            allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(past)
            scores = scores.masked_fill(~allowed, float("-inf"))
        return self.weights_dropout(torch.softmax(scores, dim=-1)) @ v


class FeedForward(nn.Module):
    """down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        gate, up = self.gate(x), self.up(x)
        if x.device.type != "cpu":  # the blocks below are for the CPU's elementwise tails (ROPE_BASE's comment)
            return self.down(F.silu(gate) * up)
        if gate.shape[-1] % VECTOR_PAIR or (torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad)):
            return self.down(silu(gate) * up)
        # forecasting: the same values, in place block by block (a third of the memory traffic of silu(g) * u)
        per_call = max(1, SERIAL_ELEMENTS // gate.shape[-1])
        for gates, ups in zip(gate.view(-1, gate.shape[-1]).split(per_call), up.view(-1, up.shape[-1]).split(per_call)):
            F.silu(gates, inplace=True).mul_(ups)
        return self.down(gate)


class Layer(nn.Module):
    """Post-norm: LayerNorm after each residual sum, as the release."""

    def __init__(self, d_model, n_heads, d_ff, dropout):
        super().__init__()
        self.attention = Attention(d_model, n_heads, dropout)
        self.ffn = FeedForward(d_model, d_ff)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x, cache=None):
        attended, cache = self.attention(x, cache)
        x = self.norm1(x + attended)
        return self.norm2(x + self.ffn(x)), cache


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)
    computes_loss = True  # fine-tunes on next-token MSE (module docstring)
    checkpoint_adapters = (timer_hf.TIMER_BASE,)
    series_as_given = True  # forecasts the user's series as the file holds it (exp.adaptation)

    def __init__(self, configs):
        super().__init__()
        shape, where = self.shape_of(configs)
        self.token, self.horizons = shape["input_token_len"], shape["output_token_lens"]
        d_model, n_heads = shape["d_model"], shape["n_heads"]
        if d_model % n_heads or (d_model // n_heads) % 2:
            raise ValueError(f"{where}: hidden size {d_model} is not {n_heads} heads of an even size")
        if configs.seq_len < self.token:
            raise ValueError(f"Timer reads whole tokens of {self.token} steps ({where}); --seq_len {configs.seq_len} "
                             f"is shorter than one: use --seq_len {self.token} or more (a multiple of {self.token})")
        uneven = [h for h in self.horizons if h % self.token]
        if uneven:
            raise ValueError(f"{where}: output_token_lens {uneven} are not whole tokens of {self.token} steps, which "
                             "the release's rollout feeds back")
        self.pred_len = configs.pred_len
        self.embedding = nn.Linear(self.token, d_model, bias=False)
        self.layers = nn.ModuleList(Layer(d_model, n_heads, shape["d_ff"], shape["attention_dropout"])
                                    for _ in range(shape["e_layers"]))
        self.norm = nn.LayerNorm(d_model)
        self.heads = nn.ModuleList(nn.Linear(d_model, h, bias=False) for h in self.horizons)
        self.register_buffer(timer_hf.HEADS_KEY, torch.tensor(n_heads))  # written back by an export
        for module in self.modules():  # the release's _init_weights (a model built without its weights)
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    @staticmethod
    def shape_of(configs):
        """(sizes, where they come from): the release's config.json, or the generic arguments."""
        path = getattr(configs, "pretrain_model_path", None)
        found = timer_hf.folder_config(path) if path else None
        if found is not None:
            config, where = found
            return timer_hf.shape_from_config(config, where), where
        return ({"input_token_len": configs.input_token_len, "output_token_lens": [configs.output_token_len],
                 "d_model": configs.d_model, "d_ff": configs.d_ff, "e_layers": configs.e_layers,
                 "n_heads": configs.n_heads, "attention_dropout": configs.dropout}, "the released architecture")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Weights of another head count would load (the shapes agree) and attend wrongly: refused."""
        theirs, ours = state_dict.get(prefix + timer_hf.HEADS_KEY), int(getattr(self, timer_hf.HEADS_KEY))
        if theirs is not None and int(theirs) != ours:
            raise UserError(f"these TimerBase weights have {int(theirs)} attention heads and this model {ours}: "
                            f"build it from the release they came from (--pretrain_model_path) or with --n_heads "
                            f"{int(theirs)}")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None, target=None):
        batch, length, channels = x_enc.shape
        context = length // self.token * self.token  # whole tokens, the oldest steps left out (as generate)
        rows = batch * channels
        series = x_enc[:, length - context:].transpose(1, 2).reshape(rows, context)
        if target is not None:  # training: each window's next-token MSE
            future = target.transpose(1, 2).reshape(rows, -1)
            return self.loss(series, future).view(batch, channels).mean(1)
        if not self.training:  # padding rows would unkey training's dropout masks (rows sample-major)
            series = _padded(series)
        forecast = self.forecast(series)[:rows]  # [B*C, pred_len]
        return forecast.view(batch, channels, -1).transpose(1, 2)

    def decode(self, steps, caches=None):
        """Whole tokens of `steps` [N, T * token] after the cached ones: (hidden [N, T, D], the caches)."""
        hidden = self.embedding(steps.unflatten(-1, (-1, self.token)))
        new_caches = []
        for n, layer in enumerate(self.layers):
            hidden, cache = layer(hidden, None if caches is None else caches[n])
            new_caches.append(cache)
        return self.norm(hidden), new_caches

    def forecast(self, context):
        """The release's generate(context, max_new_tokens=pred_len) with its cache: [N, L] -> [N, pred_len]."""
        steps, caches, produced, remaining = context, None, [], self.pred_len
        while remaining > 0:
            mean, std = _statistics(steps)
            hidden, caches = self.decode((steps - mean) / std, caches)
            head = self.head_for(remaining)
            out = self.heads[head](hidden[:, -1])[:, :remaining] * std + mean
            produced.append(out)
            steps, remaining = out, remaining - out.shape[1]
        return torch.cat(produced, dim=1)

    def head_for(self, remaining):
        """The release's pick: the last of output_token_lens (in their order) before one longer than `remaining`."""
        chosen = 0
        for index, horizon in enumerate(self.horizons[1:], start=1):
            if horizon > remaining:
                break
            chosen = index
        return chosen

    def loss(self, context, future):
        """Per series: the mean over heads of the mean over tokens of each token's squared error on the steps after
        it (context ++ future, normalised by the context's statistics). [N, L], [N, H] -> [N]."""
        mean, std = _statistics(context)
        sequence = (torch.cat((context, future), dim=1) - mean) / std
        total = sequence.shape[1]
        tokens = (total - 1) // self.token  # every token with at least one step after it
        hidden, _ = self.decode(sequence[:, :tokens * self.token])
        losses = []
        for head, horizon in zip(self.heads, self.horizons):
            labels, known = _labels(sequence[:, self.token:], tokens, horizon, self.token)
            squared = (head(hidden) - labels).square() * known
            losses.append((squared.sum(-1) / known.sum(-1)).mean(-1))  # [N]
        return torch.stack(losses).mean(0)


def silu(x):
    """F.silu(x), each element by the vectorised formula whatever the batch (SERIAL_ELEMENTS above)."""
    rows = x.reshape(-1, x.shape[-1])
    width = rows.shape[1]
    if width % VECTOR_PAIR:
        rows = F.pad(rows, (0, -width % VECTOR_PAIR))
    per_call = max(1, SERIAL_ELEMENTS // rows.shape[1])
    out = torch.cat([F.silu(block) for block in rows.split(per_call)]) if rows.shape[0] > per_call else F.silu(rows)
    return out[:, :width].reshape(x.shape)


def _padded(series):
    """`series` [N, T] with copies of its first row up to a multiple of ROW_MULTIPLE rows (batch invariance)."""
    short = -series.shape[0] % ROW_MULTIPLE
    return torch.cat((series, series[:1].expand(short, -1))) if short else series


def _statistics(steps):
    """The release's revin: the mean and unbiased standard deviation of each row; a zero deviation taken as 1."""
    mean, std = steps.mean(dim=-1, keepdim=True), steps.std(dim=-1, keepdim=True)
    return mean, torch.where(std == 0, torch.ones_like(std), std)


def _labels(after, tokens, horizon, token):
    """Token i's label: steps i*token ... i*token + horizon of `after` (the sequence from its second token on),
    padded past its end. ([N, tokens, horizon] labels, [tokens, horizon] mask of the known steps)."""
    length = (tokens - 1) * token + horizon
    padded = F.pad(after[:, :length], (0, max(0, length - after.shape[1])))
    known = torch.arange(length, device=after.device) < after.shape[1]
    return padded.unfold(-1, horizon, token), known.to(after.dtype).unfold(-1, horizon, token)

