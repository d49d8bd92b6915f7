"""Toto 2.0's released checkpoint in and out: the folder a user downloads from the Hugging Face hub
(Datadog/Toto-2.0-313m, Datadog/Toto-2.0-1B, Datadog/Toto-2.0-2.5B: config.json + model.safetensors, written by
the toto2 package's Toto2Model through huggingface_hub's PyTorchModelHubMixin), read into our Toto2.py and written
back so that the package's `Toto2Model.from_pretrained(DST)` reads it.

What the release is: config.json holds the fields of toto2's Toto2ModelConfig, nothing else (no model_type, no
architectures). The 2.5B one (a third-party copy whose size matches the hub's manifest):

    {"attn_bias": true, "d_ff": 5464, "d_model": 2048, "dropout_p": 0.0, "heads_per_group": 1,
     "layer_group_size": 48, "mlp_bias": false, "norm_eps": 0.0005, "norm_include_weight": false, "num_groups": 32,
     "num_heads": 32, "num_layers": 48, "num_output_patches": 1, "num_variate_layers_per_group": 1,
     "patch_size": 32, "per_dim_scale": true, "pre_norm": true, "qk_dim": 64, "qk_norm": false,
     "qk_norm_include_weight": false, "residual_attn_ratio": 5.136215466577748, "residual_mult": 0.75,
     "use_xpos": true, "v_dim": 64, "variate_layer_first": false}

(2,454,281,792 parameters). The 313m and 1B configs are not known here; the reader takes any config of these
fields. The weights keep the package's names; ours holds the network under `toto.`, so the key table is one
prefix:

| ours | released model.safetensors | shape (2.5B) |
|---|---|---|
| `toto.patch_proj.{linear1,linear2,skip_proj}.{weight,bias}` | `patch_proj...` | 2 patch -> 4 d_model -> d_model |
| `toto.transformer.layers.<i>.attn.in_proj.{weight,bias}` | same | [q heads + k groups + v groups] x d_model |
| `toto.transformer.layers.<i>.attn.out_proj.{weight,bias}` | same | [2048, 2048] |
| `toto.transformer.layers.<i>.attn._pds.per_dim_scale` | same | [qk_dim] (per_dim_scale) |
| `toto.transformer.layers.<i>.ffn.fc1.weight`, `.ffn.fc2.weight` | same | [2 d_ff, d_model] ([gate, x]), [d_model, d_ff] |
| `toto.transformer.layers.<i>.{attn_tau,mlp_tau}` | same | () the residual weights (buffers) |
| `toto.output_head.param_projection.proj.{linear1,linear2,skip_proj}.{weight,bias}` | same | d_model -> 9 x patch |

RMSNorms carry no weights (norm_include_weight false); the rotary tables are not in the file. Export writes
config.json from the weights' shapes and tau buffers (d_model, d_ff, layers, patch, heads and groups from the
attention's shapes with qk_dim from per_dim_scale or d_model // heads, biases by presence, residual_mult and
residual_attn_ratio solved from the first layer's taus) and the 2.5B release's values for what no weight shows
(one variate layer, the last; xPos; no qk norm; norm_eps 5e-4).

Nothing here imports the toto2 package (which pins gluonts and so pandas < 3).
"""
import json
import math
import os
import re

from models.foundation.release import named_in, read_config_json, release_config_path
from utils.adapters import SAFETENSORS_NAME, CheckpointAdapter, any_key
from utils.errors import UserError

HUB_ID = "Datadog/Toto-2.0-2.5B"
HUB_IDS = ("Datadog/Toto-2.0-313m", "Datadog/Toto-2.0-1B", "Datadog/Toto-2.0-2.5B")
PREFIX = "toto."
QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # fixed knots in the package (not in config.json)
ROPE_POSITIONS = 8192  # the package's rotary tables (max_len): patches of context plus horizon

RELEASED = {"attn_bias": True, "d_ff": 5464, "d_model": 2048, "dropout_p": 0.0, "heads_per_group": 1,
            "layer_group_size": 48, "mlp_bias": False, "norm_eps": 0.0005, "norm_include_weight": False,
            "num_groups": 32, "num_heads": 32, "num_layers": 48, "num_output_patches": 1,
            "num_variate_layers_per_group": 1, "patch_size": 32, "per_dim_scale": True, "pre_norm": True,
            "qk_dim": 64, "qk_norm": False, "qk_norm_include_weight": False,
            "residual_attn_ratio": 5.136215466577748, "residual_mult": 0.75, "use_xpos": True, "v_dim": 64,
            "variate_layer_first": False}
# Toto2ModelConfig's defaults for the fields a config.json may leave out
DEFAULTS = {"dropout_p": 0.0, "norm_eps": 5e-5, "attn_bias": False, "mlp_bias": False, "num_output_patches": 1,
            "pre_norm": True, "d_ff": None, "qk_dim": None, "v_dim": None, "num_groups": None, "residual_mult": 1.0,
            "qk_norm": True, "norm_include_weight": False, "qk_norm_include_weight": None, "per_dim_scale": False,
            "use_xpos": False}
REQUIRED = ("patch_size", "d_model", "num_heads", "num_layers", "layer_group_size", "num_variate_layers_per_group",
            "variate_layer_first", "residual_attn_ratio")
SIGNATURE_FIELDS = ("layer_group_size", "num_variate_layers_per_group", "residual_attn_ratio")

OURS_SIGNATURE = r"^toto\.transformer\.layers\.0\.attn_tau$"
RELEASED_SIGNATURE = (r"^transformer\.layers\.0\.attn_tau$", r"^output_head\.param_projection\.proj\.skip_proj\.weight$")


def complete(config, where="config.json"):
    """The config with Toto2ModelConfig's derived fields filled in (d_ff, qk_dim, v_dim, num_groups,
    qk_norm_include_weight), checked as the package checks it; one line otherwise."""
    config = {**DEFAULTS, **config}
    d_model, heads = int(config["d_model"]), int(config["num_heads"])
    if heads <= 0 or d_model % heads:
        raise UserError(f"{where}: d_model {d_model} is not divisible by num_heads {heads}")
    config["d_ff"] = int(config["d_ff"] or (int(4 * d_model * 2 / 3) + 7) // 8 * 8)
    config["qk_dim"] = int(config["qk_dim"] or d_model // heads)
    config["v_dim"] = int(config["v_dim"] or config["qk_dim"])
    config["num_groups"] = int(config["num_groups"] or heads)
    if config["qk_norm_include_weight"] is None:
        config["qk_norm_include_weight"] = config["norm_include_weight"]
    if heads % config["num_groups"]:
        raise UserError(f"{where}: num_heads {heads} is not a multiple of num_groups {config['num_groups']}")
    config["heads_per_group"] = heads // config["num_groups"]
    if int(config["num_layers"]) % int(config["layer_group_size"]):
        raise UserError(f"{where}: num_layers {config['num_layers']} is not a multiple of layer_group_size "
                        f"{config['layer_group_size']}")
    if float(config["dropout_p"]) != 0.0:
        raise UserError(f"{where}: dropout_p {config['dropout_p']}; Toto 2.0 refuses dropout (the package raises)")
    if int(config["num_output_patches"]) != 1:
        raise UserError(f"{where}: num_output_patches {config['num_output_patches']}; every Toto 2.0 release "
                        "forecasts one patch a position, the only layout --model Toto2 reads")
    if config["norm_include_weight"] or config["qk_norm_include_weight"]:
        raise UserError(f"{where}: norms with weights (norm_include_weight); the Toto 2.0 releases' norms have none, "
                        "the only layout --model Toto2 reads")
    if config["qk_dim"] % 4:
        raise UserError(f"{where}: qk_dim {config['qk_dim']} is no multiple of 4 (rotary position on pairs of its "
                        "first half)")
    return config


def generic_config(configs):
    """The released architecture (2.5B's flags) at TSLib's sizes: --d_model, --n_heads, --e_layers, --d_ff; one
    variate layer, the last, as released."""
    heads = int(configs.n_heads)
    return complete({**RELEASED, "d_model": configs.d_model, "num_heads": heads, "num_groups": heads,
                     "num_layers": configs.e_layers, "layer_group_size": configs.e_layers, "d_ff": configs.d_ff,
                     "qk_dim": configs.d_model // heads, "v_dim": configs.d_model // heads}, "the model arguments")


def folder_config(path):
    """The completed config.json of the Toto 2.0 checkpoint `path` names (a downloaded folder, or its
    model.safetensors); None when `path` is a checkpoint file of ours (.pth). One line for what is missing or
    what the folder is instead."""
    config_path = release_config_path(path, "Toto 2.0", HUB_ID, "Toto2")
    if config_path is None:
        return None
    config = read_config_json(config_path, f"a Toto 2.0 release ({', '.join(HUB_IDS)})")
    check_config(config, config_path)
    return complete(config, config_path)


def check_config(config, where):
    """One line when `config` (a config.json's dict) is not Toto 2.0's: what it is instead, or what it lacks."""
    if "model_type" in config or "architectures" in config:
        kind = ", ".join(map(str, config.get("architectures") or [])) or "no architectures"
        raise UserError(named_in(f"{where} is the config of another model (model_type {config.get('model_type', '?')}, "
                                 f"{kind}), not Toto 2.0's (toto2 Toto2ModelConfig: d_model, layer_group_size, "
                                 f"residual_attn_ratio); --model Toto2 reads {HUB_ID}", where, "Toto2"))
    lacking = [k for k in REQUIRED if k not in config]
    if lacking:
        raise UserError(named_in(f"{where} lacks {', '.join(lacking)}: not a complete Toto 2.0 config.json "
                                 f"({HUB_ID})", where, "Toto2"))


# ------------------------------------------------------------ the adapter
class Toto2Adapter(CheckpointAdapter):
    """Toto 2.0's released model.safetensors (toto2 Toto2Model) <-> our Toto2.py."""
    model = "Toto2"
    what = f"Toto 2.0's released checkpoint ({', '.join(HUB_IDS)}: config.json + model.safetensors)"
    export_format = "toto2"
    export_note = ("a folder toto2.Toto2Model.from_pretrained(DST) reads; config.json's fields that no weight shows "
                   "(one variate layer, the last; xPos; no qk norm; norm_eps 5e-4) are the 2.5B release's")
    writes_folder = True

    def recognise(self, state, config):
        return set(SIGNATURE_FIELDS) <= set(config) or all(any_key(state, p) for p in RELEASED_SIGNATURE)

    def to_ours(self, state, config):
        if config:
            check_config(config, "config.json")
        return {PREFIX + key: value for key, value in state.items()}

    def holds_ours(self, state):
        return any_key(state, OURS_SIGNATURE)

    def from_ours(self, state):
        out = {}
        for key, value in state.items():
            if not key.startswith(PREFIX):
                raise UserError(f"{key} has no place in Toto 2.0's layout")
            out[key[len(PREFIX):]] = value.detach().contiguous()
        release_config(out)
        return out

    def shape_args(self, state):
        if not self.holds_ours(state):
            return {}
        sizes = release_config(self.from_ours(state))
        return {"d_model": sizes["d_model"], "d_ff": sizes["d_ff"], "e_layers": sizes["num_layers"],
                "n_heads": sizes["num_heads"]}

    def write(self, state, folder):
        """`state` in the release's layout written as a released folder: model.safetensors and config.json."""
        from safetensors.torch import save_file

        config = release_config(state)
        os.makedirs(folder, exist_ok=True)
        partial = os.path.join(folder, f".{SAFETENSORS_NAME}.partial")
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, partial, metadata={"format": "pt"})
        os.replace(partial, os.path.join(folder, SAFETENSORS_NAME))
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")


def residual_weights(tau_attn, tau_mlp, layers):
    """(residual_mult, residual_attn_ratio) of unit_scaling's transformer rule from the first layer's taus:
    tau_0 = alpha_attn / sqrt(L), tau_1 = alpha_mlp / sqrt(L + alpha_attn^2), alpha_attn = ratio * alpha_mlp,
    alpha_mlp = mult * sqrt(2 / (1 + ratio^2)) (L layers, 2 L residual branches)."""
    alpha_attn = tau_attn * math.sqrt(layers)
    alpha_mlp = tau_mlp * math.sqrt(layers + alpha_attn ** 2)
    ratio = alpha_attn / alpha_mlp
    return alpha_mlp / math.sqrt(2 / (1 + ratio ** 2)), ratio


def release_config(state):
    """The config.json of a Toto 2.0 `state` in the release's layout (module docstring)."""
    def shape(key):
        if key not in state:
            raise UserError(f"{key} missing: not a complete Toto 2.0 checkpoint")
        return tuple(state[key].shape)

    d_model, two_patch = shape("patch_proj.skip_proj.weight")
    patch = two_patch // 2
    layers = 1 + max(int(m.group(1)) for k in state for m in [re.match(r"transformer\.layers\.(\d+)\.", k)] if m)
    rows = shape("transformer.layers.0.attn.in_proj.weight")[0]
    value_width = shape("transformer.layers.0.attn.out_proj.weight")[1]
    pds = "transformer.layers.0.attn._pds.per_dim_scale" in state
    # qk_dim: per_dim_scale's size, else d_model // heads with heads = value_width // qk_dim (v_dim = qk_dim)
    qk_dim = shape("transformer.layers.0.attn._pds.per_dim_scale")[0] if pds else None
    if qk_dim is None:
        raise UserError("this Toto 2.0 has no per_dim_scale, so its head size is not in its weights; the release's "
                        "config.json (which --model Toto2 read) holds it: export from a model with per_dim_scale")
    heads = value_width // qk_dim
    groups = (rows - qk_dim * heads) // (2 * qk_dim)
    if heads * qk_dim != value_width or groups <= 0 or heads % groups or qk_dim * (heads + 2 * groups) != rows:
        raise UserError(f"attention of {rows} projections and {value_width} values is not Toto 2.0's q/k/v layout "
                        f"for heads of {qk_dim}")
    outputs = shape("output_head.param_projection.proj.skip_proj.weight")[0]
    if outputs != patch * len(QUANTILES):
        raise UserError(f"the output head forecasts {outputs} values, not {len(QUANTILES)} quantiles x {patch} steps")
    mult, ratio = residual_weights(float(state["transformer.layers.0.attn_tau"]),
                                   float(state["transformer.layers.0.mlp_tau"]), layers)
    return {**RELEASED, "d_model": d_model, "d_ff": shape("transformer.layers.0.ffn.fc2.weight")[1],
            "num_layers": layers, "layer_group_size": layers, "patch_size": patch, "num_heads": heads,
            "num_groups": groups, "heads_per_group": heads // groups, "qk_dim": qk_dim, "v_dim": qk_dim,
            "attn_bias": "transformer.layers.0.attn.in_proj.bias" in state,
            "mlp_bias": "transformer.layers.0.ffn.fc1.bias" in state, "per_dim_scale": pds,
            "residual_mult": mult, "residual_attn_ratio": ratio}


TOTO2 = Toto2Adapter()
ADAPTERS = (TOTO2,)  # `python -m exp.export export --to toto2`
SIGNATURES = (("a Toto 2.0 release (Datadog/Toto-2.0-*)", "Toto2",
               lambda files, config: all(k in config for k in SIGNATURE_FIELDS) and not config.get("model_type")),)

# The largest release's shape as run.py's size arguments, for benchmarks/memory_table.py (built on the meta device).
LARGEST_SHAPES = ((HUB_ID, {"d_model": RELEASED["d_model"], "d_ff": RELEASED["d_ff"],
                            "e_layers": RELEASED["num_layers"], "n_heads": RELEASED["num_heads"]},
                   "2.5B", "config.json (third-party copy, size-matched to the hub's model.safetensors): d_model 2048, "
                   "48 layers of 32 heads of 64, d_ff 5464, one variate layer (the last)"),)
