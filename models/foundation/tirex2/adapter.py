"""NX-AI's TiRex-2 release in and out: the folder a user downloads from the Hugging Face hub (NX-AI/TiRex-2),
read for TiRex2.py, and written back by `python -m exp.export export --to tirex2`.

What the release is (tirex-2 0.4.0, tirex2/base.py `load_model`): `config.json`, the keyword arguments of the
package's `TiRex2.__init__` (stack_config with its block templates and recipe, num_blocks, embedding_dim, patch
sizes, quantiles, tokenizer_cfg, scaler_cfg, h_expand, context_len, future_len, input_ff_dim, act_func, dropout,
and the optional use_qk_norm, stack_out_norm_config, tta_sign_flip, tta_diff), and `model.safetensors`, the
module's state_dict with every group of aliased tensors stored once. Two aliases exist: each bidirectional
block's reverse cell is its forward cell (`time_mixer.rev_cell.*` is `time_mixer.fwd_cell.*`), and an sLSTM
cell's `recurrent_kernel` is its `_recurrent_kernel_`. The package's converter keeps the alphabetically first
name of a group (`fwd_cell.*`, `_recurrent_kernel_`); its reader fills in the others from whichever is present,
and so does to_ours here. The config names no model_type: the release is known by its keys (SIGNATURES).

Our layout: TiRex2.py holds the package's TiRex2 as `tirex2`, so ours is the release's key with `tirex2.` in
front (every alias name present, as the module's state_dict has them), plus one buffer, CONFIG_KEY: config.json
as UTF-8 bytes, which the weights alone do not show (context_len, future_len, the recipe, the scaler) and an
export writes back."""
import json
import os
import re

import torch

from models.foundation.release import another_release, named_in, open_release, read_config_json
from utils.adapters import SAFETENSORS_NAME, CheckpointAdapter, any_key
from utils.errors import UserError

HUB_ID = "NX-AI/TiRex-2"
CONFIG_NAME = "config.json"
PREFIX = "tirex2."
CONFIG_KEY = "tirex2_config"  # our buffer: the release's config.json (uint8), written back by an export
LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# TiRex2.__init__'s required arguments: what a config.json of this release holds at least.
REQUIRED = ("stack_config", "num_blocks", "embedding_dim", "input_patch_size", "output_patch_size", "quantiles",
            "tokenizer_cfg", "scaler_cfg", "h_expand", "context_len", "future_len", "input_ff_dim", "act_func",
            "dropout")
OPTIONAL = ("use_qk_norm", "stack_out_norm_config", "tta_sign_flip", "tta_diff", "device", "matmul_precision",
            "postprocessor_cfg")
# The released configuration as far as it is known. NX-AI/TiRex-2's config.json could not be read here: these
# are the sizes that reproduce the README's parameter counts exactly (38,449,264 univariate + 44,052,480
# multivariate = 82,501,744: 12 blocks alternating bi-mLSTM / bi-sLSTM, 512 wide, 4 heads), with the package's
# test configuration's context_len 2048, future_len 320, input_ff_dim 2048, h_expand 4, patch 32, arcsinh scaler.
PATCH = 32


def template(model_type, width, heads):
    return {"time_mixer": {"model_type": model_type, "embedding_dim": width, "num_heads": heads},
            "variate_mixer": {"embedding_dim": width, "num_heads": heads}, "dropout": 0.0, "eps": 1e-7}


def presumed_config(width=512, heads=4, blocks=12, input_ff_dim=2048, context_len=2048, future_len=320):
    """A TiRex-2 config.json at these sizes, recipe bi-mLSTM / bi-sLSTM alternating (mLSTM first); the defaults
    are the presumed release (see above)."""
    return {"stack_config": {"templates": {"mlstm_attn": template("bi-mlstm", width, heads),
                                           "slstm_attn": template("bi-slstm", width, heads)},
                             "recipe": [("mlstm_attn", "slstm_attn")[i % 2] for i in range(blocks)]},
            "num_blocks": blocks, "embedding_dim": width, "input_patch_size": PATCH, "output_patch_size": PATCH,
            "quantiles": list(LEVELS),
            "tokenizer_cfg": {"output_patch_size": PATCH, "input_patch_size": PATCH, "input_patch_stride": PATCH},
            "scaler_cfg": {"use_arcsinh": True, "binaryaware": True}, "h_expand": 4, "context_len": context_len,
            "future_len": future_len, "input_ff_dim": input_ff_dim, "act_func": "SiLU", "dropout": 0.0,
            "stack_out_norm_config": {"eps": 1e-7}, "tta_diff": True, "tta_sign_flip": False}


def is_tirex2(config):
    """Whether a config.json (a dict) is TiRex-2's: the package's constructor arguments, no model_type."""
    return (isinstance(config.get("stack_config"), dict) and "future_len" in config and "context_len" in config
            and "tokenizer_cfg" in config and not config.get("model_type") and not config.get("architectures"))


def read_release(path):
    """The checked config.json of the TiRex-2 folder `path` names (the folder, or its model.safetensors); one line
    for a path that is not there, a partial folder, another release's folder or another model's config."""
    if not os.path.exists(path):
        raise UserError(f"--pretrain_model_path {path} not found: download TiRex-2's release ({HUB_ID}: "
                        f"huggingface-cli download {HUB_ID} --local-dir DIR) and pass DIR")
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(path) and not str(path).endswith(".safetensors"):
        raise UserError(f"--pretrain_model_path {path} is a file: TiRex2 reads the folder of {HUB_ID} "
                        f"({CONFIG_NAME} and {SAFETENSORS_NAME})")
    absent = [name for name in (CONFIG_NAME, SAFETENSORS_NAME) if not os.path.isfile(os.path.join(folder, name))]
    if absent and is_legacy(set(os.listdir(folder))):
        raise UserError(f"--pretrain_model_path {path} holds TiRex-2's older layout ({LEGACY_CONFIG} + model.ckpt), "
                        f"which this TiRex2 does not read: download the current release ({HUB_ID}: {CONFIG_NAME} + "
                        f"{SAFETENSORS_NAME})")
    if absent:
        other = another_release(folder, "TiRex2", "TiRex-2")
        if other:
            raise UserError(other)
        raise UserError(f"--pretrain_model_path {path} is a partial TiRex-2 folder: {' and '.join(absent)} missing; "
                        f"download both files of the release ({HUB_ID})")
    config_path = os.path.join(folder, CONFIG_NAME)
    config = read_config_json(config_path, HUB_ID)
    check_config(config, config_path)
    open_release(folder).shapes()  # a truncated or foreign weights file: one line now, before anything is built
    return config


def check_config(config, where):
    """One line where `config` is not a TiRex-2 config.json: another release's (named, with its --model), or one
    lacking the package's arguments or holding ones it does not take."""
    if not is_tirex2(config):
        other = another_release(os.path.dirname(os.path.abspath(where)), "TiRex2", "TiRex-2")
        if other:
            raise UserError(other)
        keys = ", ".join(sorted(config)[:6]) or "none"
        raise UserError(named_in(f"{where} ({keys}) is not TiRex-2's config.json (stack_config, context_len, "
                                 f"future_len, tokenizer_cfg, ...): the folder of another model, not {HUB_ID}",
                                 where, "TiRex2"))
    lacking = [key for key in REQUIRED if key not in config]
    unknown = sorted(key for key in config if key not in REQUIRED + OPTIONAL)
    if lacking or unknown:
        said = [f"lacks {', '.join(lacking)}"] if lacking else []
        said += [f"holds {', '.join(unknown)}, which tirex-2 0.4's TiRex2 does not take"] if unknown else []
        raise UserError(f"{where} {' and '.join(said)}: not a config.json this TiRex2 reads ({HUB_ID})")
    quantiles = tuple(round(float(q), 6) for q in config["quantiles"])
    if quantiles != LEVELS:
        raise UserError(f"{where}: the release forecasts the quantiles {quantiles}; TiRex2 here forecasts TiRex-2's "
                        f"nine, {LEVELS}")


def config_bytes(config):
    """config.json as our buffer: its UTF-8 bytes."""
    return torch.tensor(list(json.dumps(config, sort_keys=True).encode()), dtype=torch.uint8)


def config_of(buffer):
    return json.loads(bytes(buffer.to(torch.uint8).tolist()).decode())


ALIASES = ((re.compile(r"\.time_mixer\.fwd_cell\."), ".time_mixer.rev_cell."),
           (re.compile(r"\.time_mixer\.rev_cell\."), ".time_mixer.fwd_cell."),
           (re.compile(r"\._recurrent_kernel_$"), ".recurrent_kernel"),
           (re.compile(r"\.recurrent_kernel$"), "._recurrent_kernel_"))


def alias_group(key):
    """Every name of the tensor `key` names (the reverse cell is the forward one; an sLSTM's recurrent_kernel is
    its _recurrent_kernel_), sorted, `key` included."""
    group, todo = {key}, [key]
    while todo:
        name = todo.pop()
        for pattern, replacement in ALIASES:
            other = pattern.sub(replacement, name)
            if other not in group:
                group.add(other)
                todo.append(other)
    return sorted(group)


def release_state_to_ours(state, config):
    """The release's tensors (one name per alias group) in our layout: every alias name filled in from the one
    stored (two stored names of one group must agree), `tirex2.` in front, config.json as CONFIG_KEY."""
    out = {}
    for key, value in state.items():
        for name in alias_group(key):
            if name in state and name != key and not torch.equal(state[name], value):
                raise UserError(f"{SAFETENSORS_NAME} holds different values for {key} and {name}, which are one "
                                f"tensor in TiRex-2 (an alias): a corrupt or hand-edited file")
            out[PREFIX + name] = value
    out[CONFIG_KEY] = config_bytes(config)
    return out


def ours_to_release(state):
    """(tensors, config): our state in the release's layout, each alias group stored once under its alphabetically
    first name (as the package's converter writes it), and config.json from CONFIG_KEY."""
    if CONFIG_KEY not in state:
        raise UserError(f"this state has no {CONFIG_KEY}: not a TiRex2 checkpoint of ours")
    config = config_of(state[CONFIG_KEY])
    foreign = sorted(k for k in state if k != CONFIG_KEY and not k.startswith(PREFIX))
    if foreign:
        raise UserError(f"{len(foreign)} key(s) of this TiRex2 have no place in {HUB_ID}'s layout: "
                        f"{', '.join(foreign[:6])}")
    weights = {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX)}
    tensors = {}
    for key, value in weights.items():
        group = [name for name in alias_group(key) if name in weights]
        if key == group[0]:
            tensors[key] = value.detach().cpu().contiguous()
    return tensors, config


class TiRex2Adapter(CheckpointAdapter):
    """NX-AI's TiRex-2 folder (the tirex-2 package's TiRex2: config.json + model.safetensors)."""
    model = "TiRex2"
    what = f"NX-AI's TiRex-2 release ({HUB_ID}: config.json + {SAFETENSORS_NAME})"
    export_format = "tirex2"
    export_note = (f"DST/config.json + DST/{SAFETENSORS_NAME} as {HUB_ID} lays them out (aliased tensors stored "
                   "once); tirex2.load_model(DST, device='cpu') reads the folder")
    writes_folder = True

    def recognise(self, state, config):
        return is_tirex2(config) or any_key(state, r"^stack\.\d+\.time_mixer\.fwd_cell\.")

    def to_ours(self, state, config):
        check_config(config, CONFIG_NAME)
        return release_state_to_ours(state, config)

    def holds_ours(self, state):
        return CONFIG_KEY in state and any_key(state, r"^tirex2\.stack\.\d+\.time_mixer\.fwd_cell\.")

    def from_ours(self, state):
        return ours_to_release(state)

    def write(self, checkpoint, folder):
        """`checkpoint` (from_ours) as the release's folder: model.safetensors, then config.json."""
        from safetensors.torch import save_file

        tensors, config = checkpoint
        os.makedirs(folder, exist_ok=True)
        partial = os.path.join(folder, f".{SAFETENSORS_NAME}.partial")
        save_file(tensors, partial, metadata={"format": "pt"})
        os.replace(partial, os.path.join(folder, SAFETENSORS_NAME))
        with open(os.path.join(folder, CONFIG_NAME), "w") as f:
            json.dump(config, f, indent=2)

    def shape_args(self, state):
        if CONFIG_KEY not in state:
            return {}
        config = config_of(state[CONFIG_KEY])
        return {"d_model": config.get("embedding_dim"), "e_layers": config.get("num_blocks"),
                "d_ff": config.get("input_ff_dim")}


TIREX2 = TiRex2Adapter()
ADAPTERS = (TIREX2,)  # `python -m exp.export export --to tirex2`
# what a downloaded folder of this release looks like, for models/foundation/release.py
LEGACY_CONFIG = "model-config.yaml"  # the package's older layout: this YAML + a torch-pickled model.ckpt


def is_legacy(files):
    """Whether a folder holding `files` is TiRex-2's older layout (the YAML tells it from a model.ckpt alone)."""
    return LEGACY_CONFIG in files and "model.ckpt" in files and SAFETENSORS_NAME not in files


SIGNATURES = (("TiRex-2's release (NX-AI/TiRex-2: config.json with stack_config, context_len and future_len, "
               "+ model.safetensors)", "TiRex2", lambda files, config: is_tirex2(config)),
              (f"TiRex-2's older layout ({LEGACY_CONFIG} + model.ckpt; --model TiRex2 reads the current release, "
               f"{CONFIG_NAME} + {SAFETENSORS_NAME})", None, lambda files, config: is_legacy(files)))

# The largest released checkpoint's shape as run.py's size arguments, for benchmarks/memory_table.py (which builds
# it on the meta device and counts its parameters): (checkpoint, arguments, published size, where they come from).
LARGEST_SHAPES = ((HUB_ID, {"d_model": 512, "d_ff": 2048, "e_layers": 12, "n_heads": 4}, "82.5M",
                   "README: 38.4M univariate + 44.1M multivariate; presumed 12 blocks alternating bi-mLSTM / bi-sLSTM, 512 wide, 4 heads (reproduces the README's "
                   "counts; the released config.json was not readable here)"),)
