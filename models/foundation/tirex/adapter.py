"""NX-AI's TiRex release in and out: the folder a user downloads from the Hugging Face hub (NX-AI/TiRex),
read for TiRex.py, and written back by `python -m exp.export export --to tirex`.

What the release is (tirex-ts 1.4.2, tirex/base.py `PretrainedModel.from_pretrained`): ONE file, `model.ckpt`,
a PyTorch Lightning checkpoint read with `torch.load(..., weights_only=True)`; its `hyper_parameters` hold
the architecture (`model_config`: input/output patch size 32, the quantiles 0.1 ... 0.9, `block_kwargs`
embedding_dim 512, num_blocks 12, num_heads 4; input_ff_dim 2048; and `train_ctx_len` 2048), its
`state_dict` the weights, named as tirex.models.tirex.TiRexZero names them once the prefix `block_stack.` is
dropped (the package's own `on_load_checkpoint` drops it). There is no config.json and no safetensors file.

Our layout: TiRex.py holds the package's TiRexZero as `tirex`, so ours is the release's key with
`tirex.` in front, plus one buffer, `train_ctx_len` (the context the model reads, which the state_dict alone
does not show and an export must write back)."""
import os

import torch

from models.foundation.release import another_release, config_in, open_release, release_of
from utils.adapters import LIGHTNING_NAME, SAFETENSORS_NAME, CheckpointAdapter, any_key
from utils.errors import UserError

HUB_ID = "NX-AI/TiRex"
RELEASED_FILE = "model.ckpt"  # what tirex.load_model downloads: the whole release
# The released configuration (model.ckpt's hyper_parameters; 35,291,200 parameters): the sizes a model
# built without a folder takes from --d_model / --n_heads / --e_layers / --d_ff, and the rest it keeps.
RELEASED = {"patch_size": 32, "train_ctx_len": 2048, "quantiles": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
            "embedding_dim": 512, "num_heads": 4, "num_blocks": 12, "input_ff_dim": 2048}
PREFIX = "tirex."
CONTEXT_KEY = "train_ctx_len"  # our buffer: the context length, which the package keeps in its config
SIGNATURE = r"blocks\.\d+\.slstm_layer\.slstm_cell\._recurrent_kernel_$"  # a key only an sLSTM stack has


def released_file(path):
    """The model.ckpt that `path` (a downloaded folder, or the file itself) names; a one-line UserError for a
    folder that is not there or holds no model.ckpt, naming what it holds instead."""
    if not os.path.exists(path):
        raise UserError(f"--pretrain_model_path {path} not found: download TiRex's release ({HUB_ID}: "
                        f"huggingface-cli download {HUB_ID} --local-dir DIR) and pass DIR")
    if not os.path.isdir(path):
        return path
    inside = os.path.join(path, RELEASED_FILE)
    if os.path.isfile(inside):
        other = another_release(path, "TiRex")  # a model.ckpt of another release's layout (TiRex-2's older one)
        if other:
            raise UserError(other)
        return inside
    held = sorted(os.listdir(path))
    other = (" (config.json + model.safetensors: another model's Hugging Face release" + _model_type(path) + ")"
             if "config.json" in held else "")
    release = release_of(path)  # another release's whole folder: say which, and which --model reads it
    advice = (f"; the folder is {release[0]}" + (f": load it with --model {release[1]}" if release[1] else "")
              if release else ": download the whole release into it")
    raise UserError(f"{path} has no {RELEASED_FILE}, the file TiRex is released as ({HUB_ID}); it holds "
                    f"{', '.join(held[:6]) or 'nothing'}{other}{advice}")


def _model_type(folder):
    config = config_in(folder)
    names = [str(config[k]) for k in ("model_type", "architectures") if k in config]
    return f", {' / '.join(names)}" if names else ""


def read_release(path):
    """(state_dict, hyper_parameters) of a TiRex release, opened where every release folder is
    (models.foundation.release.open_release: read once for the sizes and the weights); one line for a file that
    is not one."""
    file = released_file(path)
    try:
        checkpoint = open_release(file).loaded()
    except Exception as exc:  # torch raises many types for truncated / foreign files
        raise UserError(f"cannot read {file}: not a PyTorch Lightning checkpoint ({type(exc).__name__}); "
                        f"download {HUB_ID} again") from None
    if not isinstance(checkpoint, dict):
        raise UserError(f"{file} is not a Lightning checkpoint (a dict with state_dict and hyper_parameters)")
    missing = [k for k in ("state_dict", "hyper_parameters") if not isinstance(checkpoint.get(k), dict)]
    if missing:
        raise UserError(f"{file} lacks {' and '.join(missing)}: a partial or foreign checkpoint, not TiRex's "
                        f"release ({HUB_ID})")
    return checkpoint["state_dict"], checkpoint["hyper_parameters"]


def architecture(hyper, where):
    """The sizes a TiRex release's hyper_parameters give: {patch_size, train_ctx_len, quantiles,
    embedding_dim, num_heads, num_blocks, input_ff_dim, block_kwargs}; one line naming what is not TiRex's."""
    config = hyper.get("model_config")
    blocks = config.get("block_kwargs") if isinstance(config, dict) else None
    needed = ("input_patch_size", "output_patch_size", "quantiles", "input_ff_dim")
    if not isinstance(blocks, dict) or any(k not in config for k in needed) or "train_ctx_len" not in hyper:
        keys = ", ".join(sorted(hyper)[:6]) or "none"
        raise UserError(f"{where}: its hyper_parameters ({keys}) are not a TiRex configuration (model_config with "
                        f"block_kwargs, {', '.join(needed)}, and train_ctx_len): a checkpoint of another model")
    lacking = [k for k in ("embedding_dim", "num_heads", "num_blocks") if k not in blocks]
    if lacking:
        raise UserError(f"{where}: model_config.block_kwargs lacks {', '.join(lacking)}")
    return {"patch_size": int(config["input_patch_size"]), "output_patch_size": int(config["output_patch_size"]),
            "train_ctx_len": int(hyper["train_ctx_len"]), "quantiles": tuple(float(q) for q in config["quantiles"]),
            "embedding_dim": int(blocks["embedding_dim"]), "num_heads": int(blocks["num_heads"]),
            "num_blocks": int(blocks["num_blocks"]), "input_ff_dim": int(config["input_ff_dim"]),
            "block_kwargs": dict(blocks)}


def release_state_to_ours(state, train_ctx_len):
    """A release's state_dict in our layout: `block_stack.` dropped as the package drops it, `tirex.` added."""
    out = {PREFIX + key.replace("block_stack.", ""): value for key, value in state.items()}
    out[CONTEXT_KEY] = torch.tensor(train_ctx_len)
    return out


def hyper_parameters_of(state):
    """model.ckpt's hyper_parameters for one of our TiRex state_dicts, read off its shapes (and its
    train_ctx_len buffer); what the package reads back to build TiRexZero."""
    blocks = {int(k.split(".")[2]) for k in state if k.startswith(PREFIX + "blocks.")}
    kernel = state[PREFIX + "blocks.0.slstm_layer.slstm_cell._recurrent_kernel_"]  # [heads, head_dim, 4 head_dim]
    hidden = state[PREFIX + "input_patch_embedding.hidden_layer.weight"]  # [input_ff_dim, 2 patch]
    patch = hidden.shape[1] // 2
    n_quantiles = state[PREFIX + "output_patch_embedding.output_layer.weight"].shape[0] // patch
    if n_quantiles != len(RELEASED["quantiles"]):
        raise UserError(f"this TiRex forecasts {n_quantiles} quantiles a step; the release's format names its "
                        f"levels only for the 9 it was trained on ({RELEASED['quantiles']})")
    embedding_dim = kernel.shape[0] * kernel.shape[1]
    model_config = {"input_patch_size": patch, "output_patch_size": patch, "quantiles": list(RELEASED["quantiles"]),
                    "block_kwargs": {"embedding_dim": embedding_dim, "num_heads": kernel.shape[0],
                                     "num_blocks": max(blocks) + 1},
                    "input_ff_dim": hidden.shape[0]}
    return {"model_config": model_config, "train_ctx_len": int(state[CONTEXT_KEY])}


class TiRexAdapter(CheckpointAdapter):
    """NX-AI's model.ckpt (tirex-ts's TiRexZero) read into TiRex.py and written back."""
    model = "TiRex"
    what = f"NX-AI's TiRex release ({HUB_ID}, {RELEASED_FILE})"
    export_format = "tirex"
    export_note = (f"DST/{RELEASED_FILE}, the Lightning checkpoint {HUB_ID} ships; tirex.load_model reads it from a "
                   "local path whose second component is TiRex (e.g. NX-AI/TiRex/model.ckpt, relative)")
    writes_folder = True  # utils.checkpoint.export writes the release's folder: DST/model.ckpt

    def recognise(self, state, config):
        return any_key(state, "^(block_stack\\.)?" + SIGNATURE) or "hyper_parameters" in config

    def to_ours(self, state, config):
        hyper = config.get("hyper_parameters")
        if not isinstance(hyper, dict):
            raise UserError(f"no hyper_parameters beside the weights: pass the release folder ({RELEASED_FILE})")
        shape = architecture(hyper, RELEASED_FILE)
        return release_state_to_ours(state, shape["train_ctx_len"])

    def holds_ours(self, state):
        return CONTEXT_KEY in state and any_key(state, "^" + PREFIX.replace(".", "\\.") + SIGNATURE)

    def from_ours(self, state):
        weights = {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX)}
        return {"state_dict": weights, "hyper_parameters": hyper_parameters_of(state)}

    def write(self, checkpoint, folder):
        """Write `checkpoint` (from_ours) as the release's folder: folder/model.ckpt, atomically."""
        from utils.files import atomic_write

        os.makedirs(folder, exist_ok=True)
        atomic_write(os.path.join(folder, RELEASED_FILE), lambda f: torch.save(checkpoint, f))

    def shape_args(self, state):
        if not self.holds_ours(state):
            return {}
        hyper = hyper_parameters_of(state)
        blocks = hyper["model_config"]["block_kwargs"]
        return {"d_model": blocks["embedding_dim"], "n_heads": blocks["num_heads"], "e_layers": blocks["num_blocks"],
                "d_ff": hyper["model_config"]["input_ff_dim"], "train_ctx_len": hyper["train_ctx_len"]}


TIREX = TiRexAdapter()
ADAPTERS = (TIREX,)  # `python -m exp.export export --to tirex`
# what a downloaded folder of this release (or a relative we lack) looks like, for models/foundation/release.py
SIGNATURES = (("TiRex's release (NX-AI/TiRex: model.ckpt, a Lightning checkpoint)", "TiRex",
               lambda files, config: LIGHTNING_NAME in files and SAFETENSORS_NAME not in files
               and "model-config.yaml" not in files),)  # that YAML beside it: TiRex-2's older layout

# The largest released checkpoint's shape as run.py's size arguments, for benchmarks/memory_table.py (which builds
# it on the meta device and counts its parameters): (checkpoint, arguments, published size, where they come from).
LARGEST_SHAPES = ((HUB_ID, {"d_model": RELEASED["embedding_dim"], "d_ff": RELEASED["input_ff_dim"],
                            "e_layers": RELEASED["num_blocks"], "n_heads": RELEASED["num_heads"]},
                   "35M", "model.ckpt hyper_parameters: embedding_dim 512, 12 sLSTM blocks, 4 heads, input_ff_dim 2048"),)
