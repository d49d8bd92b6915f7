"""Chronos-2: an encoder-only Transformer over patches of 16 steps that forecasts 21 quantiles (0.01..0.99) of
the next patches at once. Each series is instance-normalised (then arcsinh), patched with a time encoding and a
mask, and the encoder alternates attention over time (rotary positions) with group attention across the series
of a group; the last tokens, one per output patch, are read out as quantiles. Ansari et al., "Chronos-2: From
Univariate to Universal Forecasting", arXiv 2510.15821, 2025; weights: Hugging Face amazon/chronos-2.

Design: built on the official package's model module, chronos-forecasting's chronos.chronos2.Chronos2Model (the
optional extra `chronos`), not a native copy: it installs beside torch 2.13 and pandas 3 without pinning them, it
loads a folder offline (we read its config.json and the weights ourselves, never from_pretrained), and its model
is a plain torch module that trains under DDP. Its code is imported, never copied (adapter.py converts the
released folder in and out).

Here each channel of a window is its own univariate series, its own group: [B, L, C] -> [B * C, L] in one
forward, back to [B, pred_len, C, 21]. Grouping a window's channels (the package's multivariate mode, group ids
per window) would be one line, but its group attention then sums over the channels inside a kernel whose
blocking follows the batch's make-up, so a window's forecast would change in its last bits with its batch-mates
and the world size; alone in its group a series' group attention is exactly its own value projection.

- Group attention in closed form: the package builds its group mask over every pair of the N = B * C series
  ([time, 1, N, N]; in training its weights [time, heads, N, N]), memory quadratic in windows x channels (ECL's
  321 channels at batch 32: 15 GiB for the mask alone). Every series being alone in its group, the encoder's
  mask is built for singletons ([time, 1, N, 1]) and the group attention is the softmax over the series' own
  score, exactly 1: its output is its value, in memory linear in N. Forecasts are the package's bit for bit
  (observed steps: the package's other weights are exactly 0; steps whose patch is all missing, where the
  package's row is masked through and averages the batch, are masked out of every later attention and never
  reach a forecast). The softmax keeps q and k in the graph with the package's exact zero gradient.

- Context: the last --seq_len steps, at most the model's context_length (8192 released: more is refused); the
  model pads to a whole patch with missing values itself, as the package does.
- Horizon: ceil(pred_len / 16) output patches in one pass, up to max_output_patches (64 released, 1024 steps).
  Zero-shot beyond that, the package's long-horizon rollout (Chronos2Pipeline._predict_batch: the 9 deciles
  appended to the context as 9 paths, their 21 x 9 forecasts reduced to 21 quantiles by weighted quantiles),
  computed here on the input's device from constants built once (the interpolation's indices and weights, the
  paths' probability masses): no host copy or read per step, and no float cumsum, which has no deterministic
  CUDA kernel (--deterministic); the cumulative masses are summed exactly in integers (each mass a multiple of
  2^-k) and rounded once, the value the package's float64-accumulated cumsum gives on CPU. The package's result
  on CPU bit for bit (tests/test_chronos2.py).
  A training run forecasts all its patches in one pass and raises max_output_patches to them, as the
  package's fit() does, so the fine-tuned model also forecasts them in one pass and exports so.
- Scaling: the package's own instance normalisation and arcsinh, inside its model.
- Shapes: from the --pretrain_model_path folder's config.json; without one, the released architecture at the
  generic sizes (d_model, n_heads, e_layers, d_ff; d_kv = d_model / n_heads as released, 768 / 12; d_layers
  unused: no decoder). --dropout sets the dropout rate in both cases (a training choice, not a shape).
- dropout that follows the sample: the package's residual, feed-forward and embedding dropouts are nn.Dropout
  on [B * C, ...] inputs, keyed by the sample as any model's. Its attention drops the attention weights with
  SDPA's dropout_p (or F.dropout), and its group attention runs time-first ([time, series, d_model]); so each
  attention module gets an nn.Dropout `weights_dropout` for its weights in training (_adapt_attention; the
  experiment keys it once it converts it): the time attention's weights [B * C, heads, time, time] are dropped
  by it (layers.dropout.attention); the group attention's by one draw per (series, head, step), laid out
  [B * C, heads, time, 1]: alone in its group, a series' only group weight is its own, so that draw drops that
  weight; and the group attention's residual dropout sees the series first. Evaluation (and --dropout 0) runs
  the package's own time attention, so the forecasts are the package's bit for bit; fine-tuning with dropout is
  exact on any world size and its gradients are the dense group attention's bit for bit (with --dropout 0 the
  package's fused attention leaves a rounding residue on the group attention's q and k gradients, exactly 0
  here: the other gradients move by about 1e-10 of the largest).
"""
import functools
import math
import types

import torch
from torch import nn

from layers.dropout import attention as keyed_sdpa
from models.foundation.chronos2 import adapter as chronos2
from utils.optional import require_package

_package = require_package("chronos.chronos2", "chronos-forecasting", "chronos", "Chronos2")
Chronos2CoreConfig, Chronos2Model, Chronos2Pipeline = (_package.Chronos2CoreConfig, _package.Chronos2Model,
                                                       _package.Chronos2Pipeline)

# Chronos2Pipeline.predict's default `unrolled_quantiles`: the paths its long-horizon rollout feeds back
UNROLLED_QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def _built_config(configs):
    """(the config the package's model is built from, as a core_config_dict) for `configs`."""
    path = getattr(configs, "pretrain_model_path", None)
    if path:
        config = chronos2.core_config_dict(chronos2.read_release_config(path))
    else:
        if configs.d_model % configs.n_heads:
            raise ValueError(f"d_model {configs.d_model} is not divisible by n_heads {configs.n_heads}")
        config = dict(chronos2.RELEASED_CORE, d_model=configs.d_model, d_kv=configs.d_model // configs.n_heads,
                      d_ff=configs.d_ff, num_layers=configs.e_layers, num_heads=configs.n_heads,
                      chronos_config=dict(chronos2.RELEASED_FORECASTING))
    config["dropout_rate"] = float(configs.dropout)
    return config


class _SeriesFirst(nn.Module):
    """An nn.Dropout on a time-first [time, series, ...] input, applied series first (sample-major)."""

    def __init__(self, rate):
        super().__init__()
        self.dropout = nn.Dropout(rate)

    def forward(self, x):
        return self.dropout(x.transpose(0, 1)).transpose(0, 1)


def _time_attention(self, query, key, value, mask, package=None):
    """MHA._sdpa_attention / _eager_attention on [B * C, heads, time, d_kv], the weights dropped by the module's
    nn.Dropout `weights_dropout` in training (no scaling, as the package's)."""
    if not self.training or self.weights_dropout.p == 0:
        return package(query, key, value, mask)
    return keyed_sdpa(query, key, value, self.weights_dropout, attn_mask=mask, scale=1.0), None


def _singleton_group_mask(group_ids, attention_mask, floating_type):
    """The encoder's group mask when every series is its own group: the diagonal of the package's
    [time, 1, N, N] mask, [time, 1, N, 1] (each series' own entry, by its time mask). `group_ids` is not read:
    Model never groups (it passes none, so the package numbers the series 0..N-1)."""
    if torch.is_floating_point(attention_mask):  # the package's rule: the mask's dtype when it is a float
        floating_type = attention_mask.dtype
    return (1.0 - attention_mask.transpose(0, 1)[:, None, :, None]) * torch.finfo(floating_type).min


def _group_attention(self, query, key, value, mask):
    """MHA's attention across the series ([time, heads, N, d_kv]) when each series is alone in its group (the
    module docstring): the softmax over its own score is 1, so the output is its value. In training the softmax is
    kept (q and k get its exact zero gradient) and the weight is dropped by one draw of `weights_dropout` per
    (series, head, step), sample-major."""
    if not self.training:
        return value, None
    weights = torch.softmax((query * key).sum(-1, keepdim=True).float(), dim=-1).type_as(query)  # [time, heads, N, 1]
    if self.weights_dropout.p:
        steps, heads, series = query.shape[:3]
        keep = self.weights_dropout(weights.new_ones(series, heads, steps, 1))  # 0 or 1 / (1 - p), keyed by series
        weights = weights * keep.permute(2, 1, 0, 3)
    return weights * value, None


def _adapt_attention(chronos, rate):
    """The package's attention modules with the weights' dropout as an nn.Dropout, and its group attention over
    singleton groups in closed form (module docstring)."""
    chronos.encoder._construct_and_invert_group_time_mask = _singleton_group_mask
    for module in chronos.modules():
        if isinstance(module, (_package.layers.TimeSelfAttention, _package.layers.GroupSelfAttention)):
            attention = module.self_attention
            time_first = isinstance(module, _package.layers.GroupSelfAttention)
            attention.weights_dropout = nn.Dropout(rate)
            for name in ("_sdpa_attention", "_eager_attention"):
                if time_first:
                    setattr(attention, name, types.MethodType(_group_attention, attention))
                else:
                    method = types.MethodType(_time_attention, attention)
                    setattr(attention, name, functools.partial(method, package=getattr(attention, name)))
            if time_first:
                module.dropout = _SeriesFirst(rate)


def _interpolation(levels, query):
    """(lower, upper, weight) of linear interpolation at the levels `query` [Q] between values known at the
    increasing `levels` [..., K] (float32 in (0, 1]), extended by the first value at level 0 and the last at 1
    (Chronos2Pipeline's quantile interpolation): the value at query j is v[lower] + weight * (v[upper] - v[lower]),
    indices into the values with that padding (0: the first value again, K + 1: the last). `levels` one row for
    all, or one per row. The package adds the level 1 only when the last level is below 1; with a last level of
    1 no query below 1 reaches past it, so adding it always gives the same values."""
    rows = levels.shape[:-1]
    bottom = torch.zeros((*rows, 1), dtype=levels.dtype, device=levels.device)
    top = torch.ones((*rows, 1), dtype=levels.dtype, device=levels.device)
    padded = torch.cat([bottom, levels, top], dim=-1).contiguous()
    wanted = query.expand(*rows, -1).contiguous()
    upper = torch.searchsorted(padded, wanted, right=True).clamp(max=padded.shape[-1] - 1)
    lower = upper - 1
    below, above = padded.gather(-1, lower), padded.gather(-1, upper)
    return lower, upper, torch.nan_to_num((wanted - below) / (above - below), nan=0.0)


def _interpolated(values, lower, upper, weight):
    """values [..., K] padded with their first and last (the levels 0 and 1), read at the interpolation's
    (lower, upper, weight) along the last axis: [..., Q]."""
    padded = torch.cat([values[..., :1], values, values[..., -1:]], dim=-1)
    if lower.dim() == 1:  # one interpolation for all rows
        low, high = padded.index_select(-1, lower), padded.index_select(-1, upper)
    else:
        low, high = padded.gather(-1, lower), padded.gather(-1, upper)
    return low + weight * (high - low)


def _rollout_constants(quantiles, unrolled):
    """What the long-horizon rollout needs, built once on the host (module docstring): the interpolation of the
    unrolled levels from the model's quantiles; the 9 x 21 samples' probability masses (Chronos2Pipeline's
    trapezoidal masses, normalised) as integers `masses` = mass * 2^shift, exact, whose prefix sums are the
    cumulative masses exactly."""
    quantiles = torch.tensor(quantiles, dtype=torch.float32, device="cpu")  # on the host whatever device builds
    unrolled = torch.tensor(unrolled, dtype=torch.float32, device="cpu")
    lower, upper, weight = _interpolation(quantiles, unrolled)
    masses = torch.outer(Chronos2Pipeline._get_prob_mass_per_quantile_level(unrolled),
                         Chronos2Pipeline._get_prob_mass_per_quantile_level(quantiles)).reshape(-1)
    masses = masses / masses.sum(dim=-1, keepdim=True)
    shift = 24 - int(torch.frexp(masses).exponent.min())  # float32: 24 significant bits
    scaled = masses.double() * 2.0 ** shift
    total = scaled.sum()
    if not (torch.equal(scaled, scaled.round()) and total < 2.0 ** 53):  # holds for Chronos-2's levels
        raise ValueError("the long-horizon rollout's sample masses are not exact in 53 bits")
    return {"unroll_lower": lower, "unroll_upper": upper, "unroll_weight": weight, "sample_masses": scaled.long(),
            "levels": quantiles}, shift


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)
    quantile_levels = chronos2.RELEASED_QUANTILES
    checkpoint_adapters = (chronos2.CHRONOS2,)
    series_as_given = True  # forecasts the user's series as the file holds it (exp.adaptation)

    def __init__(self, configs):
        super().__init__()
        config = _built_config(configs)
        forecasting = config["chronos_config"]
        if tuple(forecasting["quantiles"]) != self.quantile_levels:
            raise ValueError(f"its config.json forecasts the quantiles {forecasting['quantiles']}, not the "
                             f"{len(self.quantile_levels)} of {chronos2.HUB_ID} that --model Chronos2 scores")
        if configs.seq_len > forecasting["context_length"]:
            raise ValueError(f"--seq_len {configs.seq_len} is longer than Chronos-2's context of "
                             f"{forecasting['context_length']} steps (config.json chronos_config.context_length): "
                             f"give --seq_len {forecasting['context_length']} or less")
        self.pred_len = configs.pred_len
        self.patch = forecasting["output_patch_size"]
        self.num_output_patches = math.ceil(self.pred_len / self.patch)
        if getattr(configs, "is_training", 0):  # fine-tuned to forecast all its patches at once, as Chronos2Pipeline.fit
            forecasting["max_output_patches"] = max(forecasting["max_output_patches"], self.num_output_patches)
        self.one_pass = forecasting["max_output_patches"]  # output patches of one forward; more: rolled out
        for name, value in chronos2.config_buffers(config).items():
            self.register_buffer(name, value)  # the config.json that export writes (adapter.py)
        self._register_load_state_dict_pre_hook(self._keep_more_output_patches)
        self.chronos = Chronos2Model(Chronos2CoreConfig(**config))
        _adapt_attention(self.chronos, config["dropout_rate"])
        self.context_length = forecasting["context_length"]
        constants, self.mass_shift = _rollout_constants(self.quantile_levels, UNROLLED_QUANTILES)
        for name, value in constants.items():
            self.register_buffer(f"rollout_{name}", value, persistent=False)  # moved with the model, no keys

    def _keep_more_output_patches(self, state, prefix, *args):
        """A loaded file's max_output_patches, or this model's if more (a training run's horizon): fit()'s rule."""
        key = prefix + chronos2.PATCHES_BUFFER
        if key in state:
            self.one_pass = max(int(state[key][0]), self.one_pass)
            state[key] = torch.tensor([self.one_pass], dtype=torch.int64)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        batch, length, channels = x_enc.shape
        series = x_enc.transpose(1, 2).reshape(batch * channels, length)  # each channel its own series and group
        if self.training or self.num_output_patches <= self.one_pass:
            quantiles = self.chronos(context=series, num_output_patches=self.num_output_patches).quantile_preds
        else:
            quantiles = self._long_horizon(series)
        quantiles = quantiles[..., :self.pred_len].to(x_enc.dtype)  # [B * C, Q, pred_len]
        return quantiles.reshape(batch, channels, -1, self.pred_len).permute(0, 3, 1, 2)  # [B, pred_len, C, Q]

    @torch.no_grad()
    def _long_horizon(self, series):
        """Chronos2Pipeline._predict_batch's rollout past max_output_patches (module docstring), on the device of
        `series` [N, L]: [N, 21, pred_len]."""
        context, count, paths = series.float(), series.shape[0], len(UNROLLED_QUANTILES)
        remaining, predictions = self.pred_len, []
        while remaining > 0:
            patches = min(math.ceil(remaining / self.patch), self.one_pass)
            if predictions:  # the paths: each unrolled level of the last forecast appended to its own context
                levels = _interpolated(predictions[-1].transpose(1, 2), self.rollout_unroll_lower,
                                       self.rollout_unroll_upper, self.rollout_unroll_weight)  # [N, h, 9]
                context = torch.cat([context, levels.transpose(1, 2)], dim=-1)[..., -self.context_length:]
                forecast = self.chronos(context=context.reshape(count * paths, -1),
                                        num_output_patches=patches).quantile_preds.float()
                forecast = self._weighted_quantiles(forecast.reshape(count, paths, *forecast.shape[1:]))
            else:
                forecast = self.chronos(context=context, num_output_patches=patches).quantile_preds.float()
                context = context.unsqueeze(1).expand(-1, paths, -1)
            predictions.append(forecast)
            remaining -= forecast.shape[-1]
        return torch.cat(predictions, dim=-1)

    def _weighted_quantiles(self, forecasts):
        """The model's quantile levels of the 9 x 21 weighted samples per step (Chronos2Pipeline's
        weighted_quantile): forecasts [N, 9, 21, h] -> [N, 21, h]. The cumulative masses of the sorted samples are
        integer prefix sums, exact, rounded once to float32."""
        count, paths, levels, steps = forecasts.shape
        samples = forecasts.reshape(count, paths * levels, steps).transpose(1, 2)  # [N, h, 9 * 21]
        samples, order = samples.sort(dim=-1)  # the package's sort: tied samples' masses in its order
        cumulative = self.rollout_sample_masses[order].cumsum(dim=-1).float() * 2.0 ** -self.mass_shift
        cumulative = cumulative.clamp(max=1.0)
        lower, upper, weight = _interpolation(cumulative, self.rollout_levels)
        return _interpolated(samples, lower, upper, weight).transpose(1, 2)
