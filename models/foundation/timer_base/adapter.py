"""Timer as released on the Hugging Face hub (thuml/timer-base-84m: config.json + model.safetensors), read into our
TimerBase.py and written back by `python -m exp.export export --to timer-base`, a folder the release's
own code (`TimerForPrediction.from_pretrained`, trust_remote_code; sktime.libs.timer) reads.

The key table (`{n}` a layer, `{i}` an output head, `{p}` weight or bias):

| ours | released model.safetensors | note |
|---|---|---|
| `embedding.weight` | `model.embed_layer.emb.weight` | [hidden, input_token_len], no bias |
| `layers.{n}.attention.{q,k,v}.{p}` | `model.layers.{n}.self_attn.{q,k,v}_proj.{p}` | with biases |
| `layers.{n}.attention.out.weight` | `model.layers.{n}.self_attn.o_proj.weight` | no bias |
| `layers.{n}.ffn.{gate,up,down}.weight` | `model.layers.{n}.ffn_layer.{gate,up,down}_proj.weight` | no biases |
| `layers.{n}.norm{1,2}.{p}`, `norm.{p}` | `model.layers.{n}.norm{1,2}.{p}`, `model.norm.{p}` | LayerNorm |
| `heads.{i}.weight` | `lm_heads.{i}.weight` | [output_token_lens[i], hidden], no bias |
| `num_heads` | (config.json num_attention_heads) | a buffer: no weight shows the head count, an export writes it |

Every size comes from config.json; the fields no weight shows and the model does not read (rope_theta,
max_position_embeddings, initializer_range) are written back at the released values. Nothing here imports torch
at module level or transformers at all."""
import json
import os
import re

from models.foundation.release import config_of_release, named, named_in, read_config_json, release_config_path
from utils.adapters import SAFETENSORS_NAME, CheckpointAdapter, any_key
from utils.errors import UserError

HUB_ID = "thuml/timer-base-84m"
MODEL_TYPE = "timer"  # config.json model_type of the release
ARCHITECTURE = "TimerForPrediction"
HEADS_KEY = "num_heads"  # our buffer holding config.json's num_attention_heads
# thuml/timer-base-84m/config.json (84,142,080 parameters): what an export writes where no weight tells.
RELEASED = {
    "architectures": [ARCHITECTURE],
    "auto_map": {"AutoConfig": "configuration_timer.TimerConfig",
                 "AutoModelForCausalLM": "modeling_timer.TimerForPrediction"},
    "model_type": MODEL_TYPE,
    "input_token_len": 96,
    "output_token_lens": [96],
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "rope_theta": 10000,
    "max_position_embeddings": 10000,
    "initializer_range": 0.02,
    "use_cache": True,
    "torch_dtype": "float32",
}
NEEDED = ("input_token_len", "output_token_lens", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads")


def shape_from_config(config, where):
    """The sizes TimerBase.py is built with, from a release's config.json (dict); one line naming what is
    not Timer's or what is missing."""
    if config.get("model_type") != MODEL_TYPE:
        names = [str(config[k]) for k in ("model_type", "architectures") if k in config]
        hint = config_of_release(config)  # what the signatures of the release folders say it is
        raise UserError(named_in(f"{where} is the config of another model ({' / '.join(names) or 'no model_type'}"
                                 f"{'; ' + hint if hint else ''}), not Timer's (model_type {MODEL_TYPE}, {HUB_ID}); "
                                 f"--model TimerBase reads {HUB_ID}'s folder", where, "TimerBase"))
    lacking = [k for k in NEEDED if k not in config]
    if lacking:
        raise UserError(f"{where} lacks {', '.join(lacking)}: not a complete Timer config.json ({HUB_ID})")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise UserError(f"{where} has hidden_act {act}; --model TimerBase implements the release's silu")
    lens = config["output_token_lens"]
    if not isinstance(lens, list) or not lens:
        raise UserError(f"{where}: output_token_lens {lens!r} is not a list of horizons")
    return {"input_token_len": int(config["input_token_len"]), "output_token_lens": [int(h) for h in lens],
            "d_model": int(config["hidden_size"]), "d_ff": int(config["intermediate_size"]),
            "e_layers": int(config["num_hidden_layers"]), "n_heads": int(config["num_attention_heads"]),
            "attention_dropout": float(config.get("attention_dropout", 0.0))}


def folder_config(path):
    """(config.json as a dict, its path) of the release `path` names (its folder, or its model.safetensors); None
    for a checkpoint file of ours (.pth), whose shapes come from the model arguments."""
    where = release_config_path(path, "Timer", HUB_ID, "TimerBase")
    if where is None:
        return None
    return read_config_json(where, f"Timer ({HUB_ID})"), where


# ------------------------------------------------------------ the key table
RULES = (  # (ours, released): {n} a layer, {i} a head, {p} weight or bias
    ("embedding.weight", "model.embed_layer.emb.weight"),
    *((f"layers.{{n}}.attention.{name}.{{p}}", f"model.layers.{{n}}.self_attn.{name}_proj.{{p}}") for name in "qkv"),
    ("layers.{n}.attention.out.weight", "model.layers.{n}.self_attn.o_proj.weight"),
    *((f"layers.{{n}}.ffn.{name}.weight", f"model.layers.{{n}}.ffn_layer.{name}_proj.weight")
      for name in ("gate", "up", "down")),
    ("layers.{n}.norm1.{p}", "model.layers.{n}.norm1.{p}"),
    ("layers.{n}.norm2.{p}", "model.layers.{n}.norm2.{p}"),
    ("norm.{p}", "model.norm.{p}"),
    ("heads.{i}.weight", "lm_heads.{i}.weight"),
)


def _pattern(template):
    escaped = re.escape(template).replace(re.escape("{n}"), r"(?P<n>\d+)").replace(re.escape("{i}"), r"(?P<i>\d+)")
    return re.compile(escaped.replace(re.escape("{p}"), r"(?P<p>weight|bias)") + "$")


_COMPILED = [(ours, theirs, _pattern(ours), _pattern(theirs)) for ours, theirs in RULES]


def translate(key, to_release):
    """`key` in the other layout, or None when no row of the table matches it."""
    for ours, theirs, ours_re, theirs_re in _COMPILED:
        match = (ours_re if to_release else theirs_re).match(key)
        if match:
            return (theirs if to_release else ours).format(**match.groupdict())
    return None


def release_to_ours(state, config):
    """A release's state_dict in our layout (a key no row maps keeps its name: the strict load names it), plus the
    head count of its config.json as our buffer."""
    import torch

    out = {}
    for key, value in state.items():
        out[translate(key, to_release=False) or key] = value
    out[HEADS_KEY] = torch.tensor(int(config.get("num_attention_heads", 0)))
    return out


def release_config(state):
    """config.json for a state_dict in the release's layout plus our head count: sizes from the weights' shapes."""
    def shape(key):
        if key not in state:
            raise UserError(f"{key} missing: not a complete Timer checkpoint")
        return tuple(state[key].shape)

    hidden, token = shape("model.embed_layer.emb.weight")
    layers = {int(m.group(1)) for k in state for m in [re.match(r"model\.layers\.(\d+)\.", k)] if m}
    heads = sorted(int(m.group(1)) for k in state for m in [re.match(r"lm_heads\.(\d+)\.weight$", k)] if m)
    return {**RELEASED, "input_token_len": token, "hidden_size": hidden,
            "intermediate_size": shape("model.layers.0.ffn_layer.gate_proj.weight")[0],
            "num_hidden_layers": max(layers) + 1 if layers else 0,
            "output_token_lens": [shape(f"lm_heads.{i}.weight")[0] for i in heads]}


class TimerBaseAdapter(CheckpointAdapter):
    """thuml/timer-base-84m's model.safetensors + config.json <-> our TimerBase.py."""
    model = "TimerBase"
    what = f"Timer as released on Hugging Face ({HUB_ID}: model.layers.N.self_attn.q_proj, lm_heads.N)"
    export_format = "timer-base"
    export_note = (f"a folder in {HUB_ID}'s layout (config.json + model.safetensors); its modeling_timer.py "
                   "(trust_remote_code) reads it with TimerForPrediction.from_pretrained(DST)")
    writes_folder = True  # utils.checkpoint.export writes config.json + model.safetensors into DST

    def recognise(self, state, config):
        if config:  # a folder: its config.json decides (another model's is refused by name, not taken)
            return config.get("model_type") == MODEL_TYPE
        return any_key(state, r"^model\.embed_layer\.emb\.weight$") and any_key(state, r"^lm_heads\.\d+\.weight$")

    def to_ours(self, state, config):
        if "num_attention_heads" not in config:
            raise UserError(f"no config.json with num_attention_heads beside the weights: pass {HUB_ID}'s folder")
        return release_to_ours(state, config)

    def holds_ours(self, state):
        return HEADS_KEY in state and "embedding.weight" in state and any_key(state, r"^heads\.\d+\.weight$")

    def from_ours(self, state):
        out, unmapped = {}, []
        for key, value in state.items():
            if key == HEADS_KEY:
                continue
            name = translate(key, to_release=True)
            if name is None:
                unmapped.append(key)
            else:
                out[name] = value.detach().contiguous()
        if unmapped:
            raise UserError(f"{', '.join(sorted(unmapped)[:6])} of this TimerBase have no place in {HUB_ID}'s layout")
        config = release_config(out)
        config["num_attention_heads"] = int(state[HEADS_KEY])
        return {"state": out, "config": config}

    def shape_args(self, state):
        if not self.holds_ours(state):
            return {}
        config = self.from_ours(state)["config"]
        return {"d_model": config["hidden_size"], "d_ff": config["intermediate_size"],
                "e_layers": config["num_hidden_layers"], "n_heads": config["num_attention_heads"],
                "input_token_len": config["input_token_len"], "output_token_lens": config["output_token_lens"]}

    def write(self, checkpoint, folder):
        """`checkpoint` (from_ours) as the release's folder: model.safetensors and config.json."""
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        partial = os.path.join(folder, f".{SAFETENSORS_NAME}.partial")
        save_file({k: v.cpu() for k, v in checkpoint["state"].items()}, partial, metadata={"format": "pt"})
        os.replace(partial, os.path.join(folder, SAFETENSORS_NAME))
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(checkpoint["config"], f, indent=2, sort_keys=True)
            f.write("\n")


TIMER_BASE = TimerBaseAdapter()
ADAPTERS = (TIMER_BASE,)  # `python -m exp.export export --to timer-base`
# what a downloaded folder of this release (or a relative we lack) looks like, for models/foundation/release.py
SIGNATURES = (("Timer's release (thuml/timer-base-84m)", "TimerBase",
               lambda files, config: named(config, "timer", "TimerForPrediction")),)

# The largest released checkpoint's shape as run.py's size arguments, for benchmarks/memory_table.py (which builds
# it on the meta device and counts its parameters): (checkpoint, arguments, published size, where they come from).
LARGEST_SHAPES = ((HUB_ID, {"d_model": RELEASED["hidden_size"], "d_ff": RELEASED["intermediate_size"],
                            "e_layers": RELEASED["num_hidden_layers"], "n_heads": RELEASED["num_attention_heads"],
                            "input_token_len": RELEASED["input_token_len"],
                            "output_token_len": RELEASED["output_token_lens"][0]},
                   "84M", "config.json: hidden_size 1024, intermediate_size 2048, 8 layers, 8 heads, tokens of 96"),)
