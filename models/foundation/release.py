"""Opening a downloaded release folder, the one place that reads one: open_release(path) is the folder (or its
weights file) opened once, with which release it is (by the signatures the release folders declare: their
adapter.py's SIGNATURES, collected by models.foundation.release_signatures), its config, its weights file, the
shapes in that file and its state dict, read once and handed over. A model's constructor takes its sizes from it
and the checkpoint layer (utils.checkpoint, handed open_release from exp/) its weights; config.json is read in
one line or refused in one, and a folder of another release given to a model is named for what it is."""
import json
import os

from models.foundation import release_signatures
from utils import adapters
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


def config_in(folder):
    """The config.json in `folder` as a dict, {} where there is none or it is unreadable or no object: what a
    folder says it is, for naming it (a model's sizes come from read_config_json, which refuses such a file)."""
    try:
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def release_of(folder):
    """(what the folder `folder` is, the --model that reads it or None) by its release's signature (its files,
    its config.json), or None where it matches none (a partial folder, someone else's files)."""
    try:
        files = set(os.listdir(folder))
    except OSError:
        return None
    config = config_in(folder) if "config.json" in files else {}
    for what, model, matches in release_signatures():
        if matches(files, config):
            return what, model
    return None


def config_of_release(config):
    """What the config.json `config` (a dict) is by the release signatures, for a refusal of it as another
    model's: "<what>: --model <Name>", "<what>" for a relative this codebase has no model for, or None."""
    for what, model, matches in release_signatures():
        if matches({"config.json", SAFETENSORS_NAME}, config):
            return f"{what}: --model {model}" if model else what
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


# ------------------------------------------------------------ a release folder, opened
class Release:
    """A release folder (or its weights file) opened: `path` as given, `file` its weights file (model.safetensors,
    or model.ckpt for a Lightning release), `folder` the folder holding it. What is read is read once: the weights
    (loaded() as the file holds them; state() the model state, handed over and then forgotten), the config
    (config.json beside model.safetensors, or a Lightning file's hyper_parameters) and the shapes in the file."""

    def __init__(self, path, file, lightning):
        self.path, self.file, self.lightning = path, file, lightning
        self.folder = os.path.dirname(os.path.abspath(file))
        self._loaded = None

    @property
    def signature(self):
        """(what the folder is, the --model reading it or None) by its release's signature, or None."""
        return release_of(self.folder)

    def loaded(self):
        """The file's contents as its reader returns them (a Lightning file: its whole dict, unchecked; a
        safetensors file: its tensors), read on the first call; a reader's own exception is raised as it is,
        for the release's adapter to name in its own words."""
        if self._loaded is None:
            if self.lightning:
                import torch

                try:  # memory-mapped: a model that read its sizes here (and a rank that never loads) holds no weights
                    self._loaded = torch.load(self.file, map_location="cpu", weights_only=True, mmap=True)
                except Exception:  # a file torch cannot map (its legacy format) is read whole, or refused so
                    self._loaded = torch.load(self.file, map_location="cpu", weights_only=True)
            else:
                self._loaded = adapters.read_safetensors(self.file)
        return self._loaded

    @property
    def config(self):
        """config.json beside model.safetensors ({} where none or unreadable), or {"hyper_parameters": ...} of a
        Lightning release (one line where the file is no Lightning checkpoint)."""
        if not self.lightning:
            return adapters.hf_config(self.file)
        return {"hyper_parameters": self._lightning_parts()[1]}

    def _lightning_parts(self):
        try:
            checkpoint = self.loaded()
        except Exception as exc:  # torch raises many types for truncated / foreign files
            raise UserError(f"cannot read {self.file}: truncated, corrupt or not a PyTorch Lightning checkpoint "
                            f"({type(exc).__name__})") from None
        return adapters.lightning_parts(checkpoint, self.file)

    def shapes(self):
        """{key: shape} of the weights file, from a safetensors file's header alone (no tensor read)."""
        if self.lightning:
            return {key: tuple(value.shape) for key, value in self._lightning_parts()[0].items()}
        try:
            from safetensors import safe_open

            with safe_open(self.file, framework="pt") as f:
                return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
        except Exception as exc:  # the library raises its own types for a bad header
            raise UserError(f"cannot read {self.file}: not a valid safetensors file ({type(exc).__name__})") from None

    def state(self, map_location="cpu"):
        """(the state dict, the config) for the checkpoint layer: the weights read once (by a constructor that
        took its sizes from them, or now), handed over and then forgotten here."""
        if self.lightning:
            state, hyper = self._lightning_parts()
            config = {"hyper_parameters": hyper}
        else:
            state, config = self.loaded(), self.config
        _forget(self)
        self._loaded = None
        return {key: value.to(map_location) for key, value in state.items()}, config


# The release opened last, kept until its weights are handed over: a constructor that read them for its sizes
# (a Lightning release's hyper_parameters) and the load after it read the file once. Keyed by the file's
# identity, so a file replaced in between is read again.
_opened = {}


def _identity(file):
    stat = os.stat(file)
    return os.path.realpath(file), stat.st_mtime_ns, stat.st_size


def _forget(release):
    if _opened.get("release") is release:
        _opened.clear()


def open_release(path):
    """The Release `path` names (a folder of model.safetensors + config.json or of model.ckpt, or such a file),
    or None where it names no release (a .pth of ours, a path that is not there). A folder holding neither
    weights file is one line (utils.adapters.safetensors_path's)."""
    if not os.path.exists(path):
        return None
    file = adapters.lightning_path(path)
    lightning = file is not None
    file = file if lightning else adapters.safetensors_path(path)
    if file is None or not os.path.isfile(file):
        return None
    key = _identity(file)
    if _opened.get("key") != key:
        _opened.clear()
        _opened.update(key=key, release=Release(path, file, lightning))
    release = _opened["release"]
    release.path = path
    return release
