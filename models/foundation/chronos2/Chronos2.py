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

- Context: the last --seq_len steps, at most the model's context_length (8192 released: more is refused); the
  model pads to a whole patch with missing values itself, as the package does.
- Horizon: ceil(pred_len / 16) output patches in one pass, up to max_output_patches (64 released, 1024 steps).
  Zero-shot beyond that, the package's own long-horizon rollout (Chronos2Pipeline._predict_batch: the 9 deciles
  appended to the context as 9 paths, their 21 x 9 forecasts reduced to 21 quantiles by weighted quantiles).
  A training run forecasts all its patches in one pass and raises max_output_patches to them, as the
  package's fit() does, so the fine-tuned model also forecasts them in one pass and exports so.
- Scaling: the package's own instance normalisation and arcsinh, inside its model.
- Shapes: from the --pretrain_model_path folder's config.json; without one, the released architecture at the
  generic sizes (d_model, n_heads, e_layers, d_ff; d_kv = d_model / n_heads as released, 768 / 12; d_layers
  unused: no decoder). --dropout sets the dropout rate in both cases (a training choice, not a shape).
- dropout that follows the sample: the package's residual, feed-forward and embedding dropouts are nn.Dropout
  on [B * C, ...] inputs, keyed by the sample as any model's. Its attention drops the attention weights with
  SDPA's dropout_p (or F.dropout), and its group attention runs time-first ([time, series, d_model]); so each
  attention module gets an nn.Dropout `weights_dropout` for its weights in training (_key_attention_dropout; the
  experiment keys it once it converts it): the time attention's weights [B * C, heads, time, time] are dropped
  by it (layers.dropout.attention); the group attention's by one draw per (series, head, step), laid out
  [B * C, heads, time, 1]: alone in its group, a series' only non-zero group weight at an observed step is its
  own, so that draw drops that weight; and the group attention's residual dropout sees the series first.
  Evaluation (and --dropout 0) runs the package's own attention, so the forecasts are the package's bit for bit;
  fine-tuning with dropout is exact on any world size (tests/test_chronos2.py).
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


def _group_attention(self, query, key, value, mask, package=None):
    """MHA's attention across the series ([time, heads, B * C, d_kv], mask [time, 1, B * C, B * C]), the weights
    dropped in training by one draw of `weights_dropout` per (series, head, step), sample-major: each series is
    alone in its group, so at an observed step its row's only non-zero weight is its own (the others exactly 0)."""
    if not self.training or self.weights_dropout.p == 0:
        return package(query, key, value, mask)
    weights = torch.softmax((query @ key.transpose(-2, -1) + mask).float(), dim=-1).type_as(query)
    steps, heads, series = query.shape[:3]
    keep = self.weights_dropout(weights.new_ones(series, heads, steps, 1))  # 0 or 1 / (1 - p), keyed by the series
    return (weights * keep.permute(2, 1, 0, 3)) @ value, None


def _key_attention_dropout(chronos, rate):
    """Give the package's attention modules the weights' dropout as an nn.Dropout (module docstring)."""
    for module in chronos.modules():
        if isinstance(module, (_package.layers.TimeSelfAttention, _package.layers.GroupSelfAttention)):
            attention = module.self_attention
            time_first = isinstance(module, _package.layers.GroupSelfAttention)
            attention.weights_dropout = nn.Dropout(rate)
            for name in ("_sdpa_attention", "_eager_attention"):
                method = types.MethodType(_group_attention if time_first else _time_attention, attention)
                setattr(attention, name, functools.partial(method, package=getattr(attention, name)))
            if time_first:
                module.dropout = _SeriesFirst(rate)


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
        _key_attention_dropout(self.chronos, config["dropout_rate"])

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
        """The package's own rollout past max_output_patches (Chronos2Pipeline.predict's, one batch)."""
        pipeline = Chronos2Pipeline(self.chronos)
        count = series.shape[0]
        out = pipeline._predict_batch(
            context=series.float(), group_ids=torch.arange(count, device=series.device),
            future_covariates=torch.full((count, self.pred_len), torch.nan, device=series.device),
            unrolled_quantiles_tensor=torch.tensor(UNROLLED_QUANTILES), prediction_length=self.pred_len,
            max_output_patches=self.one_pass, target_idx_ranges=[(0, count)])[0]
        return out.to(series.device)
