"""Foreign checkpoint layouts belong to the model they convert into (torchtitan's per-model state-dict
adapter is the idea). A model reads another codebase's files by declaring adapters, a class attribute:

    from utils import openltm

    class Model(nn.Module):
        checkpoint_adapters = (openltm.TIMER_XL,)

utils/checkpoint.load_weights loads a file into a model in this order: the model's own layout (the file's
keys are the model's, once wrapper prefixes are stripped), else the first adapter the model declares that
recognises the file, converted in memory; both then load strictly. No other model's adapter is consulted
for loading: the other layouts known here only name what a file is when it fits neither (a refusal).

Also here: reading .safetensors files and Hugging Face model folders (model.safetensors + config.json),
the form in which released foundation models come. What a downloaded folder is (which release, read by which
--model) is models/foundation/release.py's: each release's folder declares its own signature."""
import json
import os
import re
from dataclasses import dataclass

from utils.errors import UserError


class CheckpointAdapter:
    """One foreign layout that one of our models reads. Subclasses set the three names and implement
    recognise and to_ours; from_ours, for `python -m exp.export export`, is optional."""
    model = None  # our model (--model NAME) this layout converts into: named in refusals and by export
    what = ""  # the foreign layout, for messages: "OpenLTM's Timer-XL (models/timer_xl.py)"
    export_format = None  # `export --to NAME` writes this layout (needs from_ours)
    export_note = ""  # printed after an export: what the other codebase computes differently

    def recognise(self, state, config):
        """Whether `state` (wrapper prefixes stripped) is in this layout; `config`: the config.json beside
        a Hugging Face file, else {}."""
        raise NotImplementedError

    def to_ours(self, state, config):
        """`state` in our model's layout; a key with no place may keep its name (the strict load names it).
        A UserError says what is wrong with the file."""
        raise NotImplementedError

    def holds_ours(self, state):
        """Whether `state` is our model's, in our layout, that from_ours can write."""
        return False

    def from_ours(self, state):
        raise UserError(f"writing {self.what} is not supported")

    def shape_args(self, state):
        """The model arguments a state in our layout shows ({name: value or None}), for refusals; {}: none."""
        return {}

    def loaded_note(self, model):
        """A warning after loading a converted file into `model`, or None."""
        return None

    def __repr__(self):
        return f"<checkpoint adapter: {self.what} -> --model {self.model}>"


def any_key(state, pattern):
    regex = re.compile(pattern)
    return any(regex.search(key) for key in state)


@dataclass(frozen=True)
class Lacking:
    """A layout recognised only to name it in a refusal: a model this codebase does not have. `pattern`
    is a regular expression some key matches."""
    pattern: str
    what: str
    why_not: str

    def recognise(self, state, config):
        return any_key(state, self.pattern)


def declared_adapters(model):
    """The adapters `model` (an instance or its class) declares: its `checkpoint_adapters`, default none."""
    declared = tuple(getattr(model, "checkpoint_adapters", ()))
    wrong = [a for a in declared if not isinstance(a, CheckpointAdapter)]
    if wrong:
        owner = model if isinstance(model, type) else type(model)
        raise UserError(f"{owner.__module__}.Model.checkpoint_adapters holds {wrong[0]!r}, not a "
                        "utils.adapters.CheckpointAdapter: list adapter objects, e.g. (openltm.TIMER_XL,)")
    return declared


# ------------------------------------------------------------ files: .safetensors, Hugging Face folders
SAFETENSORS_NAME = "model.safetensors"


def safetensors_path(path):
    """The .safetensors file `path` names (itself, or a folder's model.safetensors), else None."""
    if os.path.isdir(path):
        inside = os.path.join(path, SAFETENSORS_NAME)
        if not os.path.isfile(inside):
            raise UserError(f"{path} is a folder without {SAFETENSORS_NAME} (or {LIGHTNING_NAME}): pass a checkpoint "
                            f"file, or a released model's folder ({SAFETENSORS_NAME} and config.json, or "
                            f"{LIGHTNING_NAME})")
        return inside
    return path if str(path).endswith(".safetensors") else None


# A PyTorch Lightning checkpoint, the form some releases come in (model.ckpt alone, its
# architecture in the file's hyper_parameters): read as {state_dict}, with {"hyper_parameters": ...} as config.
LIGHTNING_NAME = "model.ckpt"


def lightning_path(path):
    """The Lightning checkpoint `path` names (a .ckpt file, or a folder's model.ckpt when it holds no
    model.safetensors), else None."""
    if os.path.isdir(path):
        inside = os.path.join(path, LIGHTNING_NAME)
        has_safetensors = os.path.isfile(os.path.join(path, SAFETENSORS_NAME))
        return inside if os.path.isfile(inside) and not has_safetensors else None
    return path if str(path).endswith(".ckpt") else None


def read_lightning(path, map_location="cpu"):
    """(its state_dict, {"hyper_parameters": ...}) of a Lightning checkpoint; one line if it is not one."""
    import torch

    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for truncated / foreign files
        raise UserError(f"cannot read {path}: truncated, corrupt or not a PyTorch Lightning checkpoint "
                        f"({type(exc).__name__})") from None
    state, hyper = lightning_parts(checkpoint, path)
    return state, {"hyper_parameters": hyper}


def lightning_parts(checkpoint, path):
    """(state_dict, hyper_parameters) of a loaded Lightning checkpoint (read from `path`); one line if it lacks
    either."""
    missing = [k for k in ("state_dict", "hyper_parameters")
               if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get(k), dict)]
    if missing:
        raise UserError(f"{path} lacks {' and '.join(missing)}: not a whole Lightning checkpoint (a released "
                        "model's model.ckpt holds both)")
    return checkpoint["state_dict"], checkpoint["hyper_parameters"]


def read_safetensors(path, map_location="cpu"):
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise UserError(f"{path} is a safetensors file: pip install safetensors (or pip install -e \".[hf]\") "
                        "to read it") from None
    try:
        state = load_file(path, device="cpu")
    except Exception as exc:  # the library raises its own error types for a bad header
        raise UserError(f"cannot read {path}: not a valid safetensors file ({type(exc).__name__})") from None
    return {k: v.to(map_location) for k, v in state.items()}


def hf_config(path):
    """config.json beside a .safetensors file (a Hugging Face model folder), or {}."""
    config = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    try:
        with open(config) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def describe_config(config):
    """A few fields of a Hugging Face config.json, for messages."""
    shown = [f"{k} {config[k]}" for k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "input_token_len", "output_token_lens",
                                           "hidden_act") if k in config]
    return f" (config.json: {', '.join(shown)})" if shown else ""
