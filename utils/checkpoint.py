"""Saving and loading model weights: atomic writes, no wrapper prefixes, strict loads."""
import os
import tempfile

import torch

from utils.errors import UserError
from utils.files import atomic_write

# Prefixes that wrappers add to parameter names: DistributedDataParallel and torch.compile.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def save_atomic(obj, path):
    """torch.save, atomically: a crash mid-write leaves the previous file intact."""
    return atomic_write(path, lambda f: torch.save(obj, f))


def strip_wrapper_prefixes(state_dict):
    clean = {}
    for key, value in state_dict.items():
        changed = True
        while changed:
            changed = False
            for prefix in WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key = key[len(prefix):]
                    changed = True
        clean[key] = value
    return clean


def read_state_dict(path, map_location="cpu"):
    """A plain state_dict from a file, whatever wrapper saved it."""
    if not os.path.isfile(path):
        raise UserError(f"checkpoint not found: {path} (train first, or pass --checkpoint PATH to an existing .pth file)")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for truncated / foreign files
        raise UserError(
            f"cannot read checkpoint {path}: it is truncated, corrupt or not a PyTorch weights file "
            f"({type(exc).__name__}). Re-train or point --checkpoint at a valid file."
        ) from None
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]  # a full training-state file: take its weights
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"checkpoint {path} does not hold a model state_dict")
    return strip_wrapper_prefixes(state)


def load_weights(model, path, map_location="cpu"):
    """Strictly load `path` into `model`; on a mismatch name every offending key."""
    state = read_state_dict(path, map_location)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshaped = sorted(
        f"{k} (file {tuple(state[k].shape)}, model {tuple(expected[k].shape)})"
        for k in set(state) & set(expected)
        if state[k].shape != expected[k].shape
    )
    if missing or unexpected or misshaped:
        parts = []
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
            if keys:
                shown = ", ".join(keys[:6]) + (f", ... ({len(keys)} in all)" if len(keys) > 6 else "")
                parts.append(f"{label}: {shown}")
        raise UserError(
            f"checkpoint {path} does not fit model {type(model).__module__.split('.')[-1]}: "
            + "; ".join(parts)
            + ". Use the same --model and shape arguments (seq_len, pred_len, d_model, ...) it was trained with."
        )
    model.load_state_dict(state, strict=True)
    return model


def read_training_state(path, map_location="cpu"):
    """The full training state written by Exp_Forecast after every epoch (last.pth)."""
    if not os.path.isfile(path):
        raise UserError(f"training state not found: {path}; pass --resume without a path to continue the setting's last.pth")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise UserError(f"cannot read training state {path}: it is truncated or corrupt ({type(exc).__name__}); "
                        "delete it to start over") from None
    required = {"model", "optimizer", "early_stopping", "epoch", "rng", "model_args", "history"}
    if not isinstance(state, dict) or not required <= set(state):
        raise UserError(f"{path} is not a training state written by this codebase (need {', '.join(sorted(required))})")
    return state


def writable_dir_problem(folder, option):
    """None if `folder` can be created and written to, else a message that says why not."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write_test_"):
            pass
    except OSError as exc:
        return f"{option} {folder} is not a writable folder ({exc.strerror}); choose another path or fix its permissions"
    return None
