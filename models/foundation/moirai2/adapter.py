"""Moirai 2.0's released checkpoint in and out: the folder a user downloads from the Hugging Face hub
(Salesforce/moirai-2.0-R-small: config.json + model.safetensors, written by uni2ts's Moirai2Module through
huggingface_hub's PyTorchModelHubMixin), read into our Moirai2.py and written back so that uni2ts 2.0's
`Moirai2Module.from_pretrained(DST)` reads it.

What the release is (uni2ts 2.0.0, uni2ts/model/moirai2/module.py): config.json holds Moirai2Module's constructor
arguments, nothing else (no model_type, no architectures):

    {"attn_dropout_p": 0, "d_ff": 1024, "d_model": 384, "dropout_p": 0, "max_seq_len": 512, "num_layers": 6,
     "num_predict_token": 4, "patch_size": 16, "quantile_levels": [0.1, ..., 0.9], "scaling": true}

The number of heads is not a field: uni2ts's TransformerEncoder takes d_model // 64 (6 heads of 64). The
weights (11,387,208 parameters) are named as Moirai2Module names them; our model keeps the same module tree
under `moirai.`, so the key table is one prefix, and one move (the any-variate biases, which ours keeps frozen
apart from the layers: Moirai2.py):

| ours | released model.safetensors | shape (released) |
|---|---|---|
| `moirai.in_proj.{hidden,output,residual}_layer.{weight,bias}` | `in_proj...` | patch embedding: [2 patch] -> d_model |
| `moirai.encoder.layers.<i>.self_attn.{q,k,v,out}_proj.weight` | same | [d_model, d_model] |
| `moirai.encoder.layers.<i>.self_attn.{q,k}_norm.weight` | same | [head_dim] (RMSNorm of q and k) |
| `moirai.variate_bias.<i>.emb.weight` | `encoder.layers.<i>.self_attn.var_attn_bias.emb.weight` | [2, heads] (any-variate bias) |
| `moirai.encoder.layers.<i>.ffn.{fc1,fc_gate,fc2}.weight` | same | gated SiLU feed-forward, no biases |
| `moirai.encoder.layers.<i>.norm{1,2}.weight`, `moirai.encoder.norm.weight` | same | RMSNorm |
| `moirai.out_proj.{hidden,output,residual}_layer.{weight,bias}` | same | d_model -> tokens x quantiles x patch |

The rotary tables are not weights (non-persistent buffers in uni2ts too). Export writes config.json from the
weights' shapes (d_model, d_ff, num_layers, patch_size, num_predict_token) and the released values of what no
weight shows (max_seq_len 512, the 9 quantile levels, dropout 0, scaling on).

Nothing here imports uni2ts (which pins torch < 2.5 and numpy 1.26): utils/checkpoint.py imports this module
for `export --to moirai2` and for naming a Moirai 2.0 folder given to another model.
"""
import json
import os
import re

from models.foundation.release import named_in, read_config_json, release_config_path
from utils.adapters import SAFETENSORS_NAME, CheckpointAdapter, any_key
from utils.errors import UserError

HUB_ID = "Salesforce/moirai-2.0-R-small"
PREFIX = "moirai."  # models/Moirai2.Model keeps the network as self.moirai
HEAD_DIM = 64  # uni2ts's TransformerEncoder: num_heads = d_model // 64 (Moirai2Module passes num_heads=None)
QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

# The released config.json (Salesforce/moirai-2.0-R-small): the shapes of a model built from no folder, with
# TSLib's size arguments (--d_model, --d_ff, --e_layers, --n_heads, --dropout) in place of the sizes.
RELEASED = {"attn_dropout_p": 0.0, "d_ff": 1024, "d_model": 384, "dropout_p": 0.0, "max_seq_len": 512,
            "num_layers": 6, "num_predict_token": 4, "patch_size": 16, "quantile_levels": list(QUANTILES),
            "scaling": True}
REQUIRED = ("d_model", "d_ff", "num_layers", "patch_size", "max_seq_len", "num_predict_token")
MOIRAI1_FIELDS = ("patch_sizes", "distr_output")  # Moirai 1.x / Moirai-MoE: a masked encoder with mixtures

RELEASED_SIGNATURE = (r"^encoder\.layers\.0\.self_attn\.var_attn_bias\.emb\.weight$",
                      r"^out_proj\.residual_layer\.weight$")
OURS_SIGNATURE = r"^moirai\.variate_bias\.0\.emb\.weight$"
RELEASED_BIAS = re.compile(r"^encoder\.layers\.(\d+)\.self_attn\.var_attn_bias\.")
OURS_BIAS = re.compile(r"^variate_bias\.(\d+)\.")


def generic_config(configs):
    """The released architecture at TSLib's sizes; everything else (patch 16, 4 tokens a step, 9 levels, max
    512 tokens) as released. `num_heads` is ours: the release fixes d_model // 64."""
    dropout = float(getattr(configs, "dropout", 0.0))
    return {**RELEASED, "d_model": configs.d_model, "d_ff": configs.d_ff, "num_layers": configs.e_layers,
            "attn_dropout_p": dropout, "dropout_p": dropout, "num_heads": configs.n_heads}


def folder_config(path):
    """The config.json of the Moirai 2.0 checkpoint `path` names (a downloaded folder, or its
    model.safetensors), checked to be Moirai 2.0's, with `num_heads` added; None when `path` is a checkpoint
    file of ours (.pth), whose shapes come from the model arguments. A UserError names what is missing or what
    the folder is instead."""
    config_path = release_config_path(path, "Moirai 2.0", HUB_ID, "Moirai2")
    if config_path is None:
        return None
    config = read_config_json(config_path, f"a Moirai 2.0 release ({HUB_ID})")
    check_config(config, config_path)
    return {**RELEASED, **config, "num_heads": int(config["d_model"]) // HEAD_DIM}


def check_config(config, where):
    """One line when `config` (a config.json's dict) is not Moirai 2.0's: what it is instead, or what it lacks."""
    if any(k in config for k in MOIRAI1_FIELDS):
        raise UserError(f"{where} is the config of Moirai 1.x or Moirai-MoE (patch_sizes / distr_output: a masked "
                        f"encoder with a mixture distribution), not Moirai 2.0's; --model Moirai2 reads {HUB_ID}")
    if "model_type" in config or "architectures" in config:
        kind = ", ".join(map(str, config.get("architectures") or [])) or "no architectures"
        raise UserError(named_in(f"{where} is the config of another model (model_type {config.get('model_type', '?')}, "
                                 f"{kind}), not Moirai 2.0's (uni2ts Moirai2Module: d_model, num_layers, patch_size, "
                                 f"num_predict_token, quantile_levels); --model Moirai2 reads {HUB_ID}", where,
                                 "Moirai2"))
    lacking = [k for k in REQUIRED if k not in config]
    if lacking:
        raise UserError(named_in(f"{where} lacks {', '.join(lacking)}: not a complete Moirai 2.0 config.json "
                                 f"({HUB_ID})", where, "Moirai2"))
    if int(config["d_model"]) % HEAD_DIM:
        raise UserError(f"{where}: d_model {config['d_model']} is no multiple of 64, the head size uni2ts fixes")
    levels = tuple(float(q) for q in config.get("quantile_levels", QUANTILES))
    if levels != QUANTILES:
        raise UserError(f"{where} forecasts the quantiles {list(levels)}, not the {list(QUANTILES)} that "
                        "--model Moirai2 scores")
    if not config.get("scaling", True):
        raise UserError(f"{where}: scaling false (no instance scaling); every Moirai 2.0 release scales its input")


# ------------------------------------------------------------ the adapter
class Moirai2Adapter(CheckpointAdapter):
    """Moirai 2.0's released model.safetensors (uni2ts Moirai2Module) <-> our Moirai2.py."""
    model = "Moirai2"
    what = f"Moirai 2.0's released checkpoint ({HUB_ID}: config.json + model.safetensors)"
    export_format = "moirai2"
    export_note = ("a folder uni2ts.model.moirai2.Moirai2Module.from_pretrained(DST) reads; config.json's fields "
                   "that no weight shows (max_seq_len 512, the 9 quantile levels, dropout 0) are the released ones")
    writes_folder = True  # utils.checkpoint.export writes config.json + model.safetensors into DST

    def recognise(self, state, config):
        fields = {"num_predict_token", "quantile_levels", "patch_size", "d_model"}
        return fields <= set(config) or all(any_key(state, p) for p in RELEASED_SIGNATURE)

    def to_ours(self, state, config):
        if config:
            check_config(config, "config.json")
        return {PREFIX + RELEASED_BIAS.sub(r"variate_bias.\1.", key): value for key, value in state.items()}

    def holds_ours(self, state):
        return any_key(state, OURS_SIGNATURE)

    def from_ours(self, state):
        out = {}
        for key, value in state.items():
            if not key.startswith(PREFIX):
                raise UserError(f"{key} has no place in Moirai 2.0's layout")
            key = OURS_BIAS.sub(r"encoder.layers.\1.self_attn.var_attn_bias.", key[len(PREFIX):])
            out[key] = value.detach().contiguous()
        release_config(out)  # one line now for a model the release's format cannot describe
        return out

    def shape_args(self, state):
        if not self.holds_ours(state):
            return {}
        sizes = release_config(self.from_ours(state))
        return {"d_model": sizes["d_model"], "d_ff": sizes["d_ff"], "e_layers": sizes["num_layers"],
                "n_heads": sizes["d_model"] // HEAD_DIM}

    def write(self, state, folder):
        """Write `state`, in the release's layout (from_ours), as a released folder: model.safetensors and
        config.json, as PyTorchModelHubMixin.save_pretrained writes them."""
        from safetensors.torch import save_file

        config = release_config(state)
        os.makedirs(folder, exist_ok=True)
        partial = os.path.join(folder, f".{SAFETENSORS_NAME}.partial")
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, partial, metadata={"format": "pt"})
        os.replace(partial, os.path.join(folder, SAFETENSORS_NAME))
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")


def release_config(state):
    """The config.json of a Moirai 2.0 `state` in the release's layout: sizes from the weights' shapes, the
    fields no weight shows as released. One line for a model the format cannot hold (heads not d_model // 64)."""
    def shape(key):
        if key not in state:
            raise UserError(f"{key} missing: not a complete Moirai 2.0 checkpoint")
        return tuple(state[key].shape)

    d_model, two_patch = shape("in_proj.hidden_layer.weight")
    heads = shape("encoder.layers.0.self_attn.var_attn_bias.emb.weight")[1]
    if d_model % HEAD_DIM or heads != d_model // HEAD_DIM:
        raise UserError(f"this Moirai 2.0 has {heads} heads of d_model {d_model}; the release's format has no heads "
                        f"field (uni2ts takes d_model // 64), so only d_model a multiple of 64 with d_model // 64 "
                        "heads can be written: train it with --n_heads d_model/64")
    patch = two_patch // 2
    outputs = shape("out_proj.output_layer.weight")[0]
    if outputs % (len(QUANTILES) * patch):
        raise UserError(f"out_proj forecasts {outputs} values, not whole tokens of {len(QUANTILES)} quantiles x "
                        f"{patch} steps")
    layers = {int(m.group(1)) for k in state for m in [re.match(r"encoder\.layers\.(\d+)\.", k)] if m}
    return {**RELEASED, "d_model": d_model, "d_ff": shape("encoder.layers.0.ffn.fc1.weight")[0],
            "num_layers": max(layers) + 1, "patch_size": patch,
            "num_predict_token": outputs // (len(QUANTILES) * patch)}


MOIRAI2 = Moirai2Adapter()
ADAPTERS = (MOIRAI2,)  # `python -m exp.export export --to moirai2`
# what a downloaded folder of this release (or a relative we lack) looks like, for models/foundation/release.py
SIGNATURES = (("a Moirai 2.0 release (Salesforce/moirai-2.0-R-*)", "Moirai2",
               lambda files, config: "num_predict_token" in config and "patch_size" in config
               and not config.get("model_type")),
              ("a Moirai 1.x or Moirai-MoE release (uni2ts), which this codebase has no model for", None,
               lambda files, config: "patch_sizes" in config or "distr_output" in config))

# The largest released checkpoint's shape as run.py's size arguments, for benchmarks/memory_table.py (which builds
# it on the meta device and counts its parameters): (checkpoint, arguments, published size, where they come from).
LARGEST_SHAPES = ((HUB_ID, {"d_model": RELEASED["d_model"], "d_ff": RELEASED["d_ff"],
                            "e_layers": RELEASED["num_layers"], "n_heads": RELEASED["d_model"] // HEAD_DIM},
                   "11M", "config.json: d_model 384, d_ff 1024, num_layers 6, heads d_model // 64 (the only "
                   "Moirai 2.0 release)"),)
