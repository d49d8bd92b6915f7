"""Checkpoints beside a run: the best weights (checkpoint.pth) and the training state to
resume from (last.pth). Atomic writes, no wrapper prefixes, strict loads."""
import logging
import os
import tempfile

import torch

from utils import distributed
from utils.arguments import MODEL_SHAPING_ARGS
from utils.errors import UserError, require
from utils.files import atomic_write
from utils.tools import rng_state, seed_everything, set_rng_state

logger = logging.getLogger("tsl")

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


def checkpoint_path(args, setting, name="checkpoint.pth"):
    return os.path.join(args.checkpoints, setting, name)


def save_best(model, path):
    """Rank 0 writes `model`'s weights; every rank returns once the file is complete."""
    if distributed.is_main():
        save_atomic(model.state_dict(), path)
    distributed.barrier()  # nobody reads the file before it is complete


def save_training_state(path, model, optimizer, stopper, args, epoch, step, history, stopped):
    """last.pth: everything needed to continue exactly where `epoch` ended. A collective: every
    rank calls it (its generators and, under --zero, its optimizer shard go in); rank 0 writes."""
    rng = distributed.gather_objects(rng_state())
    optimizer_state = distributed.optimizer_state_dict(optimizer)  # consolidated under --zero (a collective)
    if distributed.is_main():
        save_atomic({
            "model": model.state_dict(),
            "optimizer": optimizer_state,
            "lr_schedule": {"lradj": args.lradj, "epoch": epoch},  # the rate is a function of (epoch, step)
            "early_stopping": stopper.state_dict(),
            "epoch": epoch,  # also the sampler epoch: set_epoch(epoch) reproduces the order
            "global_step": step,
            "stopped": stopped,
            "rng": rng,
            "model_args": {k: getattr(args, k) for k in MODEL_SHAPING_ARGS},
            "history": history,
        }, path)


def read_training_state(path, map_location="cpu"):
    """The full training state that save_training_state wrote (last.pth)."""
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


def load_training_state(path, model, optimizer, stopper, args, device):
    """Continue from last.pth: model (strictly), optimizer, early stopping and every random
    generator as the interrupted run left them; returns the state read."""
    state = read_training_state(path, map_location=device)
    differing = [f"{k} (saved {state['model_args'].get(k)!r}, now {getattr(args, k)!r})"
                 for k in MODEL_SHAPING_ARGS if state["model_args"].get(k) != getattr(args, k)]
    require(not differing, f"cannot resume from {path}: it was trained with other model arguments: "
            + "; ".join(differing) + ". Use the same arguments, or another --checkpoints folder")
    model.load_state_dict(state["model"], strict=True)
    distributed.load_optimizer_state(optimizer, state["optimizer"])  # full state: with or without --zero
    stopper.load_state_dict(state["early_stopping"])
    if len(state["rng"]) == distributed.world_size():
        set_rng_state(state["rng"][distributed.rank()])
    else:
        logger.warning(f"resuming on {distributed.world_size()} processes from a run on {len(state['rng'])}: "
                       "random streams are re-seeded, so results will differ from an uninterrupted run")
        seed_everything(args.seed + state["epoch"])
    logger.info(f"resumed from {path} after epoch {state['epoch']} (best vali {stopper.best_loss:.6f})")
    return state


def resume_path(args, setting):
    """last.pth to continue from, or None: --resume [PATH], or any torchrun restart."""
    resume = args.resume
    if resume is None and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0:
        resume = "auto"  # an elastic restart always continues the interrupted run
    if resume is None:
        return None
    if resume != "auto":
        return resume
    path = checkpoint_path(args, setting, "last.pth")
    if os.path.isfile(path):
        return path
    logger.info(f"--resume: no {path} yet, starting from epoch 1")
    return None


def resume(args, setting, model, optimizer, stopper, device):
    """(history, global step, stopped, first epoch): those of the run to continue (loaded into
    model, optimizer and stopper), or a fresh start's. Every rank must see the same state."""
    path = resume_path(args, setting)
    distributed.require_same(bool(path) and os.path.isfile(path),
                             f"the nodes disagree on the training state to resume (rank 0: {path}): a "
                             "multi-node run resumes and restarts from --checkpoints, so put it on storage every "
                             "node shares, or copy last.pth to every node")
    if not path:
        return [], 0, False, 1
    state = load_training_state(path, model, optimizer, stopper, args, device)
    return state["history"], state["global_step"], state["stopped"], state["epoch"] + 1


def writable_dir_problem(folder, option):
    """None if `folder` can be created and written to, else a message that says why not."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write_test_"):
            pass
    except OSError as exc:
        return f"{option} {folder} is not a writable folder ({exc.strerror}); choose another path or fix its permissions"
    return None


def require_writable(args, *options):
    """Fail before any work, on every rank, if rank 0 cannot write where `options` (--checkpoints,
    --results_dir) point."""
    def first_problem():
        problems = [writable_dir_problem(getattr(args, o), f"--{o}") for o in options]
        return next((p for p in problems if p), None)

    distributed.raise_on_every_rank(first_problem, on="main")
