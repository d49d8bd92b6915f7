"""TimesFM 2.5's released checkpoint in and out: the folder google/timesfm-2.5-200m-pytorch (the timesfm
package's layout: model.safetensors holding the state_dict of its TimesFM_2p5_200M_torch_module, and the
config.json its PyTorchModelHubMixin writes, which holds no shapes), read into TimesFM25.py and
written back so that the package's TimesFM_2p5_200M_torch.from_pretrained(folder) reads it.

The key table is one prefix: our Model keeps the package's module as `timesfm`, so `timesfm.<key>` is the
release's `<key>` (tokenizer.*, stacked_xf.N.*, output_projection_point.*, output_projection_quantiles.*).
The shapes are read from the file itself (safetensors header, no tensor loaded), so a release of another size,
or a reduced test fixture, builds the model that fits it.

Nothing here imports the timesfm package: utils/checkpoint.py registers the adapter (export --to timesfm)
whether or not the package is installed."""
import json
import os
import re

from models.foundation.release import another_release, named, named_in, open_release, read_config_json
from utils.adapters import SAFETENSORS_NAME, CheckpointAdapter, any_key
from utils.errors import UserError

HUB_ID = "google/timesfm-2.5-200m-pytorch"
CONFIG_NAME = "config.json"
PREFIX = "timesfm."  # our Model's attribute holding the package's module (not "backbone.": OpenLTM's TTM)
# What the package's save_pretrained writes as config.json for a model built with torch_compile=False (the
# mixin records the constructor's arguments; the architecture is fixed in the package's code).
RELEASE_CONFIG = {"torch_compile": False}
# Keys whose shapes give the architecture, and the fixed sizes (timesfm_2p5_base.TimesFM_2p5_200M_Definition).
SHAPE_KEYS = ("tokenizer.hidden_layer.weight", "tokenizer.output_layer.weight", "stacked_xf.0.attn.query_ln.scale",
              "stacked_xf.0.ff0.weight", "output_projection_point.hidden_layer.weight",
              "output_projection_point.output_layer.weight", "output_projection_quantiles.hidden_layer.weight",
              "output_projection_quantiles.output_layer.weight")
LAYER = re.compile(r"^stacked_xf\.(\d+)\.")
RELEASE_SIGNATURE = r"^stacked_xf\.\d+\.attn\.qkv_proj\.weight$"
OURS_SIGNATURE = r"^timesfm\.stacked_xf\.\d+\.attn\.qkv_proj\.weight$"
WHAT = f"TimesFM 2.5's released checkpoint ({HUB_ID}, the timesfm package's layout)"


def _model_named(config):
    """What another model's config.json calls itself ('' for the timesfm package's own, which names none)."""
    names = [str(config[k]) for k in ("model_type",) if config.get(k)]
    names += [str(a) for a in config.get("architectures") or ()]
    return " / ".join(names)


def check_config(config, path):
    """A UserError when `config` (the folder's config.json) is another model's: the timesfm package's own
    names no architecture, transformers' TimesFM 2.5 (model_type timesfm2_5) is another layout."""
    named = _model_named(config)
    if not named:  # the package's names none; another release that names none either is known by its signature
        other = another_release(os.path.dirname(os.path.abspath(path)), "TimesFM25", "TimesFM 2.5")
        if other:
            raise UserError(other)
        return
    hint = (f"that is transformers' TimesFM 2.5 layout (google/timesfm-2.5-200m-transformers); TimesFM25 reads "
            f"the timesfm package's, {HUB_ID}" if "timesfm2_5" in named.lower() or "TimesFm2_5" in named
            else f"TimesFM25 reads {HUB_ID}'s folder")
    raise UserError(named_in(f"{path} is the config.json of {named}, not of TimesFM 2.5: {hint}", path, "TimesFM25"))


def read_release(folder):
    """(config.json, {key: shape} of model.safetensors) of a released TimesFM 2.5 folder, checked: a missing or
    partial folder, or another model's config, is one line naming what is wrong. The shapes are the safetensors
    header's alone, read where every release folder is opened (models.foundation.release.open_release)."""
    if not os.path.exists(folder):
        raise UserError(f"--pretrain_model_path {folder} not found: download {HUB_ID} (config.json and "
                        f"{SAFETENSORS_NAME}) and pass its folder")
    if not os.path.isdir(folder):
        raise UserError(f"--pretrain_model_path {folder} is a file: TimesFM25 reads the folder of {HUB_ID} "
                        f"(config.json and {SAFETENSORS_NAME})")
    absent = [name for name in (CONFIG_NAME, SAFETENSORS_NAME) if not os.path.isfile(os.path.join(folder, name))]
    if absent:
        other = another_release(folder, "TimesFM25", "TimesFM 2.5")  # another release's folder: say which
        if other:
            raise UserError(other)
        raise UserError(f"--pretrain_model_path {folder} lacks {' and '.join(absent)}: download the whole folder "
                        f"of {HUB_ID} (config.json and {SAFETENSORS_NAME})")
    config_path = os.path.join(folder, CONFIG_NAME)
    config = read_config_json(config_path, HUB_ID)
    check_config(config, config_path)
    return config, open_release(folder).shapes()


def architecture(shapes, where):
    """The sizes a release's state_dict (keys without our prefix) shows: model_dims, num_layers, num_heads,
    ff_dims, tokenizer_dims, point_dims, quantile_dims, and the output widths (checked by the model)."""
    absent = [key for key in SHAPE_KEYS if key not in shapes]
    if absent:
        shown = ", ".join(absent[:4]) + (f", ... ({len(absent)} in all)" if len(absent) > 4 else "")
        raise UserError(f"{where} lacks {shown}: not a complete TimesFM 2.5 checkpoint ({HUB_ID})")
    layers = {int(m.group(1)) for key in shapes for m in [LAYER.match(key)] if m}
    head_dim = shapes["stacked_xf.0.attn.query_ln.scale"][0]
    model_dims = shapes["tokenizer.output_layer.weight"][0]
    return {"model_dims": model_dims, "num_layers": max(layers) + 1, "num_heads": model_dims // head_dim,
            "ff_dims": shapes["stacked_xf.0.ff0.weight"][0], "tokenizer_dims": shapes["tokenizer.hidden_layer.weight"][0],
            "tokenizer_in": shapes["tokenizer.hidden_layer.weight"][1],
            "point_dims": shapes["output_projection_point.hidden_layer.weight"][0],
            "point_out": shapes["output_projection_point.output_layer.weight"][0],
            "quantile_dims": shapes["output_projection_quantiles.hidden_layer.weight"][0],
            "quantile_out": shapes["output_projection_quantiles.output_layer.weight"][0]}


def write_release(state, folder):
    """Write `state` (the release's keys) as the released folder: model.safetensors and config.json."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    tensors = {key: value.detach().cpu().contiguous() for key, value in state.items()}
    partial = os.path.join(folder, f".{SAFETENSORS_NAME}.partial")
    save_file(tensors, partial)
    os.replace(partial, os.path.join(folder, SAFETENSORS_NAME))
    with open(os.path.join(folder, CONFIG_NAME), "w") as f:
        json.dump(RELEASE_CONFIG, f, indent=2)


class TimesFMAdapter(CheckpointAdapter):
    """The timesfm package's TimesFM 2.5 checkpoint (model.safetensors of google/timesfm-2.5-200m-pytorch)."""
    model = "TimesFM25"
    what = WHAT
    export_format = "timesfm"
    writes_folder = True  # export writes the released folder (config.json + model.safetensors), not one file
    export_note = (f"the folder loads with timesfm.TimesFM_2p5_200M_torch.from_pretrained(folder), as {HUB_ID}; "
                   "a fine-tuned model of another size needs the package's module built at that size")

    def recognise(self, state, config):
        return "tokenizer.hidden_layer.weight" in state and any_key(state, RELEASE_SIGNATURE)

    def to_ours(self, state, config):
        check_config(config, CONFIG_NAME)
        return {PREFIX + key: value for key, value in state.items()}

    def holds_ours(self, state):
        return any_key(state, OURS_SIGNATURE)

    def from_ours(self, state):
        foreign = sorted(key for key in state if not key.startswith(PREFIX))
        if foreign:
            raise UserError(f"{len(foreign)} key(s) of this TimesFM25 have no place in {HUB_ID}'s layout: "
                            f"{', '.join(foreign[:6])}")
        return {key[len(PREFIX):]: value for key, value in state.items()}

    def write(self, state, folder):
        write_release(state, folder)

    def shape_args(self, state):
        shapes = {key[len(PREFIX):]: tuple(value.shape) for key, value in state.items() if key.startswith(PREFIX)}
        try:
            sizes = architecture(shapes, "the state")
        except UserError:
            return {}
        return {"d_model": sizes["model_dims"], "e_layers": sizes["num_layers"], "n_heads": sizes["num_heads"],
                "d_ff": sizes["ff_dims"]}


TIMESFM25 = TimesFMAdapter()
ADAPTERS = (TIMESFM25,)
# what a downloaded folder of this release (or a relative we lack) looks like, for models/foundation/release.py
SIGNATURES = (("transformers' TimesFM 2.5 (google/timesfm-2.5-200m-transformers), another layout than the "
               "timesfm package's, which --model TimesFM25 reads", None,
               lambda files, config: named(config, "timesfm2_5", "TimesFm2_5ModelForPrediction")),
              ("TimesFM 2.5's release (google/timesfm-2.5-200m-pytorch)", "TimesFM25",
               lambda files, config: "torch_compile" in config and not config.get("architectures")
               and not config.get("model_type")))

# The largest released checkpoint's shape as run.py's size arguments, for benchmarks/memory_table.py (which builds
# it on the meta device and counts its parameters): (checkpoint, arguments, published size, where they come from).
LARGEST_SHAPES = ((HUB_ID, {"d_model": 1280, "d_ff": 1280, "e_layers": 20, "n_heads": 16}, "200M (by name)",
                   "timesfm's TimesFM_2p5_200M_Definition: model dims 1280, 20 layers, 16 heads, ff 1280"),)
