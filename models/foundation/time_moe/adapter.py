"""Time-MoE's released checkpoints in and out: the folder a user downloads from the Hugging Face hub
(Maple728/TimeMoE-50M, Maple728/TimeMoE-200M: config.json + model.safetensors), read into our TimeMoE.py,
and written back by `python -m exp.export export --to time-moe` so that Time-MoE's own code
(time_moe/models/modeling_time_moe.py, TimeMoeForPrediction.from_pretrained) reads it.

The key table (`{i}` a layer, `{j}` an expert, `{k}` an output head, `{p}` weight or bias, `{part}` gate, up
or down):

| ours | released model.safetensors |
|---|---|
| `embedding.value.weight`, `embedding.gate.weight` | `model.embed_layer.emb_layer.weight`, `.gate_layer.weight` |
| `layers.{i}.attention_norm.weight` | `model.layers.{i}.input_layernorm.weight` |
| `layers.{i}.attention.{query,key,value}.{p}` | `model.layers.{i}.self_attn.{q,k,v}_proj.{p}` |
| `layers.{i}.attention.out.weight` | `model.layers.{i}.self_attn.o_proj.weight` |
| `layers.{i}.ffn_norm.weight` | `model.layers.{i}.post_attention_layernorm.weight` |
| `layers.{i}.moe.router.weight` | `model.layers.{i}.ffn_layer.gate.weight` |
| `layers.{i}.moe.experts.{j}.{part}.weight` | `model.layers.{i}.ffn_layer.experts.{j}.{part}_proj.weight` |
| `layers.{i}.moe.shared.{part}.weight` | `model.layers.{i}.ffn_layer.shared_expert.{part}_proj.weight` |
| `layers.{i}.moe.shared_gate.weight` | `model.layers.{i}.ffn_layer.shared_expert_gate.weight` |
| `layers.{i}.mlp.{part}.weight` (use_dense) | `model.layers.{i}.ffn_layer.{part}_proj.weight` |
| `norm.weight` | `model.norm.weight` |
| `heads.{k}.weight` | `lm_heads.{k}.out_layer.weight` |
| `release_fields` | (config.json) |

`release_fields` is our one buffer: the config.json fields no weight's shape shows (the number of attention heads,
top-k, the rotary base, ...), kept with the weights so that a fine-tuned checkpoint exports its own values and
is refused by a model built with others (TimeMoE.py). It holds their float64 bits in an int64 tensor,
which a cast of the model to another float type leaves exact.

The released configurations (config.json of both folders, transformers 4.40.1, bfloat16 weights): hidden_size
384 / 768, intermediate_size 1536 / 3072, 12 layers, 12 heads (12 key/value heads), 8 experts, top-2,
horizon_lengths [1, 8, 32, 64], max_position_embeddings 4096, rope_theta 10000, rms_norm_eps 1e-6,
router_aux_loss_factor 0.02, attention_dropout 0, silu, use_dense false. Nothing here imports torch at module
level but what the adapter needs, nor transformers."""
import json
import os
import re

import torch

from models.foundation.release import named, named_in, read_config_json, release_config_path
from utils.adapters import SAFETENSORS_NAME, CheckpointAdapter, any_key
from utils.errors import UserError

HUB_IDS = ("Maple728/TimeMoE-50M", "Maple728/TimeMoE-200M")
ARCHITECTURE = "TimeMoeForPrediction"
MODEL_TYPE = "time_moe"
# Released config.json (both sizes) less the sizes: what a model built without a folder keeps.
RELEASED = {"horizon_lengths": [1, 8, 32, 64], "num_experts": 8, "num_experts_per_tok": 2,
            "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
            "router_aux_loss_factor": 0.02, "apply_aux_loss": True, "use_dense": False, "attention_dropout": 0.0,
            "input_size": 1, "hidden_act": "silu"}
RELEASED_SIZES = {"50M": {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 12,
                          "num_attention_heads": 12, "num_key_value_heads": 12},
                  "200M": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                           "num_attention_heads": 12, "num_key_value_heads": 12}}
# TimeMoeConfig's defaults for fields a config.json may leave out (the sizes it may not).
DEFAULTS = {"input_size": 1, "hidden_act": "silu", "num_experts_per_tok": 2, "num_experts": 1,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "attention_dropout": 0.0,
            "use_dense": False, "apply_aux_loss": True, "router_aux_loss_factor": 0.02}
REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "horizon_lengths")
# The fields our `release_fields` buffer keeps, in its order.
FIELDS = ("num_attention_heads", "num_key_value_heads", "num_experts_per_tok", "max_position_embeddings",
          "rope_theta", "rms_norm_eps", "router_aux_loss_factor", "apply_aux_loss", "attention_dropout")
FIELDS_KEY = "release_fields"


def released_config(size="50M", **overrides):
    """The config.json of Maple728/TimeMoE-<size> as a dict (the benchmark's shapes), `overrides` replacing fields."""
    return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, **RELEASED, **RELEASED_SIZES[size],
            "initializer_range": 0.02, "tie_word_embeddings": False, "use_cache": True, **overrides}


def generic_config(configs):
    """The released architecture at TSLib's sizes (--d_model, --d_ff, --e_layers, --n_heads, --dropout)."""
    return {**RELEASED, "hidden_size": configs.d_model, "intermediate_size": configs.d_ff,
            "num_hidden_layers": configs.e_layers, "num_attention_heads": configs.n_heads,
            "num_key_value_heads": configs.n_heads, "attention_dropout": configs.dropout}


# ------------------------------------------------------------ the folder a user downloads
def folder_config(path):
    """The checked config.json of the Time-MoE folder `path` names (or of the folder of its model.safetensors);
    None for a checkpoint file of ours (.pth), whose shapes come from the model arguments."""
    where = release_config_path(path, "Time-MoE", " or ".join(HUB_IDS), "TimeMoE")
    if where is None:
        return None
    return check_config(read_config_json(where, "a Time-MoE release (" + ", ".join(HUB_IDS) + ")"), where)


def check_config(config, where):
    """`config` with TimeMoeConfig's defaults filled in; one line when it is another model's, or lacks a size."""
    architectures = config.get("architectures") or []
    if config.get("model_type") != MODEL_TYPE and ARCHITECTURE not in architectures:
        kind = f"{', '.join(architectures) or 'no architectures'}, model_type {config.get('model_type', '?')}"
        raise UserError(named_in(f"{where} is the config of another model ({kind}), not Time-MoE's ({ARCHITECTURE}, "
                                 f"model_type {MODEL_TYPE}); --model TimeMoE reads {' / '.join(HUB_IDS)} folders",
                                 where, "TimeMoE"))
    lacking = [k for k in REQUIRED if k not in config]
    if lacking:
        raise UserError(f"{where} lacks {', '.join(lacking)}: not a complete Time-MoE config.json")
    config = {**DEFAULTS, **config}
    if config.get("num_key_value_heads") is None:
        config["num_key_value_heads"] = config["num_attention_heads"]
    horizons = config["horizon_lengths"]
    config["horizon_lengths"] = [horizons] if isinstance(horizons, int) else list(horizons)
    return config


# ------------------------------------------------------------ the key table
TABLE = (
    ("embedding.value.weight", "model.embed_layer.emb_layer.weight"),
    ("embedding.gate.weight", "model.embed_layer.gate_layer.weight"),
    ("layers.{i}.attention_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    ("layers.{i}.attention.{qkv}.{p}", "model.layers.{i}.self_attn.{qkv}_proj.{p}"),
    ("layers.{i}.attention.out.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    ("layers.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    ("layers.{i}.moe.router.weight", "model.layers.{i}.ffn_layer.gate.weight"),
    ("layers.{i}.moe.experts.{j}.{part}.weight", "model.layers.{i}.ffn_layer.experts.{j}.{part}_proj.weight"),
    ("layers.{i}.moe.shared.{part}.weight", "model.layers.{i}.ffn_layer.shared_expert.{part}_proj.weight"),
    ("layers.{i}.moe.shared_gate.weight", "model.layers.{i}.ffn_layer.shared_expert_gate.weight"),
    ("layers.{i}.mlp.{part}.weight", "model.layers.{i}.ffn_layer.{part}_proj.weight"),
    ("norm.weight", "model.norm.weight"),
    ("heads.{k}.weight", "lm_heads.{k}.out_layer.weight"),
)
# The attention projections are named q/k/v there and query/key/value here.
_QKV = {"query": "q", "key": "k", "value": "v"}
_FIELD_PATTERNS = {"i": r"\d+", "j": r"\d+", "k": r"\d+", "p": "weight|bias", "part": "gate|up|down",
                   "qkv": "query|key|value|q|k|v"}


def _regex(template):
    pattern = re.escape(template)
    for name, allowed in _FIELD_PATTERNS.items():
        pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>{allowed})")
    return re.compile(f"^{pattern}$")


_RULES = tuple((_regex(ours), ours, _regex(theirs), theirs) for ours, theirs in TABLE)


def _rename(key, to_release):
    for ours_re, ours, theirs_re, theirs in _RULES:
        match = (ours_re if to_release else theirs_re).match(key)
        if match:
            fields = match.groupdict()
            if "qkv" in fields:
                names = _QKV if to_release else {v: k for k, v in _QKV.items()}
                if fields["qkv"] not in names:
                    continue
                fields["qkv"] = names[fields["qkv"]]
            return (theirs if to_release else ours).format(**fields)
    return None


def fields_tensor(config):
    """The `release_fields` buffer for `config` (float64 bits in int64: exact under any float cast)."""
    return torch.tensor([float(config[name]) for name in FIELDS], dtype=torch.float64).view(torch.int64)


def fields_of(tensor):
    values = dict(zip(FIELDS, tensor.view(torch.float64).tolist()))
    ints = ("num_attention_heads", "num_key_value_heads", "num_experts_per_tok", "max_position_embeddings")
    values.update({name: int(values[name]) for name in ints})
    values["apply_aux_loss"] = bool(values["apply_aux_loss"])
    return values


def release_config(state):
    """config.json for a state in the release's layout plus our `release_fields` (from_ours keeps it aside)."""
    fields = fields_of(state[FIELDS_KEY])
    hidden = state["model.embed_layer.emb_layer.weight"].shape[0]
    layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("model.layers."))
    dense = "model.layers.0.ffn_layer.gate_proj.weight" in state
    prefix = "model.layers.0.ffn_layer." + ("" if dense else "shared_expert.")
    intermediate = state[prefix + "gate_proj.weight"].shape[0]
    experts = len({k.split(".")[5] for k in state if k.startswith("model.layers.0.ffn_layer.experts.")})
    heads = sorted(int(k.split(".")[1]) for k in state if k.startswith("lm_heads."))
    horizons = [state[f"lm_heads.{k}.out_layer.weight"].shape[0] for k in heads]
    return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
            "auto_map": {"AutoConfig": "configuration_time_moe.TimeMoeConfig",
                         "AutoModelForCausalLM": "modeling_time_moe.TimeMoeForPrediction"},
            "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
            "horizon_lengths": horizons, "num_experts": experts or 1, "use_dense": dense,
            "input_size": 1, "hidden_act": "silu", "initializer_range": 0.02, "tie_word_embeddings": False,
            "use_cache": True, "torch_dtype": "float32", **fields}


# ------------------------------------------------------------ the adapter
RELEASED_SIGNATURE = r"^model\.layers\.\d+\.ffn_layer\.(experts\.\d+|shared_expert)\.gate_proj\.weight$"
OURS_SIGNATURE = r"^layers\.\d+\.(moe\.router|mlp\.gate)\.weight$"


class TimeMoeAdapter(CheckpointAdapter):
    """Time-MoE's released model.safetensors + config.json <-> our TimeMoE.py."""
    model = "TimeMoE"
    what = "Time-MoE's released checkpoint (Maple728/TimeMoE-*: config.json + model.safetensors)"
    export_format = "time-moe"
    export_note = ("a folder time_moe's TimeMoeForPrediction.from_pretrained(DST) reads (float32); for "
                   "AutoModelForCausalLM(..., trust_remote_code=True) copy the release's configuration_time_moe.py, "
                   "modeling_time_moe.py and ts_generation_mixin.py beside it")
    writes_folder = True

    def recognise(self, state, config):
        return (config.get("model_type") == MODEL_TYPE or ARCHITECTURE in (config.get("architectures") or [])
                or any_key(state, RELEASED_SIGNATURE) or any_key(state, r"^model\.embed_layer\.emb_layer\.weight$"))

    def to_ours(self, state, config):
        if not config:
            raise UserError(f"no config.json beside the weights: pass the release folder ({' / '.join(HUB_IDS)})")
        config = check_config(config, "config.json")
        out = {}
        for key, value in state.items():
            # an unknown key keeps its name: the strict load names it
            out[_rename(key, to_release=False) or key] = value
        out[FIELDS_KEY] = fields_tensor(config)
        return out

    def holds_ours(self, state):
        return FIELDS_KEY in state and any_key(state, OURS_SIGNATURE)

    def from_ours(self, state):
        out = {}
        for key, value in state.items():
            name = key if key == FIELDS_KEY else _rename(key, to_release=True)
            if name is None:
                raise UserError(f"{key} has no place in Time-MoE's layout")
            out[name] = value.detach().contiguous()
        return out

    def shape_args(self, state):
        if not self.holds_ours(state):
            return {}
        config = release_config(self.from_ours(state))
        return {"d_model": config["hidden_size"], "d_ff": config["intermediate_size"],
                "e_layers": config["num_hidden_layers"], "n_heads": config["num_attention_heads"]}

    def write(self, state, folder):
        """`state` (from_ours) as a released folder: model.safetensors (float32) and config.json."""
        from safetensors.torch import save_file

        config = release_config(state)
        weights = {k: v.detach().cpu().float().contiguous() for k, v in state.items() if k != FIELDS_KEY}
        os.makedirs(folder, exist_ok=True)
        partial = os.path.join(folder, f".{SAFETENSORS_NAME}.partial")
        save_file(weights, partial, metadata={"format": "pt"})
        os.replace(partial, os.path.join(folder, SAFETENSORS_NAME))
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")


TIME_MOE = TimeMoeAdapter()
ADAPTERS = (TIME_MOE,)
# what a downloaded folder of this release (or a relative we lack) looks like, for models/foundation/release.py
SIGNATURES = (("a Time-MoE release (Maple728/TimeMoE-50M / -200M)", "TimeMoE",
               lambda files, config: named(config, "time_moe", "TimeMoeForPrediction")),)

# The largest released checkpoint's shape as run.py's size arguments, for benchmarks/memory_table.py (which builds
# it on the meta device and counts its parameters): (checkpoint, arguments, published size, where they come from).
LARGEST_SHAPES = (
    (HUB_IDS[-1], {"d_model": 768, "d_ff": 3072, "e_layers": 12, "n_heads": 12}, "453M total (200M activated)",
     "config.json: hidden_size 768, intermediate_size 3072, 12 layers, 12 heads, 8 experts, top 2"),
    # the paper's largest, Time-MoE-ultra, whose weights are not on the hub (only the 50M and 200M sizes are)
    ("Time-MoE-ultra, not released", {"d_model": 1024, "d_ff": 4096, "e_layers": 36, "n_heads": 16},
     "2.4B total (1.1B activated)", "the Time-MoE paper's ultra shape: d_model 1024, d_ff 4096, 36 layers, "
     "16 heads, 8 experts, top 2"),
)
