"""TimesFM 2.5 (200M): Google's decoder-only patch Transformer, zero-shot or fine-tuned. Each channel is a series
of its own; 32-step input patches (instance-normalised by their running statistics) go through 20 causal layers,
and the last patch's token forecasts the next 128 steps (mean and quantiles 0.1..0.9) and, from a separate head,
1024 steps of quantile spreads. Das et al., "A decoder-only foundation model for time-series forecasting", ICML
2024; weights google/timesfm-2.5-200m-pytorch (README.md here).

Built on the official timesfm package (its TimesFM_2p5_200M_torch_module, layers, running statistics and RevIN;
pip install -e '.[timesfm]'), not on transformers' TimesFm2_5ModelForPrediction: the package is the reference
that wrote the released weights (its model.safetensors keys are that module's state_dict, loaded one to one),
its dependencies (numpy, safetensors, huggingface_hub) sit beside torch 2.13 and pandas 3, and its module runs
under DDP and trains (plain nn.Modules, no dropout). transformers' port reads another checkpoint
(google/timesfm-2.5-200m-transformers, renamed keys) and would tie the model to transformers' release cadence.
The package's own decode runs under torch.no_grad with an in-place KV cache, so it cannot train: the forecast
here runs the module's layers (transformer_layer, the package's Transformer with keys and values in and out) and
keeps the keys and values functionally (concatenated), so a roll-out step runs only its new patches and trains.

What forward computes is the package's TimesFM_2p5_200M_torch.compile(ForecastConfig(...)).forecast with the
flags of FORECAST_FLAGS (the package's recommended ones), on all channels of the batch in one forward:
- the context is the window's seq_len steps, front-padded with masked zeros to a multiple of 32 (the package
  pads to max_context = seq_len rounded up to 32); seq_len + pred_len (each rounded up) must fit 16384;
- normalize_inputs: the padded series is z-scored (mean, unbiased std) before the model, undone after;
- horizons past 128 steps are rolled out as the package's decode does: the median of the last 128 steps is fed
  back as 4 new patches, its running statistics continued, which attend to the kept keys and values of all
  patches before them, until pred_len steps exist;
- use_continuous_quantile_head: quantiles other than the median are the median plus the quantile head's
  spread (1024 steps at most, so pred_len <= 1024);
- force_flip_invariance: the forecast of -x, its quantiles mirrored, is averaged with that of x (both in one
  forward, x and -x stacked);
- fix_quantile_crossing, then infer_is_positive (a non-negative context gets a non-negative forecast).
The output is [B, pred_len, C, 9], the quantiles 0.1..0.9; the median (0.5) is the point forecast. The mean
the model also forecasts is not returned.

Sizes: with --pretrain_model_path, those of the released folder's model.safetensors (its config.json holds none);
else the released architecture with d_model (model, tokenizer and head width), n_heads, e_layers and d_ff in
place of 1280, 16, 20 and 1280. d_layers and dropout are not read (decoder-only, no dropout in the model)."""
import dataclasses
import math
from types import SimpleNamespace
from typing import NamedTuple

import torch
from torch import nn

from models.foundation.timesfm25 import adapter as release
from utils.errors import UserError
from utils.optional import require_package

package = require_package("timesfm.timesfm_2p5.timesfm_2p5_torch", "timesfm", "timesfm", "TimesFM25")
util = package.util
RELEASED = package.timesfm_2p5_base.TimesFM_2p5_200M_Definition()
PATCH, OUTPUT_PATCH, QUANTILE_HORIZON = RELEASED.input_patch_len, RELEASED.output_patch_len, RELEASED.output_quantile_len
CONTEXT_LIMIT = RELEASED.context_limit  # 16384: padded context + rounded horizon
OUTPUTS = len(RELEASED.quantiles) + 1  # the mean, then the quantiles
MEDIAN = RELEASED.decode_index  # 5: the 0.5 quantile among the outputs
# The package's ForecastConfig flags this model computes (the timesfm README's recommended settings).
FORECAST_FLAGS = {"normalize_inputs": True, "use_continuous_quantile_head": True, "force_flip_invariance": True,
                  "infer_is_positive": True, "fix_quantile_crossing": True}


def definition(sizes):
    """The package's TimesFM_2p5_200M_Definition with `sizes` (adapter.architecture's names)."""
    block = RELEASED.stacked_transformers
    return dataclasses.replace(
        RELEASED,
        tokenizer=dataclasses.replace(RELEASED.tokenizer, hidden_dims=sizes["tokenizer_dims"],
                                      output_dims=sizes["model_dims"]),
        stacked_transformers=dataclasses.replace(block, num_layers=sizes["num_layers"], transformer=dataclasses.replace(
            block.transformer, model_dims=sizes["model_dims"], hidden_dims=sizes["ff_dims"],
            num_heads=sizes["num_heads"])),
        output_projection_point=dataclasses.replace(RELEASED.output_projection_point, input_dims=sizes["model_dims"],
                                                    hidden_dims=sizes["point_dims"]),
        output_projection_quantiles=dataclasses.replace(RELEASED.output_projection_quantiles,
                                                        input_dims=sizes["model_dims"],
                                                        hidden_dims=sizes["quantile_dims"]))


def package_module(config):
    """The package's TimesFM_2p5_200M_torch_module built at `config` (it reads its class attribute)."""
    sized = type("TimesFM25Module", (package.TimesFM_2p5_200M_torch_module,), {"config": config})
    return sized()


def sizes_of(configs):
    """The sizes to build: the released folder's (--pretrain_model_path), else configs' in the released shape."""
    folder = getattr(configs, "pretrain_model_path", None)
    if folder:
        _, shapes = release.read_release(folder)
        sizes = release.architecture(shapes, f"{folder}/model.safetensors")
        fixed = {"tokenizer_in": 2 * PATCH, "point_out": OUTPUT_PATCH * OUTPUTS,
                 "quantile_out": QUANTILE_HORIZON * OUTPUTS}
        odd = [f"{name} {sizes[name]} (TimesFM 2.5: {want})" for name, want in fixed.items() if sizes[name] != want]
        if odd:
            raise UserError(f"{folder}/model.safetensors has {', '.join(odd)}: not TimesFM 2.5's patching "
                            f"({PATCH} in, {OUTPUT_PATCH} out, {OUTPUTS} outputs)")
        return sizes
    width = configs.d_model
    return {"model_dims": width, "num_layers": configs.e_layers, "num_heads": configs.n_heads,
            "ff_dims": configs.d_ff, "tokenizer_dims": width, "point_dims": width, "quantile_dims": width}


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)
    quantile_levels = tuple(RELEASED.quantiles)  # 0.1, ..., 0.9
    checkpoint_adapters = (release.TIMESFM25,)
    series_as_given = True  # forecasts the user's series as the file holds it (exp.adaptation)

    def __init__(self, configs):
        super().__init__()
        self.seq_len, self.pred_len = configs.seq_len, configs.pred_len
        context = math.ceil(self.seq_len / PATCH) * PATCH
        horizon = math.ceil(self.pred_len / OUTPUT_PATCH) * OUTPUT_PATCH
        if context + horizon > CONTEXT_LIMIT:
            raise ValueError(f"TimesFM 2.5 reads at most {CONTEXT_LIMIT} steps of context and horizon together "
                             f"(each rounded up to {PATCH} / {OUTPUT_PATCH}); seq_len {self.seq_len} and pred_len "
                             f"{self.pred_len} make {context} + {horizon}")
        if horizon > QUANTILE_HORIZON:
            raise ValueError(f"TimesFM 2.5's quantile head forecasts at most {QUANTILE_HORIZON} steps; pred_len "
                             f"{self.pred_len} is longer")
        sizes = sizes_of(configs)
        if sizes["model_dims"] % sizes["num_heads"]:
            raise ValueError(f"d_model {sizes['model_dims']} is not divisible by n_heads {sizes['num_heads']}")
        self.timesfm = package_module(definition(sizes))
        self.context, self.decode_steps = context, horizon // OUTPUT_PATCH - 1

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        batch, _, channels = x_enc.shape
        series = x_enc[:, -self.seq_len:].transpose(1, 2).reshape(batch * channels, -1)  # a series a channel
        quantiles = self.forecast(series)  # [B * C, pred_len, 9]
        return quantiles.reshape(batch, channels, self.pred_len, -1).transpose(1, 2)

    def forecast(self, series):
        """The package's compiled decode with FORECAST_FLAGS on [N, seq_len] series: [N, pred_len, 9]."""
        count = series.shape[0]
        pad = self.context - series.shape[1]
        values = nn.functional.pad(series, (pad, 0))
        masks = torch.zeros_like(values, dtype=torch.bool)
        masks[:, :pad] = True
        is_positive = torch.all(values >= 0, dim=-1, keepdim=True)
        mu, sigma = values.mean(dim=-1, keepdim=True), values.std(dim=-1, keepdim=True)
        values = util.revin(values, mu, sigma)
        points, spreads = self.decode(torch.cat([values, -values]), torch.cat([masks, masks]))
        points = (points[:count] - mirrored(points[count:])) / 2
        spreads = (spreads[:count] - mirrored(spreads[count:])) / 2
        # the continuous quantile head: the median plus each quantile's spread (the median's own is 0)
        out = spreads[:, :points.shape[1]] - spreads[:, :points.shape[1], MEDIAN:MEDIAN + 1] + points[..., MEDIAN:MEDIAN + 1]
        out = out[:, :self.pred_len, 1:]  # the quantiles, without the mean
        median = MEDIAN - 1
        lower = out[..., :median + 1].flip(-1).cummin(dim=-1).values.flip(-1)  # fix_quantile_crossing
        upper = out[..., median:].cummax(dim=-1).values
        out = torch.cat([lower, upper[..., 1:]], dim=-1)
        out = util.revin(out, mu, sigma, reverse=True)
        return torch.where(is_positive[..., None], out.clamp(min=0), out)

    def decode(self, values, masks):
        """The package module's decode, differentiable: [M, context] normalised values and pad masks ->
        ([M, 128 * (1 + decode_steps), 10] forecasts, [M, 1024, 10] quantile spreads of the last input patch).
        As the package's decode, each roll-out step runs only its 4 new patches through the layers, attending to
        the keys and values kept from the patches before them (the module's causal attention makes that the pass
        over the whole sequence)."""
        rows = values.shape[0]
        patches, patch_masks = values.reshape(rows, -1, PATCH), masks.reshape(rows, -1, PATCH)
        stats = SimpleNamespace(n=values.new_zeros(rows), mu=values.new_zeros(rows), sigma=values.new_zeros(rows))
        mu, sigma = running_stats(stats, patches, patch_masks)
        tokens = torch.where(patch_masks, 0.0, util.revin(patches, mu, sigma))
        point, spread, cache = self.last_outputs(tokens, patch_masks, spread=True)
        spread = util.revin(spread, mu[:, -1], sigma[:, -1], reverse=True).reshape(rows, QUANTILE_HORIZON, -1)
        steps = [util.revin(point, mu[:, -1], sigma[:, -1], reverse=True).reshape(rows, OUTPUT_PATCH, -1)]
        for _ in range(self.decode_steps):
            fed = steps[-1][..., MEDIAN].reshape(rows, -1, PATCH)
            fed_masks = torch.zeros_like(fed, dtype=torch.bool)
            mu, sigma = running_stats(stats, fed, fed_masks)
            point, _, cache = self.last_outputs(util.revin(fed, mu, sigma), fed_masks, spread=False, cache=cache)
            steps.append(util.revin(point, mu[:, -1], sigma[:, -1], reverse=True).reshape(rows, OUTPUT_PATCH, -1))
        return torch.cat(steps, dim=1), spread

    def last_outputs(self, tokens, masks, spread, cache=None):
        """The module's forward on `tokens` [M, P, 32] after the `cache` of the patches before them (None: from the
        first), its output heads on the last patch only (the only one a forecast reads; the package's forward runs
        them on every patch): (point [M, 1280], quantile spread [M, 10240] or None, the cache with these
        patches). In half precision under autocast: the package's rotary positions are float32 and would meet
        half-precision values in its attention."""
        if tokens.dtype not in (torch.float16, torch.bfloat16):
            return self._last_outputs(tokens, masks, spread, cache)
        with torch.autocast(tokens.device.type, dtype=tokens.dtype):
            point, spread, cache = self._last_outputs(tokens, masks, spread, cache)
        return point.to(tokens.dtype), None if spread is None else spread.to(tokens.dtype), cache

    def _last_outputs(self, tokens, masks, spread, cache):
        module = self.timesfm
        hidden = module.tokenizer(torch.cat([tokens, masks.to(tokens.dtype)], dim=-1))
        patch_masks = masks[..., -1]
        if cache is None:
            cache = Cache(length=0, masked=torch.zeros_like(patch_masks[:, 0], dtype=torch.int32), layers=[])
        masked = cache.masked + patch_masks.to(torch.int32).sum(-1)  # padding patches so far, as the package counts
        layers = []
        for n, layer in enumerate(module.stacked_xf):
            hidden, kept = transformer_layer(layer, hidden, masked, cache.length,
                                             cache.layers[n] if cache.layers else None)
            layers.append(kept)
        last = hidden[:, -1]
        point = module.output_projection_point(last)
        return (point, module.output_projection_quantiles(last) if spread else None,
                Cache(length=cache.length + tokens.shape[1], masked=masked, layers=layers))


class Cache(NamedTuple):
    """What the roll-out keeps of the patches so far: their number, each series' count of padding patches, and each
    layer's (keys, values) [M, length, heads, head_dim]."""
    length: int
    masked: torch.Tensor
    layers: list


def transformer_layer(layer, x, masked, past, kept):
    """The package's Transformer.forward (timesfm/torch/transformer.py) on patches at positions past, past + 1, ...
    after the keys and values `kept` of the `past` patches before them (None: past is 0), with `masked` [M] padding
    patches in all: (output, (keys, values) including these patches). The same modules and operations in the same
    order as the package's forward over the whole sequence: tests/test_timesfm25.py holds it to layer(x, mask)."""
    attended, kept = attention(layer.attn, layer.pre_attn_ln(x), masked, past, kept)
    attended = layer.post_attn_ln(attended) + x
    return layer.post_ff_ln(layer.ff1(layer.activation(layer.ff0(layer.pre_ff_ln(attended))))) + attended, kept


def attention(attn, x, masked, past, kept):
    """The package's MultiHeadAttention.forward over x's patches after the kept ones: queries of x only, keys and
    values of all; each patch sees those up to itself that are not padding (padding comes first), and its rotary
    position counts from the first patch that is not."""
    batch, count, _ = x.shape
    if attn.fuse_qkv:
        query, key, value = torch.chunk(attn.qkv_proj(x), 3, dim=-1)
    else:
        query, key, value = attn.query(x), attn.key(x), attn.value(x)
    query, key, value = (t.reshape(batch, count, attn.num_heads, attn.head_dim) for t in (query, key, value))
    if attn.use_rotary_position_embeddings:
        position = torch.arange(past, past + count, device=x.device)[None, :] - masked[:, None]
        query = attn.rotary_position_embedding(query, position)
        key = attn.rotary_position_embedding(key, position)
    query, key = attn.query_ln(query), attn.key_ln(key)
    if attn.use_per_dim_scale:
        query = attn.per_dim_scale(query)
    if kept is not None:
        key, value = torch.cat([kept[0], key], dim=1), torch.cat([kept[1], value], dim=1)
    seen = torch.arange(past + count, device=x.device)
    allowed = torch.logical_and(torch.arange(past, past + count, device=x.device)[:, None] >= seen[None, :],
                                seen[None, None, None, :] >= masked[:, None, None, None])  # [M, 1, count, all]
    out = attn.attention_fn(query, key, value, mask=allowed)
    return attn.out(out.reshape(batch, count, attn.in_features)), (key, value)


def running_stats(stats, patches, masks):
    """Each patch's running mean and std over the unmasked steps so far (the package's update_running_stats,
    patch by patch), continuing `stats` in place: ([M, P], [M, P])."""
    mus, sigmas = [], []
    for i in range(patches.shape[1]):
        (stats.n, stats.mu, stats.sigma), _ = util.update_running_stats(stats.n, stats.mu, stats.sigma,
                                                                          patches[:, i], masks[:, i])
        mus.append(stats.mu)
        sigmas.append(stats.sigma)
    return torch.stack(mus, dim=1), torch.stack(sigmas, dim=1)


def mirrored(outputs):
    """The forecast of -x read as one of x's: the mean negated stays first, the quantiles reverse order."""
    return torch.cat([outputs[..., :1], outputs[..., 1:].flip(-1)], dim=-1)
