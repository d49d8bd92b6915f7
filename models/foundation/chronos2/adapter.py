"""Chronos-2 as released (Hugging Face amazon/chronos-2: config.json + model.safetensors, written by
chronos-forecasting's Chronos2Model.save_pretrained) in and out of Chronos2.py.

Our model holds the package's Chronos2Model under `chronos.`, so the released keys are ours without that
prefix, one for one (encoder.block.N.layer.{0: time attention, 1: group attention, 2: feed-forward}, ...).
Two buffers of ours travel with the weights: `config_json`, the folder's config.json (its Chronos2CoreConfig
fields and chronos_config but max_output_patches) as UTF-8 bytes, and `max_output_patches`. The heads and
their width are not visible in the weights (q is [heads * d_kv, d_model]), so a checkpoint.pth of ours carries
its config to `python -m exp.export export --to chronos2 SRC DST`, which writes the released folder. The
package's quantile levels and rotary frequencies are non-persistent buffers: no keys.

The config facts of amazon/chronos-2 (RELEASED) are the package's defaults where the package has one and the
hub's config.json where it does not (chronos_config has no default in chronos.chronos2.config)."""
import json
import os

import torch

from models.foundation.release import another_release, named, named_in, read_config_json
from utils.adapters import SAFETENSORS_NAME, CheckpointAdapter, any_key
from utils.errors import UserError

HUB_ID = "amazon/chronos-2"
ARCHITECTURE = "Chronos2Model"  # config.json "architectures" of amazon/chronos-2 (and of save_pretrained here)
PREFIX = "chronos."  # where models/foundation/chronos2/Chronos2.py keeps the package's Chronos2Model

# amazon/chronos-2 config.json (120 M parameters): the encoder, then chronos_config
RELEASED_CORE = dict(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12, dropout_rate=0.1,
                     layer_norm_epsilon=1e-6, initializer_factor=0.05, feed_forward_proj="relu", rope_theta=10000.0)
RELEASED_QUANTILES = (0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75,
                      0.8, 0.85, 0.9, 0.95, 0.99)
RELEASED_FORECASTING = dict(context_length=8192, input_patch_size=16, input_patch_stride=16, output_patch_size=16,
                            max_output_patches=64, quantiles=list(RELEASED_QUANTILES), use_reg_token=True,
                            use_arcsinh=True, time_encoding_scale=8192)
# The fields of Chronos2CoreConfig a folder's config.json sets (the rest are transformers' bookkeeping).
CORE_FIELDS = (*RELEASED_CORE, "vocab_size", "pad_token_id", "reg_token_id")

# A key only Chronos-2 has: the group attention (layer 1 of every encoder block, over the batch axis).
GROUP_ATTENTION = r"^encoder\.block\.\d+\.layer\.1\.self_attention\.q\.weight$"
OURS = r"^chronos\.encoder\.block\.\d+\.layer\.1\.self_attention\.q\.weight$"
# LoRA (exp.lora): the group attention's projections see [time, series, d], the samples in the second dimension,
# where the adapters' dropout cannot follow the sample; they are left out of the default targets.
LORA_TIME_FIRST = ("*.layer.1.self_attention.*",)
CONFIG_BUFFER = "config_json"
PATCHES_BUFFER = "max_output_patches"


def folder_of(path):
    """The Hugging Face folder `path` names: itself, or the folder of its model.safetensors."""
    return path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))


def read_release_config(path):
    """config.json of the released folder `path` (or of the folder of `path`'s model.safetensors), checked to be
    Chronos-2's; one line naming what is missing or what the folder holds instead."""
    require_path = f"--pretrain_model_path {path}"
    if not os.path.exists(path):
        raise UserError(f"{require_path} not found: download {HUB_ID} (config.json and {SAFETENSORS_NAME}) and "
                        "pass its folder")
    folder = folder_of(path)
    config_file = os.path.join(folder, "config.json")
    missing = not (os.path.isfile(config_file) and os.path.isfile(os.path.join(folder, SAFETENSORS_NAME)))
    other = another_release(folder, "Chronos2", "Chronos-2") if missing else None
    if other:  # another release's whole folder (a model.ckpt alone), not a partial one of Chronos-2
        raise UserError(other)
    if not os.path.isfile(config_file):
        raise UserError(f"{require_path} has no config.json: the folder of {HUB_ID} holds config.json and "
                        f"{SAFETENSORS_NAME}; download both")
    if not os.path.isfile(os.path.join(folder, SAFETENSORS_NAME)):
        raise UserError(f"{require_path} has no {SAFETENSORS_NAME}: the folder of {HUB_ID} holds config.json and "
                        f"{SAFETENSORS_NAME}; download both")
    config = read_config_json(config_file, HUB_ID)
    check_release_config(config, config_file)
    return config


def check_release_config(config, where):
    """One line unless `config` (a config.json's content) is Chronos-2's: its architectures and chronos_config."""
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not isinstance(config, dict) or ARCHITECTURE not in (architectures or ()):
        shown = (f"architectures {architectures}" if architectures else "no architectures") + \
                (f", model_type {config.get('model_type')}" if isinstance(config, dict) and "model_type" in config else "")
        raise UserError(named_in(f"{where} is the config of another model ({shown}), not Chronos-2's "
                                 f"(architectures ['{ARCHITECTURE}'], {HUB_ID}): --model Chronos2 reads {HUB_ID}'s "
                                 "folder", where, "Chronos2"))
    chronos = config.get("chronos_config")
    missing = [k for k in ("context_length", "input_patch_size", "input_patch_stride", "output_patch_size", "quantiles")
               if not isinstance(chronos, dict) or k not in chronos]
    if missing:
        raise UserError(f"{where} lacks chronos_config.{', chronos_config.'.join(missing)}: not a complete "
                        f"config.json of {HUB_ID}")


def core_config_dict(config):
    """What of a config.json the model is built from: the encoder's fields and chronos_config, defaults filled in
    as Chronos2CoreConfig and Chronos2Model fill them."""
    core = {k: config[k] for k in CORE_FIELDS if k in config}
    chronos = dict(config["chronos_config"])
    chronos.setdefault("time_encoding_scale", chronos["context_length"])  # Chronos2Model.__init__ does the same
    chronos.setdefault("max_output_patches", 1)  # Chronos2ForecastingConfig's default
    return {**core, "chronos_config": chronos}


def config_buffers(config):
    """Our two buffers for a core_config_dict: its canonical UTF-8 JSON but max_output_patches, and
    max_output_patches apart (a training run raises it to its horizon's patches, as Chronos2Pipeline.fit: a
    buffer of fixed shape, so that a file with another value still loads)."""
    chronos = {k: v for k, v in config["chronos_config"].items() if k != "max_output_patches"}
    text = json.dumps({**config, "chronos_config": chronos}, sort_keys=True)
    return {CONFIG_BUFFER: torch.tensor(list(text.encode()), dtype=torch.uint8),
            PATCHES_BUFFER: torch.tensor([config["chronos_config"]["max_output_patches"]], dtype=torch.int64)}


def config_of_buffers(state):
    """The core_config_dict that our buffers in `state` hold."""
    config = json.loads(bytes(state[CONFIG_BUFFER].tolist()).decode())
    config["chronos_config"]["max_output_patches"] = int(state[PATCHES_BUFFER][0])
    return config


class Chronos2Adapter(CheckpointAdapter):
    """amazon/chronos-2 (model.safetensors + config.json) read into Chronos2.py and written back."""
    model = "Chronos2"
    what = f"Chronos-2 as released ({HUB_ID}: chronos-forecasting's Chronos2Model, config.json + {SAFETENSORS_NAME})"
    export_format = "chronos2"
    export_note = (f"a folder of config.json and {SAFETENSORS_NAME} that chronos.Chronos2Pipeline.from_pretrained "
                   "reads")
    writes_folder = True  # utils.checkpoint.export writes config.json + model.safetensors into DST

    def recognise(self, state, config):
        return ARCHITECTURE in (config.get("architectures") or []) or (
            any_key(state, GROUP_ATTENTION) and "input_patch_embedding.residual_layer.weight" in state)

    def to_ours(self, state, config):
        if not config:
            raise UserError(f"no config.json beside the weights: {HUB_ID}'s folder holds config.json and "
                            f"{SAFETENSORS_NAME}")
        check_release_config(config, "its config.json")
        return {**{PREFIX + key: value for key, value in state.items()},
                **config_buffers(core_config_dict(config))}

    def holds_ours(self, state):
        return any_key(state, OURS) and CONFIG_BUFFER in state

    def from_ours(self, state):
        """(the package's state_dict, its config.json) of one of our Chronos2 state_dicts."""
        unmapped = sorted(k for k in state if not k.startswith(PREFIX) and k not in (CONFIG_BUFFER, PATCHES_BUFFER))
        if unmapped:
            raise UserError(f"{len(unmapped)} key(s) have no place in {HUB_ID}'s layout: {', '.join(unmapped[:6])}")
        weights = {key[len(PREFIX):]: value.detach().cpu().contiguous() for key, value in state.items()
                   if key.startswith(PREFIX)}
        config = config_of_buffers(state)
        return weights, {"architectures": [ARCHITECTURE], "model_type": "t5",
                         "chronos_pipeline_class": "Chronos2Pipeline", **config}

    def write(self, out, folder):
        """Write from_ours' (weights, config.json) as the released folder: model.safetensors and config.json."""
        from safetensors.torch import save_file

        weights, config = out
        os.makedirs(folder, exist_ok=True)
        partial = os.path.join(folder, f".{SAFETENSORS_NAME}.partial")
        save_file(weights, partial, metadata={"format": "pt"})
        os.replace(partial, os.path.join(folder, SAFETENSORS_NAME))
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")

    def shape_args(self, state):
        if CONFIG_BUFFER not in state:
            return {}
        config = config_of_buffers(state)
        return {"d_model": config.get("d_model"), "n_heads": config.get("num_heads"),
                "e_layers": config.get("num_layers"), "d_ff": config.get("d_ff")}


CHRONOS2 = Chronos2Adapter()
ADAPTERS = (CHRONOS2,)  # export --to chronos2
# what a downloaded folder of this release (or a relative we lack) looks like, for models/foundation/release.py
SIGNATURES = (("Chronos-2's release (amazon/chronos-2)", "Chronos2",
               lambda files, config: named(config, "Chronos2Model")),)

# The largest released checkpoint's shape as run.py's size arguments, for benchmarks/memory_table.py (which builds
# it on the meta device and counts its parameters): (checkpoint, arguments, published size, where they come from).
LARGEST_SHAPES = ((HUB_ID, {"d_model": RELEASED_CORE["d_model"], "d_ff": RELEASED_CORE["d_ff"],
                            "e_layers": RELEASED_CORE["num_layers"], "n_heads": RELEASED_CORE["num_heads"]},
                   "120M", "config.json: d_model 768, d_ff 3072, num_layers 12, num_heads 12"),)
