"""ChronosBolt: Amazon's Chronos-Bolt, a T5 encoder-decoder over patches of the series. Each channel is a series
of its own: instance-normalised, cut into patches of 16 steps (with a mask of the observed ones), embedded by a
residual MLP and encoded with a [REG] token; one decoder step reads the encoding and a residual MLP maps it to 9
quantiles (0.1, ..., 0.9) of the next 64 steps, scaled back. Ansari et al., "Chronos: Learning the Language of
Time Series", TMLR 2024; Chronos-Bolt: chronos-forecasting 1.5 and the AWS blog of 2024-11-25. Released weights:
amazon/chronos-bolt-{tiny,mini,small,base} (README.md here).

Built on the official package's model module, chronos.chronos_bolt.ChronosBoltModelForForecasting (the optional
extra `pip install -e '.[chronos]'`), not a native copy: chronos-forecasting installs beside torch 2.13 and
pandas 3 without pinning either (it needs torch, transformers, accelerate, einops, numpy, pandas), its module
reads a local folder's config.json and weights with no network, and its forward is a plain differentiable
nn.Module, so it runs under DDP and fine-tunes; the forecasts are then the package's by construction.
What this file adds around it:
- all channels of a batch in one call: [B, seq_len, C] -> B * C series -> [B, pred_len, C, 9];
- the context is the window's last seq_len steps, at most chronos_config.context_length (2048 released): a longer
  --seq_len is refused (the package would silently drop the oldest steps);
- a horizon longer than chronos_config.prediction_length (64) is rolled out as ChronosBoltPipeline.predict does:
  each of the 9 quantile paths of the block so far is appended to the context, each of these 9 contexts is
  forecast, and the 81 forecasts a step are reduced to the 9 levels by torch.quantile; again until pred_len steps
  exist (differentiable, so fine-tuning at such a horizon trains through it); on the CPU the 9 paths are forwarded
  one after another at the first block's batch size, on a device as one batch 9 times larger, the package's way
  (`paths_in_one_batch`; the same forecasts);
- nothing read back to the host or copied from it per forward off the CPU: the T5 stacks' masks are built from
  the padding mask (`padding_mask`) and the decoder's one step keeps no key/value cache;
- dropout that follows the sample: T5's nn.Dropout modules are keyed by the experiment as any model's, and its
  attention-weight dropout, a fused-kernel argument in transformers (sdpa's dropout_p), is moved to an nn.Dropout
  on each attention module through transformers' AttentionInterface (`keyed_attention` below), so fine-tuning is
  the same on any number of processes. In evaluation attention is transformers' own sdpa, the package's default.
The input scaling is the package's (InstanceNorm inside ChronosBoltModelForForecasting); fine-tuning trains on the
pinball loss over the 9 levels, the package's own objective up to a constant factor (utils.probabilistic).
"""
import os

import torch
from torch import nn

from layers.dropout import attention as keyed_sdpa
from models.foundation.chronos_bolt import adapter as chronos_bolt
from utils.errors import UserError
from utils.optional import require_package

_package = require_package("chronos.chronos_bolt", "chronos-forecasting", "chronos", "ChronosBolt")
from transformers import AttentionInterface, T5Config  # noqa: E402  (chronos-forecasting depends on transformers)
from transformers.integrations.sdpa_attention import create_position_bias_mask, sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

KEYED_ATTENTION = "tsl_keyed_sdpa"  # our name in transformers' AttentionInterface (and its mask interface)


def keyed_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, position_bias=None,
                    **kwargs):
    """transformers' sdpa attention, with the weights' dropout drawn by the attention module's `weights_dropout`
    (an nn.Dropout, keyed by the sample once the experiment converts it) instead of the kernel's dropout_p."""
    weights_dropout = getattr(module, "weights_dropout", None)
    if weights_dropout is None or not weights_dropout.training or weights_dropout.p == 0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      position_bias=position_bias, **kwargs)
    causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal", True)
    if position_bias is not None:  # T5's relative positions join the mask, as sdpa_attention_forward does
        attention_mask, causal = create_position_bias_mask(position_bias, attention_mask, causal, query, key), False
    out = keyed_sdpa(query, key, value, weights_dropout, attn_mask=attention_mask, is_causal=causal, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


READS_ARE_FREE = ("cpu",)  # devices whose tensors the host reads without waiting for a device


def padding_mask(*args, attention_mask=None, **kwargs):
    """transformers' sdpa mask. Its shortcut to no mask at all (allow_is_*_skip) reads on the host whether every
    position is observed (padding_mask.all()): free on the CPU, where it stays, a device sync per T5 stack call
    elsewhere, where the mask is built from the padding mask whenever there is one (without one, as in the
    decoder's own step, the shortcut reads nothing and stays). A built mask joins T5's position bias as -inf where
    unobserved: the same scores, a [B, heads, q, k] bias instead of one broadcast over the batch."""
    if attention_mask is not None and attention_mask.device.type not in READS_ARE_FREE:
        kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


AttentionInterface.register(KEYED_ATTENTION, keyed_attention)
AttentionMaskInterface.register(KEYED_ATTENTION, padding_mask)


class Model(nn.Module):
    autoregressive = False
    inputs_used = ("x_enc",)
    quantile_levels = tuple(chronos_bolt.RELEASED_CHRONOS_CONFIG["quantiles"])  # the released models' 9 levels
    checkpoint_adapters = (chronos_bolt.CHRONOS_BOLT,)
    series_as_given = True  # forecasts the user's series as the file holds it (exp.adaptation)

    def __init__(self, configs):
        super().__init__()
        path = getattr(configs, "pretrain_model_path", None)
        config = chronos_bolt.folder_config(path) if path else None
        where = f"{os.path.join(path, 'config.json') if path and os.path.isdir(path) else path}"
        if config is None:  # no folder: the released architecture at TSLib's sizes
            config, where = chronos_bolt.generic_config(configs), "the released configuration"
        chronos = config["chronos_config"]
        if tuple(chronos["quantiles"]) != self.quantile_levels:
            raise UserError(f"{where} forecasts the quantiles {chronos['quantiles']}, not the released "
                            f"{list(self.quantile_levels)} that --model ChronosBolt scores")
        self.context_length = int(chronos["context_length"])
        self.block = int(chronos["prediction_length"])
        self.pred_len = configs.pred_len
        if configs.seq_len > self.context_length:
            raise ValueError(f"--seq_len {configs.seq_len} is longer than the {self.context_length} steps of context "
                             f"Chronos-Bolt reads (chronos_config.context_length of {where}): give --seq_len "
                             f"{self.context_length} or less")
        self.bolt = _package.ChronosBoltModelForForecasting(T5Config.from_dict(config))
        self.bolt.set_attn_implementation(KEYED_ATTENTION)
        # one decoder step a forward: a key/value cache would be built (and its tensors copied from the host) for
        # nothing; the decoder's own config (a copy of the release's), so an export's config.json is not touched
        self.bolt.decoder.config.use_cache = False
        for module in self.bolt.modules():
            if isinstance(module, T5Attention):
                module.weights_dropout = nn.Dropout(module.dropout)
        self.register_buffer("levels", torch.tensor(self.quantile_levels), persistent=False)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        batch, steps, channels = x_enc.shape
        series = x_enc.transpose(1, 2).reshape(batch * channels, steps)  # sample-major: window b's channels together
        quantiles = self.forecast(series)  # [B * C, 9, pred_len]
        return quantiles.reshape(batch, channels, len(self.quantile_levels), -1).permute(0, 3, 1, 2)

    def forecast(self, context):
        """[N, 9, pred_len] quantiles of N series' next pred_len steps, rolled out past the model's block as
        ChronosBoltPipeline.predict does: each of the 9 quantile paths of the block so far appended to the context,
        each of these 9 contexts forecast, the 81 forecasts a step reduced to the 9 levels (`paths_in_one_batch`)."""
        prediction = self.bolt(context=context).quantile_preds  # [N, 9, block]
        blocks, remaining = [prediction], self.pred_len - prediction.shape[-1]
        contexts = [context] * len(self.quantile_levels)  # one context per quantile path
        one_batch = self.paths_in_one_batch(context)
        while remaining > 0:
            contexts = [torch.cat([path_context, path.to(context.dtype)], dim=-1)[..., -self.context_length:]
                        for path_context, path in zip(contexts, prediction.unbind(1))]
            if one_batch:  # (series, path) order, as the package's batch of 9 * N series
                paths = self.bolt(context=torch.stack(contexts, dim=1).flatten(0, 1)).quantile_preds
                paths = paths.unflatten(0, (-1, len(contexts))).flatten(1, 2)
            else:
                paths = torch.stack([self.bolt(context=c).quantile_preds for c in contexts], dim=1).flatten(1, 2)
            # paths [N, 81, block]: the package's order (series, path, level)
            prediction = torch.quantile(paths, q=self.levels.to(paths.dtype), dim=1).transpose(0, 1)
            blocks.append(prediction)
            remaining -= prediction.shape[-1]
        return torch.cat(blocks, dim=-1)[..., :self.pred_len]

    @staticmethod
    def paths_in_one_batch(context):
        """Whether a rolled-out block forecasts its 9 paths as one batch of 9 * N series, as the package does (on a
        device: one forward instead of 9), or as 9 forwards of the first block's N series, one path after another
        (on the CPU: the first block's memory instead of 9 times it, which also spares most page faults of the
        large batch's fresh activations, as glibc serves allocations above 32 MB from new pages each time). The
        same rows through the same operations: on the CPU the same bits either way, the package's (crosscheck)."""
        return context.device.type != "cpu"
