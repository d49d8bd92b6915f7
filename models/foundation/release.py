"""Opening a downloaded release folder: its config.json read in one line or refused in one, and what a folder is
(which release, read by which --model) from the signatures the release folders declare (their adapter.py's
SIGNATURES, collected by models.foundation.release_signatures), so a folder of another release given to a model
is named for what it is."""
import json
import os

from models.foundation import release_signatures
from utils.adapters import SAFETENSORS_NAME
from utils.errors import UserError


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
# Each release folder's adapter.py declares SIGNATURES: (what a downloaded folder is, the --model that reads it or
# None for a relative this codebase has no model for, test on (file names, config)). The config is the folder's
# config.json as a dict ({} where there is none or it is unreadable).
def named(config, *names):
    """Whether the config's model_type or one of its architectures is one of `names`."""
    architectures = config.get("architectures")
    listed = architectures if isinstance(architectures, list) else []
    said = {str(config.get("model_type"))} | {str(a) for a in listed}
    return bool(said & set(names))


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
    for what, model, matches in release_signatures():
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
    its release's signature says and the message does not already: "(the folder is <what>: load it with
    --model <Name>)"."""
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
    `model` names the release, `hub` where it is downloaded (its hub id)."""
    model_name = model_name or model
    if not os.path.exists(path):
        raise UserError(f"--pretrain_model_path {path} not found; pass the folder downloaded from the Hugging Face "
                        f"hub ({hub}: config.json and {SAFETENSORS_NAME})")
    if os.path.isdir(path):
        folder = path
        lacking = [name for name in ("config.json", SAFETENSORS_NAME) if not os.path.isfile(os.path.join(path, name))]
        if lacking:
            other = another_release(path, model_name, model)
            if other:  # not a partial folder of this release: another release's whole one
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
