"""Chronos-Bolt's released checkpoints in and out: the folder a user downloads from the Hugging Face hub
(amazon/chronos-bolt-tiny, -mini, -small, -base: config.json + model.safetensors), read into our
ChronosBolt.py and written back so chronos-forecasting's ChronosBoltPipeline reads it.

Our model holds the package's own module (chronos.chronos_bolt.ChronosBoltModelForForecasting) as `bolt`, so the
key table is one prefix:

| ours | released model.safetensors | note |
|---|---|---|
| `bolt.<key>` | `<key>` | every weight, same shape |
| `bolt.{encoder,decoder}.embed_tokens.weight` | (tied to `shared.weight`) | a file has one or more of the 3 |
| (none) | `lm_head.weight` | T5's language-model head, which the package ignores on load: dropped |

The shapes come from config.json (ChronosBolt.py reads it when --pretrain_model_path names the folder).
Export writes config.json from the weights' shapes, plus the fields no weight shows (context_length,
relative_attention_max_distance, layer_norm_epsilon, the activation) at the released values.

Nothing here imports chronos or transformers at module level: utils/checkpoint.py imports this module for
`export --to chronos-bolt` and for naming a Chronos-Bolt folder given to another model.
"""
import json
import os
import re

from models.foundation.release import config_of_release, named, named_in, read_config_json, release_config_path
from utils.adapters import SAFETENSORS_NAME, CheckpointAdapter, any_key
from utils.errors import UserError

ARCHITECTURE = "ChronosBoltModelForForecasting"  # config.json "architectures" of every released folder
HUB_IDS = ("amazon/chronos-bolt-tiny", "amazon/chronos-bolt-mini", "amazon/chronos-bolt-small",
           "amazon/chronos-bolt-base")
PREFIX = "bolt."  # models/ChronosBolt.Model keeps the package's module as self.bolt
TIED = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
IGNORED = ("lm_head.weight",)  # ChronosBoltModelForForecasting._keys_to_ignore_on_load_unexpected

# The released configuration (amazon/chronos-bolt-*/config.json, the same in all four but for the sizes):
# what our model uses where --pretrain_model_path names no folder, TSLib's size arguments in place of the sizes.
RELEASED_CHRONOS_CONFIG = {
    "context_length": 2048,
    "prediction_length": 64,
    "input_patch_size": 16,
    "input_patch_stride": 16,
    "quantiles": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
    "use_reg_token": True,
}
RELEASED_T5 = {
    "architectures": [ARCHITECTURE],
    "chronos_pipeline_class": "ChronosBoltPipeline",
    "model_type": "t5",
    "d_kv": 64,
    "dense_act_fn": "relu",
    "feed_forward_proj": "relu",
    "is_gated_act": False,
    "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "initializer_factor": 0.05,
    "classifier_dropout": 0.0,
    "n_positions": 512,
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "reg_token_id": 1,
    "vocab_size": 2,
    "use_cache": True,
    "torch_dtype": "float32",
}
# The four released sizes (d_model, d_ff, num_layers = num_decoder_layers, num_heads; d_kv 64 in all):
# 9M, 21M, 48M and 205M parameters.
RELEASED_SIZES = {"tiny": (256, 1024, 4, 4), "mini": (384, 1536, 4, 8), "small": (512, 2048, 6, 8),
                  "base": (768, 3072, 12, 12)}


def released_config(size="small", **overrides):
    """The config.json of amazon/chronos-bolt-<size> as a dict (the benchmark's shapes); `overrides` replace
    fields (chronos_config's own included, as `chronos_config=dict(...)` merged into the released one)."""
    d_model, d_ff, layers, heads = RELEASED_SIZES[size]
    chronos = dict(RELEASED_CHRONOS_CONFIG, **overrides.pop("chronos_config", {}))
    return {**RELEASED_T5, "d_model": d_model, "d_ff": d_ff, "num_layers": layers, "num_decoder_layers": layers,
            "num_heads": heads, "dropout_rate": 0.1, "chronos_config": chronos, **overrides}


def generic_config(configs):
    """The released architecture at TSLib's sizes (--d_model, --d_ff, --e_layers, --d_layers, --n_heads,
    --dropout); every other field as released."""
    return {**RELEASED_T5, "d_model": configs.d_model, "d_ff": configs.d_ff, "num_layers": configs.e_layers,
            "num_decoder_layers": configs.d_layers, "num_heads": configs.n_heads, "dropout_rate": configs.dropout,
            "chronos_config": dict(RELEASED_CHRONOS_CONFIG)}


# ------------------------------------------------------------ the folder a user downloads
def folder_config(path):
    """The config.json of the Chronos-Bolt checkpoint `path` names (a downloaded folder, or its
    model.safetensors), checked to be Chronos-Bolt's; None when `path` is a checkpoint file of ours (.pth),
    whose shapes come from the model arguments. A UserError names what is missing or what the folder is."""
    config_path = release_config_path(path, "Chronos-Bolt", f"e.g. {HUB_IDS[2]}", "ChronosBolt")
    if config_path is None:
        return None
    config = read_config_json(config_path, "a Chronos-Bolt release (" + ", ".join(HUB_IDS) + ")")
    check_config(config, config_path)
    return config


def check_config(config, where):
    """One line when `config` (a config.json's dict) is not a Chronos-Bolt model's: what it is instead, or the
    field it lacks."""
    if not isinstance(config, dict):
        raise UserError(f"{where} does not hold a JSON object")
    architectures = config.get("architectures") or []
    if ARCHITECTURE not in architectures:
        shown = ", ".join(architectures) or "no architectures"
        kind = f"{shown}, model_type {config.get('model_type', '?')}"
        hint = config_of_release(config)  # what the signatures of the release folders say it is
        raise UserError(named_in(f"{where} is the config of another model ({kind}{'; ' + hint if hint else ''}), not "
                                 f"Chronos-Bolt's ({ARCHITECTURE}); --model ChronosBolt reads amazon/chronos-bolt-* "
                                 "folders", where, "ChronosBolt"))
    chronos = config.get("chronos_config")
    required = [k for k in RELEASED_CHRONOS_CONFIG if k != "use_reg_token"]  # the package defaults it to False
    lacking = [f"chronos_config.{k}" for k in required if not isinstance(chronos, dict) or k not in chronos]
    lacking += [k for k in ("d_model", "d_ff", "num_layers", "num_heads", "d_kv") if k not in config]
    if lacking:
        raise UserError(f"{where} lacks {', '.join(lacking)}: not a complete Chronos-Bolt config.json")


# ------------------------------------------------------------ the adapter
RELEASED_SIGNATURE = (r"^input_patch_embedding\.hidden_layer\.weight$",
                      r"^encoder\.block\.0\.layer\.0\.SelfAttention\.relative_attention_bias\.weight$")
OURS_SIGNATURE = r"^bolt\.input_patch_embedding\.hidden_layer\.weight$"


class ChronosBoltAdapter(CheckpointAdapter):
    """Chronos-Bolt's released model.safetensors <-> our ChronosBolt.py."""
    model = "ChronosBolt"
    what = "Chronos-Bolt's released checkpoint (amazon/chronos-bolt-*: config.json + model.safetensors)"
    export_format = "chronos-bolt"
    export_note = ("a folder chronos.ChronosBoltPipeline.from_pretrained(DST) reads; config.json's fields that no "
                   "weight shows (context_length 2048, relative_attention_max_distance 128, relu) are the "
                   "released ones")
    writes_folder = True  # utils.checkpoint.export writes config.json + model.safetensors into DST

    def recognise(self, state, config):
        return ARCHITECTURE in (config.get("architectures") or []) or all(any_key(state, p) for p in RELEASED_SIGNATURE)

    def to_ours(self, state, config):
        state = {k: v for k, v in state.items() if k not in IGNORED}
        present = [k for k in TIED if k in state]
        if not present:
            raise UserError(f"no token embedding ({' / '.join(TIED)}): not a complete Chronos-Bolt checkpoint")
        first = state[present[0]]
        for key in present[1:]:
            if state[key].shape != first.shape or not bool((state[key] == first).all()):
                raise UserError(f"{key} differs from {present[0]}, which T5 ties it to")
        state.update({key: first for key in TIED})
        return {PREFIX + key: value for key, value in state.items()}

    def holds_ours(self, state):
        return any_key(state, OURS_SIGNATURE)

    def from_ours(self, state):
        out = {}
        for key, value in state.items():
            if not key.startswith(PREFIX):
                raise UserError(f"{key} has no place in Chronos-Bolt's layout")
            key = key[len(PREFIX):]
            if key in TIED[1:]:  # tied to shared.weight: save_pretrained writes it once
                continue
            out[key] = value.detach().contiguous()
        return out

    def shape_args(self, state):
        sizes = release_config(self.from_ours(state))
        return {"d_model": sizes["d_model"], "d_ff": sizes["d_ff"], "e_layers": sizes["num_layers"],
                "d_layers": sizes["num_decoder_layers"], "n_heads": sizes["num_heads"]}

    def write(self, state, folder):
        """Write `state`, in the release's layout (from_ours), as a released folder: model.safetensors and
        config.json."""
        from safetensors.torch import save_file

        config = release_config(state)
        os.makedirs(folder, exist_ok=True)
        partial = os.path.join(folder, f".{SAFETENSORS_NAME}.partial")
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, partial, metadata={"format": "pt"})
        os.replace(partial, os.path.join(folder, SAFETENSORS_NAME))
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")


def _layers(state, stack):
    found = {int(m.group(1)) for k in state for m in [re.match(rf"{stack}\.block\.(\d+)\.", k)] if m}
    return max(found) + 1 if found else 0


def release_config(state):
    """The config.json of a Chronos-Bolt `state` in the release's layout: sizes from the weights' shapes, the
    fields no weight shows as released."""
    def shape(key):
        if key not in state:
            raise UserError(f"{key} missing: not a complete Chronos-Bolt checkpoint")
        return tuple(state[key].shape)

    vocab, d_model = shape("shared.weight")
    buckets, heads = shape("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
    inner = shape("encoder.block.0.layer.0.SelfAttention.q.weight")[0]
    d_ff = shape("encoder.block.0.layer.1.DenseReluDense.wi.weight")[0]
    patch = shape("input_patch_embedding.hidden_layer.weight")[1] // 2
    outputs = shape("output_patch_embedding.output_layer.weight")[0]
    quantiles = RELEASED_CHRONOS_CONFIG["quantiles"]  # the levels models/ChronosBolt.Model forecasts
    if outputs % len(quantiles):
        raise UserError(f"output_patch_embedding forecasts {outputs} values, not {len(quantiles)} quantiles a step")
    chronos = dict(RELEASED_CHRONOS_CONFIG, input_patch_size=patch, input_patch_stride=patch,
                   prediction_length=outputs // len(quantiles), use_reg_token=vocab == 2)
    return {**RELEASED_T5, "d_model": d_model, "d_ff": d_ff, "num_heads": heads, "d_kv": inner // heads,
            "num_layers": _layers(state, "encoder"), "num_decoder_layers": _layers(state, "decoder"),
            "relative_attention_num_buckets": buckets, "dropout_rate": 0.1, "chronos_config": chronos,
            "vocab_size": vocab}


CHRONOS_BOLT = ChronosBoltAdapter()
ADAPTERS = (CHRONOS_BOLT,)
# what a downloaded folder of this release (or a relative we lack) looks like, for models/foundation/release.py
SIGNATURES = (("a Chronos-Bolt release (amazon/chronos-bolt-*)", "ChronosBolt",
               lambda files, config: named(config, "ChronosBoltModelForForecasting")),
              ("the original, tokenized Chronos (amazon/chronos-t5-*), which this codebase has no model for", None,
               lambda files, config: named(config, "T5ForConditionalGeneration")))

# The largest released checkpoint's shape as run.py's size arguments, for benchmarks/memory_table.py (which builds
# it on the meta device and counts its parameters): (checkpoint, arguments, published size, where they come from).
LARGEST_SHAPES = ((HUB_IDS[-1], dict(zip(("d_model", "d_ff", "e_layers", "n_heads"), RELEASED_SIZES["base"]),
                                     d_layers=RELEASED_SIZES["base"][2]),
                   "205M", "config.json: d_model 768, d_ff 3072, num_layers = num_decoder_layers 12, num_heads 12"),)
