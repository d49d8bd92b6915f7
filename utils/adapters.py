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
the form in which released foundation models come."""
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
                            f"file, or a released model's folder ({SAFETENSORS_NAME} and config.json; TiRex: "
                            f"{LIGHTNING_NAME})")
        return inside
    return path if str(path).endswith(".safetensors") else None


# A PyTorch Lightning checkpoint, the form TiRex is released in (NX-AI/TiRex: model.ckpt alone, its
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
    missing = [k for k in ("state_dict", "hyper_parameters")
               if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get(k), dict)]
    if missing:
        raise UserError(f"{path} lacks {' and '.join(missing)}: not a whole Lightning checkpoint (a released "
                        "model's model.ckpt holds both)")
    return checkpoint["state_dict"], {"hyper_parameters": checkpoint["hyper_parameters"]}


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


def read_config_json(path, what):
    """The JSON object in a released folder's config.json at `path`, or one line saying it is none: `what` names
    the release it should be (for instance "amazon/chronos-2")."""
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path} ({type(exc).__name__}: {exc}): not the config.json of {what}") from None
    if not isinstance(config, dict):
        raise UserError(f"{path} is not a JSON object: not the config.json of {what}")
    return config


# ------------------------------------------------------------ what a downloaded folder is
# Each release's folder signature: (what it is, the --model that reads it or None, test on (file names, config)).
# The config is the folder's config.json as a dict ({} where there is none or it is unreadable).
def _named(config, *names):
    """Whether the config's model_type or one of its architectures is one of `names`."""
    architectures = config.get("architectures")
    listed = architectures if isinstance(architectures, list) else []
    said = {str(config.get("model_type"))} | {str(a) for a in listed}
    return bool(said & set(names))


RELEASE_SIGNATURES = (
    ("TiRex's release (NX-AI/TiRex: model.ckpt, a Lightning checkpoint)", "TiRex",
     lambda files, config: LIGHTNING_NAME in files and SAFETENSORS_NAME not in files),
    ("a Chronos-Bolt release (amazon/chronos-bolt-*)", "ChronosBolt",
     lambda files, config: _named(config, "ChronosBoltModelForForecasting")),
    ("Chronos-2's release (amazon/chronos-2)", "Chronos2", lambda files, config: _named(config, "Chronos2Model")),
    ("the original, tokenized Chronos (amazon/chronos-t5-*), which this codebase has no model for", None,
     lambda files, config: _named(config, "T5ForConditionalGeneration")),
    ("Timer's release (thuml/timer-base-84m)", "TimerBase",
     lambda files, config: _named(config, "timer", "TimerForPrediction")),
    ("Sundial's release (thuml/sundial-base-128m)", "Sundial",
     lambda files, config: _named(config, "sundial", "SundialForPrediction")),
    ("a Time-MoE release (Maple728/TimeMoE-50M / -200M)", "TimeMoE",
     lambda files, config: _named(config, "time_moe", "TimeMoeForPrediction")),
    ("transformers' TimesFM 2.5 (google/timesfm-2.5-200m-transformers), another layout than the timesfm "
     "package's, which --model TimesFM25 reads", None,
     lambda files, config: _named(config, "timesfm2_5", "TimesFm2_5ModelForPrediction")),
    ("TimesFM 2.5's release (google/timesfm-2.5-200m-pytorch)", "TimesFM25",
     lambda files, config: "torch_compile" in config and not config.get("architectures")
     and not config.get("model_type")),
    ("a Moirai 2.0 release (Salesforce/moirai-2.0-R-*)", "Moirai2",
     lambda files, config: "num_predict_token" in config and "patch_size" in config
     and not config.get("model_type")),
    ("a Moirai 1.x or Moirai-MoE release (uni2ts), which this codebase has no model for", None,
     lambda files, config: "patch_sizes" in config or "distr_output" in config),
)


def release_of(folder):
    """(what the folder `folder` is, the --model that reads it or None) by its release's signature (its files,
    its config.json), or None where it matches none (a partial folder, someone else's files)."""
    try:
        files = set(os.listdir(folder))
    except OSError:
        return None
    config = {}
    if "config.json" in files:
        try:
            with open(os.path.join(folder, "config.json")) as f:
                config = json.load(f)
        except (OSError, ValueError):
            config = {}
        config = config if isinstance(config, dict) else {}
    for what, model, matches in RELEASE_SIGNATURES:
        if matches(files, config):
            return what, model
    return None


def another_release(path, model, release=None):
    """The one line to raise where `path` (a folder, or a file in one) is another release than the one --model
    `model` reads (`release`, its name in words, default `model`): what it is and which --model reads it; None
    where it is `model`'s or nothing known."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    found = release_of(folder)
    if found is None or found[1] == model:
        return None
    what, reads = found
    return (f"--pretrain_model_path {path} is {what}, not a {release or model} folder: "
            + (f"load it with --model {reads}" if reads else f"--model {model} cannot read it"))


def named_in(message, where, model):
    """`message` (a refusal of the config.json at `where` as another model's), with what that folder is where
    its release's signature says and the message does not already: "(the folder is Chronos-2's release ...:
    load it with --model Chronos2)"."""
    folder = os.path.dirname(os.path.abspath(str(where)))
    found = release_of(folder) if os.path.isdir(folder) else None
    if found is None or found[1] == model or (found[1] and f"--model {found[1]}" in message):
        return message
    return message + f" (the folder is {found[0]}" + (f": load it with --model {found[1]})" if found[1] else ")")


def release_config_path(path, model, hub, model_name=None):
    """The config.json of the released folder `path` names (the folder, or its model.safetensors); None for any
    other file (a checkpoint of ours, whose shapes come from the model arguments). One line for a path that is
    not there, a folder lacking either file (naming another release's folder as what it is: `model_name`, the
    --model reading this release, default `model`), or a model.safetensors without config.json beside it:
    `model` names the release ("Sundial"), `hub` where it is downloaded ("thuml/sundial-base-128m")."""
    model_name = model_name or model
    if not os.path.exists(path):
        raise UserError(f"--pretrain_model_path {path} not found; pass the folder downloaded from the Hugging Face "
                        f"hub ({hub}: config.json and {SAFETENSORS_NAME})")
    if os.path.isdir(path):
        folder = path
        lacking = [name for name in ("config.json", SAFETENSORS_NAME) if not os.path.isfile(os.path.join(path, name))]
        if lacking:
            other = another_release(path, model_name, model)
            if other:  # not a partial folder of this release: another release's whole one (TiRex's model.ckpt)
                raise UserError(other)
            raise UserError(f"--pretrain_model_path {path} is a partial {model} folder: {' and '.join(lacking)} "
                            f"missing; download both files of the release ({hub})")
    elif str(path).endswith(".safetensors"):
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isfile(os.path.join(folder, "config.json")):
            raise UserError(f"--pretrain_model_path {path}: config.json missing beside it; {model}'s sizes are in "
                            "the config.json of the release")
    else:
        return None
    return os.path.join(folder, "config.json")


def describe_config(config):
    """A few fields of a Hugging Face config.json, for messages."""
    shown = [f"{k} {config[k]}" for k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "input_token_len", "output_token_lens",
                                           "hidden_act") if k in config]
    return f" (config.json: {', '.join(shown)})" if shown else ""
