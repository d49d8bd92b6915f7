"""Sundial's release in and out: the folder a user downloads from the Hugging Face hub (thuml/sundial-base-128m:
config.json + model.safetensors, its model code on the hub, run with trust_remote_code), read into our native
Sundial.py and written back by `python -m exp.export export --to sundial`.

The key table (the release's SundialForPrediction: a decoder `model.*` and a flow-matching head `flow_loss.net.*`):

| ours | released model.safetensors |
|---|---|
| `embed_layer.{hidden_layer,output_layer,residual_layer}.*` | `model.embed_layer.…` (the patch MLP) |
| `layers.N.…` (self_attn.{q,k,v,o}_proj, ffn_layer.{gate,up,down}_proj, norm1, norm2) | `model.layers.N.…` |
| `norm.*` | `model.norm.*` |
| `flow.*` (time_embed, cond_embed, input_proj, res_blocks.N, final_layer) | `flow_loss.net.*` |

The architecture comes from config.json (Sundial.py reads it when --pretrain_model_path names the
folder); fields the file leaves out take SundialConfig's defaults, as the reference's from_pretrained does.
An export writes config.json from the weights' shapes, plus the fields no weight shows (num_sampling_steps,
diffusion_batch_mul, dropout_rate, max_position_embeddings) at the released values.

Nothing here imports torch at module level beyond what utils/checkpoint.py already has: it imports this module
for `export --to sundial` and for naming a Sundial folder given to another model."""
import json
import os

from models.foundation.release import config_of_release, named, named_in, read_config_json, release_config_path
from utils.adapters import SAFETENSORS_NAME, CheckpointAdapter, any_key
from utils.errors import UserError

HUB_ID = "thuml/sundial-base-128m"
ARCHITECTURE = "SundialForPrediction"
MODEL_TYPE = "sundial"
# SundialConfig's defaults, which are the released thuml/sundial-base-128m (128M parameters): a field a
# config.json lacks takes this value, as the reference's SundialConfig(**config) does.
RELEASED = {
    "input_token_len": 16,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "output_token_lens": [720],
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "hidden_act": "silu",
    "use_cache": True,
    "rope_theta": 10000,  # read by nothing: the reference's rotary embedding keeps its own base 10000
    "dropout_rate": 0.1,
    "initializer_range": 0.02,
    "max_position_embeddings": 10000,
    "flow_loss_depth": 3,
    "num_sampling_steps": 50,
    "diffusion_batch_mul": 4,
}
# What the release's config.json carries besides the sizes (the code lives beside it on the hub).
RELEASED_HEADER = {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
                   "auto_map": {"AutoConfig": "configuration_sundial.SundialConfig",
                                "AutoModelForCausalLM": "modeling_sundial.SundialForPrediction"},
                   "torch_dtype": "float32"}
ACTIVATIONS = ("silu", "swish", "gelu", "relu")  # transformers' ACT2FN names Sundial.py computes


def generic_config(configs):
    """The released architecture at TSLib's sizes (--d_model, --n_heads, --e_layers, --d_ff, --dropout)."""
    return {**RELEASED, "hidden_size": configs.d_model, "num_attention_heads": configs.n_heads,
            "num_hidden_layers": configs.e_layers, "intermediate_size": configs.d_ff,
            "dropout_rate": configs.dropout}


# ------------------------------------------------------------ the folder a user downloads
def folder_config(path):
    """The config of the Sundial release `path` names (a downloaded folder, or its model.safetensors), with
    SundialConfig's defaults filled in; None for a checkpoint file of ours (.pth), whose shapes come from the
    model arguments. One line naming what is missing, or what the folder is instead."""
    where = release_config_path(path, "Sundial", HUB_ID, "Sundial")
    if where is None:
        return None
    return check_config(read_config_json(where, f"a Sundial release ({HUB_ID})"), where)


def check_config(config, where):
    """`config` with the defaults filled in; one line when it is another model's, or holds a value ours cannot
    compute."""
    architectures = config.get("architectures") or []
    if config.get("model_type") != MODEL_TYPE and ARCHITECTURE not in architectures:
        kind = f"{', '.join(map(str, architectures)) or 'no architectures'}, model_type {config.get('model_type', '?')}"
        hint = config_of_release(config)  # what the signatures of the release folders say it is
        raise UserError(named_in(f"{where} is the config of another model ({kind}{'; ' + hint if hint else ''}), not "
                                 f"Sundial's ({ARCHITECTURE}, model_type {MODEL_TYPE}); --model Sundial reads {HUB_ID}",
                                 where, "Sundial"))
    config = {**RELEASED, **config}
    if str(config["hidden_act"]) not in ACTIVATIONS:
        raise UserError(f"{where}: hidden_act {config['hidden_act']} is not one models/foundation/sundial/Sundial.py "
                        f"computes ({', '.join(ACTIVATIONS)})")
    lens = config["output_token_lens"]
    if not isinstance(lens, list) or not lens or not all(isinstance(n, int) and n > 0 for n in lens):
        raise UserError(f"{where}: output_token_lens {lens!r} is not a list of positive step counts")
    return config


# ------------------------------------------------------------ the adapter
RELEASED_SIGNATURE = (r"^model\.embed_layer\.hidden_layer\.weight$", r"^flow_loss\.net\.input_proj\.weight$")
OURS_SIGNATURE = (r"^embed_layer\.hidden_layer\.weight$", r"^flow\.input_proj\.weight$")
RENAMES = (("model.", ""), ("flow_loss.net.", "flow."))  # (release prefix, ours)
# config.json's fields that no weight's shape shows: our model keeps them in one buffer, so a checkpoint of ours
# exports to the config.json it was read from (hidden_act as its index in ACTIVATIONS).
FIELDS_KEY = "release_fields"
FIELDS = ("num_attention_heads", "num_sampling_steps", "diffusion_batch_mul", "max_position_embeddings",
          "rope_theta", "dropout_rate", "initializer_range", "hidden_act")


def fields_tensor(config):
    """The FIELDS of `config` as our buffer (float64)."""
    import torch

    values = [ACTIVATIONS.index(config[k]) if k == "hidden_act" else float(config[k]) for k in FIELDS]
    return torch.tensor(values, dtype=torch.float64)


def fields_of(tensor):
    """The FIELDS our buffer holds, as config.json's values."""
    values = dict(zip(FIELDS, tensor.tolist()))
    out = {k: int(v) for k, v in values.items() if k not in ("dropout_rate", "initializer_range", "hidden_act")}
    return {**out, "dropout_rate": values["dropout_rate"], "initializer_range": values["initializer_range"],
            "hidden_act": ACTIVATIONS[int(values["hidden_act"])]}


class SundialAdapter(CheckpointAdapter):
    """thuml's released Sundial (config.json + model.safetensors) <-> our Sundial.py."""
    model = "Sundial"
    what = f"Sundial's released checkpoint ({HUB_ID}: config.json + model.safetensors)"
    export_format = "sundial"
    export_note = (f"a folder SundialForPrediction.from_pretrained(DST) reads; for transformers' AutoModel with "
                   f"trust_remote_code copy {HUB_ID}'s configuration_sundial.py and modeling_sundial.py beside it")
    writes_folder = True  # utils.checkpoint.export writes config.json + model.safetensors into DST

    def recognise(self, state, config):
        return (config.get("model_type") == MODEL_TYPE or ARCHITECTURE in (config.get("architectures") or [])
                or all(any_key(state, p) for p in RELEASED_SIGNATURE))

    def to_ours(self, state, config):
        if not config:
            raise UserError(f"no config.json beside the weights: pass the release folder ({HUB_ID})")
        config = check_config(config, "config.json")
        out = {}
        for key, value in state.items():
            for theirs, ours in RENAMES:
                if key.startswith(theirs):
                    key = ours + key[len(theirs):]
                    break
            out[key] = value  # a key of no place keeps its name: the strict load names it
        out[FIELDS_KEY] = fields_tensor(config)
        return out

    def holds_ours(self, state):
        return FIELDS_KEY in state and all(any_key(state, p) for p in OURS_SIGNATURE)

    def from_ours(self, state):
        """The release's tensors, and our FIELDS_KEY buffer (write() turns it into config.json)."""
        out = {FIELDS_KEY: state[FIELDS_KEY]}
        for key, value in state.items():
            if key == FIELDS_KEY:
                continue
            if key.startswith("flow."):
                out["flow_loss.net." + key[len("flow."):]] = value.detach().contiguous()
            else:
                out["model." + key] = value.detach().contiguous()
        return out

    def shape_args(self, state):
        if not self.holds_ours(state):
            return {}
        config = release_config(self.from_ours(state))
        return {"d_model": config["hidden_size"], "n_heads": config["num_attention_heads"],
                "e_layers": config["num_hidden_layers"], "d_ff": config["intermediate_size"]}

    def write(self, state, folder):
        """`state` (from_ours) as a released folder: model.safetensors and config.json."""
        from safetensors.torch import save_file

        config = release_config(state)
        tensors = {k: v.detach().cpu().contiguous() for k, v in state.items() if k != FIELDS_KEY}
        os.makedirs(folder, exist_ok=True)
        partial = os.path.join(folder, f".{SAFETENSORS_NAME}.partial")
        save_file(tensors, partial, metadata={"format": "pt"})
        os.replace(partial, os.path.join(folder, SAFETENSORS_NAME))
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")


def release_config(state):
    """The config.json of a Sundial `state` from from_ours: sizes from the weights' shapes, the rest from the
    FIELDS buffer."""
    def shape(key):
        if key not in state:
            raise UserError(f"{key} missing: not a complete Sundial checkpoint")
        return tuple(state[key].shape)

    intermediate, twice_token = shape("model.embed_layer.hidden_layer.weight")
    hidden = shape("model.embed_layer.output_layer.weight")[0]
    layers = {int(k.split(".")[2]) for k in state if k.startswith("model.layers.")}
    blocks = {int(k.split(".")[3]) for k in state if k.startswith("flow_loss.net.res_blocks.")}
    output = shape("flow_loss.net.input_proj.weight")[1]
    return {**RELEASED_HEADER, **RELEASED, **fields_of(state[FIELDS_KEY]), "input_token_len": twice_token // 2,
            "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": len(layers),
            "flow_loss_depth": len(blocks), "output_token_lens": [output]}


SUNDIAL = SundialAdapter()
ADAPTERS = (SUNDIAL,)  # `python -m exp.export export --to sundial`
# what a downloaded folder of this release (or a relative we lack) looks like, for models/foundation/release.py
SIGNATURES = (("Sundial's release (thuml/sundial-base-128m)", "Sundial",
               lambda files, config: named(config, "sundial", "SundialForPrediction")),)

# The largest released checkpoint's shape as run.py's size arguments, for benchmarks/memory_table.py (which builds
# it on the meta device and counts its parameters): (checkpoint, arguments, published size, where they come from).
LARGEST_SHAPES = ((HUB_ID, {"d_model": RELEASED["hidden_size"], "d_ff": RELEASED["intermediate_size"],
                            "e_layers": RELEASED["num_hidden_layers"], "n_heads": RELEASED["num_attention_heads"]},
                   "128M", "config.json: hidden_size 768, intermediate_size 3072, 12 layers, 12 heads, flow depth 3"),)
