"""Checkpoints beside a run: the best weights (checkpoint.pth) and the training state to
resume from (last.pth), which carries the run's identity; the lock that keeps two runs out
of one setting. Atomic writes, no wrapper prefixes, strict loads."""
import contextlib
import hashlib
import logging
import math
import os
import re
import shutil
import socket
import tempfile
import uuid
from dataclasses import dataclass, field

import torch

from utils import adapters, ddp, distributed, openltm
from utils.arguments import DATA_GROUP, MODEL_SHAPING_ARGS, build_parser, group_names, parser_defaults
from utils.errors import UserError
from utils.files import (atomic_write, file_version, file_versions, give_open_mode, lock_holder, release_file_lock,
                         same_file, take_file_lock)
from utils.tools import global_batch_size, rng_state, seed_everything, set_rng_state

logger = logging.getLogger("tsl")

# Prefixes that wrappers add to parameter names: DistributedDataParallel and torch.compile.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def save_atomic(obj, path):
    """torch.save, atomically: a crash mid-write leaves the previous file intact."""
    return atomic_write(path, lambda f: torch.save(obj, f))


class _Hashing:
    """A file that hashes what passes through it to the file `f` (torch.save calls write and flush)."""

    def __init__(self, f):
        self.f, self.sha256 = f, hashlib.sha256()

    def write(self, data):
        self.sha256.update(data)
        return self.f.write(data)

    def flush(self):
        self.f.flush()


# The sha256 of files this process wrote or read: absolute path -> (hex digest, the file's version: inode,
# mtime, size). A record names its weights by their digest (loaded_weights), last.pth its checkpoint.pth's.
_digests = {}


def save_hashed(obj, path):
    """save_atomic, keeping the file's sha256 as it is written (file_sha256 need not read it back)."""
    hashing = []

    def write(f):
        hashing.append(_Hashing(f))
        torch.save(obj, hashing[0])

    atomic_write(path, write)
    _digests[os.path.abspath(path)] = (hashing[0].sha256.hexdigest(), file_version(os.stat(path)))
    return path


def file_sha256(path, f=None):
    """The sha256 of the file at `path` (read from the open file `f` if given, which is left at its start),
    read once per version of the file."""
    key, version = os.path.abspath(path), file_version(os.stat(path) if f is None else os.fstat(f.fileno()))
    known = _digests.get(key)
    if known is not None and known[1] == version:
        return known[0]
    digest = hashlib.sha256()
    with contextlib.nullcontext(f) if f is not None else open(path, "rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
        source.seek(0)
    _digests[key] = (digest.hexdigest(), version)
    return digest.hexdigest()


# What the last read_weights of this process read, and the last load_weights loaded: {"path" (as given), "file"
# (the file read: a release folder's weights file), "sha256", "epoch", "step" (None where unknown)}. Rank 0 reads
# every file a run evaluates (distributed.load_on_main), so its records name them (exp.outputs.save_results).
_last_read = {}
_last_loaded = {}


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


def read_weights(path, map_location="cpu", opener=None):
    """(the state_dict a file holds, as saved, wrapper prefixes stripped; the config.json beside it, or {}),
    whatever wrote it: ours (.pth, a training state's weights) or another codebase's (.pth, .safetensors, a
    Hugging Face folder of model.safetensors + config.json). load_weights converts it for a model. `opener`,
    handed in from above (models.foundation.release.open_release), opens a released model's folder: where it
    names one, its weights come from there (an object with .file and .state(map_location) -> (state, config))."""
    if not os.path.exists(path):
        raise UserError(f"checkpoint not found: {path} (train first, or pass --checkpoint PATH to an existing .pth file)")
    _last_read.clear()
    opened = opener(path) if opener is not None else None
    if opened is not None:  # a release folder: read where it is opened
        state, config = opened.state(map_location)
        _last_read.update(path=path, file=opened.file, sha256=file_sha256(opened.file))
        return strip_wrapper_prefixes(state), config
    lightning_file = adapters.lightning_path(path)
    if lightning_file is not None:  # a release as a Lightning checkpoint (model.ckpt)
        state, config = adapters.read_lightning(lightning_file, map_location)
        _last_read.update(path=path, file=lightning_file, sha256=file_sha256(lightning_file))
        return strip_wrapper_prefixes(state), config
    tensors_file = adapters.safetensors_path(path)
    if tensors_file is not None:
        state = adapters.read_safetensors(tensors_file, map_location)
        _last_read.update(path=path, file=tensors_file, sha256=file_sha256(tensors_file))
    else:
        try:
            with open(path, "rb") as f:  # hashed and loaded from one open file: the same bytes, even if replaced
                digest = file_sha256(path, f)
                state = torch.load(f, map_location=map_location, weights_only=True)
            _last_read.update(path=path, file=path, sha256=digest, **_position(state))
        except Exception as exc:  # torch raises many types for truncated / foreign files
            newer = written_by_newer_torch(exc)
            if newer:
                raise UserError(f"cannot read checkpoint {path}: {newer}; upgrade PyTorch here (pip install -U torch) "
                                "to evaluate it, or evaluate it where it was written") from None
            raise UserError(
                f"cannot read checkpoint {path}: it is truncated, corrupt or not a PyTorch weights file "
                f"({type(exc).__name__}). Re-train or point --checkpoint at a valid file."
            ) from None
    if isinstance(state, dict) and state.get("shards") and state.get("model") is None:
        state = ddp.read_shards(shards_folder(path, state))  # an FSDP2 run's training state: its shards, whole
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]  # a full training-state file: take its weights
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"checkpoint {path} does not hold a model state_dict")
    return strip_wrapper_prefixes(state), adapters.hf_config(tensors_file) if tensors_file else {}


# How torch.load fails on an archive whose version record (<archive>/version) is past what this torch reads
# (caffe2's PyTorchStreamReader): "Attempted to read a PyTorch file with version 11, but the maximum supported
# version for reading is 10. ..."
NEWER_FORMAT = re.compile(r"PyTorch file with version (\d+), but the maximum supported version for reading is (\d+)")


def written_by_newer_torch(failure):
    """'it was written by a newer PyTorch (...)' if torch.load's `failure` says the file's format version is
    past this torch's, else None: such a file is whole, and deleting it would lose a good run."""
    found = NEWER_FORMAT.search(str(failure))
    if found is None:
        return None
    return (f"it was written by a newer PyTorch (file format version {found[1]}; torch {torch.__version__} here "
            f"reads up to version {found[2]}), and is not damaged")


# The layouts `export --to NAME` writes that the floor itself serves: OpenLTM's, for our Timer / Timer-XL. The
# released foundation models' formats are declared in their folders (models/foundation/) and handed in from above
# as `formats` ({NAME: adapters}, models.foundation.export_formats()): utils/ imports no model.
EXPORT_FORMATS = {"openltm": openltm.ADAPTERS}


def all_formats(formats=None):
    """{export format: adapters}: the floor's and those handed in (`formats`)."""
    return {**EXPORT_FORMATS, **(formats or {})}


def known_layouts(formats=None):
    """Every foreign layout known here, whatever model declares it: only named in a refusal, never loaded from
    (a model loads its own layout and those it declares: utils/adapters.py)."""
    return (*(a for adapters_ in all_formats(formats).values() for a in adapters_), *openltm.LACKING)


def _tells_apart(layout, state, config, expected):
    """Whether `layout` recognises `state` and not the model's own keys `expected` (a model whose own names
    look like a foreign layout's, TSLib's Informer and OpenLTM's old Timer, say, is never taken for it)."""
    return layout.recognise(state, config) and not layout.recognise(expected, {})


def weights_for(model, path, map_location="cpu", formats=None, opener=None):
    """(the state_dict of `path` in `model`'s layout, the adapter that converted it or None). The model's own
    layout comes first: a file with the model's keys is never converted. Else the first adapter the model
    declares (checkpoint_adapters) that recognises the file converts it. A file that fits neither is left as
    it is for the strict load to name key by key, unless some other known layout (another model's adapter, a
    model we lack; `formats`, the released models' adapters handed in from above) names what it is: then it is
    refused in one line that says so. `opener`: read_weights'."""
    state, config = read_weights(path, map_location, opener)
    expected = model.state_dict()
    if set(state) == set(expected):
        return state, None
    for adapter in adapters.declared_adapters(model):
        if _tells_apart(adapter, state, config, expected):
            try:
                return adapter.to_ours(state, config), adapter
            except UserError as exc:
                raise UserError(f"checkpoint {path} ({adapter.what}): {exc}") from None
    name = model_name(model)
    layouts = known_layouts(formats)
    for layout in layouts:
        if not _tells_apart(layout, state, config, expected):
            continue
        if isinstance(layout, adapters.CheckpointAdapter):
            raise UserError(f"checkpoint {path} holds {layout.what} weights: load it with --model {layout.model}, "
                            f"not {name}")
        readable = ", ".join(f"{a.what} as --model {a.model}" for a in layouts
                             if isinstance(a, adapters.CheckpointAdapter))
        raise UserError(f"checkpoint {path} holds {layout.what}{adapters.describe_config(config)}, which this "
                        f"codebase cannot load: {layout.why_not}. Foreign files load here as: {readable}")
    return state, None


def model_name(model):
    cls = getattr(model, "plain_class", None) or ddp.plain_class(model)  # a sharded module: the class it was built as
    return cls.__module__.split('.')[-1]


def _position(state):
    """{"epoch", "step"} of a training state's weights (last.pth as --checkpoint), else {}."""
    if not isinstance(state, dict) or "global_step" not in state or "model" not in state:
        return {}
    position = state.get("position") or {}
    epoch = position["epoch"] if position and not position.get("end_of_epoch", True) else state.get("epoch")
    return {"epoch": epoch, "step": state["global_step"]}


def loaded_weights():
    """What the last load_weights of this process loaded (then forgotten): {"path", "file", "sha256", "epoch",
    "step"}, or None. Weights a training run saved as its best (checkpoint.pth) get the epoch and step of the
    evaluation they come from where the training state beside them (last.pth) names them by their sha256."""
    if not _last_loaded:
        return None
    loaded = {key: _last_loaded.get(key) for key in ("path", "file", "sha256", "epoch", "step")}
    _last_loaded.clear()
    if loaded["epoch"] is None:
        loaded.update(_best_weights_position(loaded["file"], loaded["sha256"]))
    return loaded


def _best_weights_position(path, digest):
    """{"epoch", "step"} of the weights `path` (sha256 `digest`) if last.pth beside them records them as its
    best, else {}."""
    record = os.path.join(os.path.dirname(os.path.abspath(path)), "last.pth")
    if not os.path.isfile(record) or os.path.samefile(record, path):
        return {}
    try:  # memory-mapped: the record alone is read, not the weights and optimizer state
        best = torch.load(record, map_location="cpu", weights_only=True, mmap=True).get("best_weights")
    except Exception:  # torch raises many types for truncated / foreign files: then nothing is known
        return {}
    if not isinstance(best, dict) or best.get("sha256") != digest:
        return {}
    return {"epoch": best.get("epoch"), "step": best.get("step")}


def load_weights(model, path, map_location="cpu", formats=None, opener=None):
    """Strictly load `path` into `model` (its own layout, or one the model declares, converted: weights_for,
    `formats` and `opener` as there); on a mismatch name every offending key (and the shape arguments that
    differ, where the model's adapter can tell them)."""
    state, adapter = weights_for(model, path, map_location, formats, opener)
    name = model_name(model)
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
        origin = f" ({adapter.what}, converted)" if adapter is not None else ""
        raise UserError(
            f"checkpoint {path}{origin} does not fit model {name}: "
            + "; ".join(parts) + _shape_difference(model, state, expected)
            + ". Use the same --model and shape arguments (seq_len, pred_len, d_model, ...) it was trained with."
        )
    model.load_state_dict(state, strict=True)
    _last_loaded.clear()
    _last_loaded.update(_last_read)
    note = adapter.loaded_note(model) if adapter is not None else None
    if note:
        logger.warning(f"{path}: {note}")
    return model


def _shape_difference(model, state, expected):
    """'; the file has e_layers 2, d_ff 64 where the model has e_layers 3, d_ff 128' where an adapter the
    model declares holds both (TimerXL / Timer), else ''."""
    holder = next((a for a in adapters.declared_adapters(model) if a.holds_ours(state) and a.holds_ours(expected)),
                  None)
    if holder is None:
        return ""
    ours, file = holder.shape_args(expected), holder.shape_args(state)
    differing = [k for k in file if file[k] is not None and ours.get(k) is not None and file[k] != ours[k]]
    if not differing:
        return ""
    return ("; the file has " + ", ".join(f"{k} {file[k]}" for k in differing)
            + " where the model has " + ", ".join(f"{k} {ours[k]}" for k in differing))


def checkpoint_path(args, setting, name="checkpoint.pth"):
    return os.path.join(args.checkpoints, setting, name)


def save_best(model, path):
    """Rank 0 writes `model`'s weights; every rank returns once the file is complete (nobody reads it
    before), or, if rank 0 cannot write it, every rank stops with its one line (save_or_stop)."""
    weights = ddp.full_state_dict(model)  # under FSDP2 gathered onto rank 0 (a collective)
    save_or_stop(lambda: save_hashed(weights, path), path, "the best weights")


def save_or_stop(write, path, what):
    """Rank 0 calls write() to save `what` at `path`; a collective. If its setting's lock is no longer
    this run's (setting_lock) or the write fails, every rank stops with the same line, the previous
    file intact."""
    distributed.raise_on_every_rank(lambda: _lost_lock(path) or _write_or_say_why(write, path, what), on="main")


def _write_or_say_why(write, path, what):
    try:
        write()
    except OSError as exc:
        return (f"cannot write {what} {path} ({exc.strerror or exc}); the previous one is intact. Free space or "
                "fix the folder's permissions (or move away what stands at that path), then run again with --resume")
    return None


# ------------------------------------------------------------ a run's identity
# Every argument is part of a training state's identity unless listed here: a new argument is
# checked on resume until someone shows it cannot change what a run computes.
NOT_IDENTITY = {
    # labels and the --itr loop: they only name the setting, and the loop's index reaches training
    # through --seed, which is checked
    "basic": ("is_training", "model_id", "des", "itr"),
    # where the files lie, not what they hold: the data's content hash is checked
    DATA_GROUP: ("root_path",),
    # speed only: validation and test metrics are exact sums whatever the batch, loader workers and
    # threads do not reorder batches, where batches are gathered or how malloc keeps memory changes no
    # value, and --compile runs the same model (rounding only; a run must be able to continue without
    # the compiler)
    # the test split's loss during training is reported, never used: training runs the same without it,
    # or on a subset of it (--test_windows; the records say how many windows a test scored)
    "evaluation": ("test_every_epoch", "test_windows"),
    "optimisation": ("eval_batch_size", "num_workers", "data_on_device", "num_threads", "keep_freed_memory",
                     "compile",
                     # the global batch decides a step, not how it is split between processes: run_identity
                     # records it (global_batch_size), so a run may resume on another number of processes
                     "global_batch"),
    # where the processes run, not what they compute: the world size is checked apart (another
    # number of processes is allowed, with a warning), and DDP, --zero and --fsdp hold the same weights and Adam
    # state, each mode reading the others' training states (whole, or --fsdp's shards): the distribution mode may
    # change on resume; activation checkpointing
    # recomputes the very numbers it does not keep (tests/test_activation_checkpointing.py)
    "devices and DDP": ("use_gpu", "gpu", "ddp", "nproc_per_node", "dist_timeout", "local_rank", "zero", "fsdp",
                        "gpu_type", "use_multi_gpu", "dp", "devices", "activation_checkpointing"),
    # what a run writes and where, never how it trains
    "results, pictures and forecasts": group_names("results, pictures and forecasts"),
}
# Schedules that read the run's length (--train_epochs, --train_steps): with the others a longer run
# continues a shorter one exactly.
EPOCH_DEPENDENT_SCHEDULES = ("cosine", "TST")


def _identity_args():
    names = []
    for group in build_parser()._action_groups:
        if group.title in ("positional arguments", "options", "optional arguments"):
            continue  # argparse's own (--help)
        names += [n for n in group_names(group.title) if n not in NOT_IDENTITY.get(group.title, ())]
    return tuple(dict.fromkeys(names)) + ("mark_dim",)  # mark_dim: derived from the data, shapes the model


IDENTITY_ARGS = _identity_args()


def run_identity(args, data_content_hash):
    """What decides a run's trajectory: IDENTITY_ARGS' values and the data's content hash (the prepared data's
    content_hash(), which the experiment hands in)."""
    identity = {name: getattr(args, name, None) for name in IDENTITY_ARGS}
    identity["global_batch_size"] = getattr(args, "global_batch_size", None) or global_batch_size(
        args, distributed.world_size())
    identity["data_content_hash"] = data_content_hash
    return identity


def identity_differences(saved, now):
    """'name (saved X, now Y)' for each field that differs, in parser order. A field the saved identity
    lacks (an argument added since that file was written) counts as its default: a new argument's
    default keeps what the code did before it existed."""
    defaults = parser_defaults()
    differing = []
    for name, value in now.items():
        if name in ("train_epochs", "train_steps") and now.get("lradj") not in EPOCH_DEPENDENT_SCHEDULES:
            continue  # the schedule does not read it: a longer run continues a shorter one exactly
        if name == "global_batch_size" and name not in saved:
            continue  # an older file: each process's share decides
        was = saved[name] if name in saved else defaults.get(name, "(absent)")
        if was != value:
            differing.append((name, f"{name} (saved {was!r}, now {value!r})"))
    # a batch is the same when the global batch is (the run may go on on another number of processes) or each
    # process's share is (on another number the global batch changes, and load_training_state says so)
    names = {name for name, _ in differing}
    if not {"batch_size", "global_batch_size"} <= names:
        names -= {"batch_size", "global_batch_size"}
    return [line for name, line in differing if name in names]


def launch_id():
    """Who launched this worker: torchrun's run id and its agent (this process's parent) on this
    host. It stays the same across the elastic restarts of one launch and changes with every
    launch (ddp_forecast.sh's fixed --rdzv_id alone would not); None outside torchrun."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return None
    agent = os.getppid()
    try:  # the agent's start time: a reused pid is another agent
        with open(f"/proc/{agent}/stat") as stat:
            started = start_time_field(stat.read())
    except OSError:
        started = "?"
    return f"{run_id}/{socket.gethostname()}/{agent}/{started}"


def start_time_field(stat):
    """Field 22 (start time) of a /proc/PID/stat line, or "?". The command name, field 2, is in
    parentheses and may itself hold ") " (a process can name itself anything), so the fields are
    counted from the last ")"."""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 and ")" in stat else "?"


def restart_count():
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))


@dataclass
class TrainingState:
    """A training run as it stands, what last.pth holds: the model (the plain module, never a wrapper), its
    optimizer, early stopping (`stopped` included) and fp16's grad scaler; each rank's running train-loss
    sums (name -> exp.steps.RunningLoss); the history of evaluations; and where training is: `step`
    optimizer steps taken, the last in `epoch`, whose first `windows` positions of the epoch's order all
    ranks together have done (the whole epoch once `end_of_epoch`), a count that does not depend on the
    world size."""
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    stopper: object  # utils.tools.EarlyStopping
    grad_scaler: object = None  # torch.amp.GradScaler
    running: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    epoch: int = 1
    step: int = 0
    windows: int = 0
    end_of_epoch: bool = False

    def next_epoch(self):
        self.epoch, self.windows = self.epoch + 1, 0


def save_training_state(path, state, args, data_content_hash):
    """last.pth: everything needed to continue `state` (a TrainingState) exactly after its step, under the
    run's identity (run_identity: `args` and `data_content_hash`).
    A collective: every rank calls it (its generators, its running sums and, under --zero, its optimizer
    shard go in); rank 0 writes, and if it cannot, every rank stops with its one line (save_or_stop).
    fp16's loss scale is the same on every rank: it follows the all-reduced gradients."""
    own = {name: r.state_dict() for name, r in state.running.items()}
    rng, launches, sums = zip(*distributed.gather_objects((rng_state(), launch_id(), own)))
    shards = None
    if ddp.is_sharded(state.model):  # FSDP2: every rank writes its shards beside last.pth, nothing is gathered
        shards = distributed.broadcast_object(f"step_{state.step}_{uuid.uuid4().hex[:8]}")
        ddp.save_shards(state.model, state.optimizer, os.path.join(os.path.dirname(path), SHARDS, shards))
        weights = optimizer_state = None
    else:
        optimizer_state = ddp.optimizer_state_dict(state.optimizer)  # consolidated under --zero (a collective)
        weights = state.model.state_dict()
    scaler, epoch, end_of_epoch = state.grad_scaler, state.epoch, state.end_of_epoch

    def write():
        save_atomic({
            "model": weights,  # None when the weights and optimizer state are in `shards`
            "optimizer": optimizer_state,
            "shards": shards,  # under FSDP2: the folder of SHARDS holding them (torch.distributed.checkpoint)
            "grad_scaler": scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
            "lr_schedule": {"lradj": args.lradj, "epoch": epoch},  # the rate is a function of (epoch, step)
            "early_stopping": state.stopper.state_dict(),
            "epoch": epoch if end_of_epoch else epoch - 1,  # the last whole epoch
            # where training stands: set_epoch(epoch) reproduces the order (one for any world size), and
            # its first `global_windows` positions are done (data_provider.global_batches)
            "position": {"epoch": epoch, "global_windows": state.windows, "end_of_epoch": end_of_epoch},
            "global_step": state.step,
            "stopped": state.stopper.stopped,
            "rng": list(rng),
            "running": list(sums),  # each rank's train-loss sums since the last evaluation and log record
            "model_args": {k: getattr(args, k) for k in MODEL_SHAPING_ARGS},
            "identity": run_identity(args, data_content_hash),  # a resume or restart continues only the same run
            "world_size": distributed.world_size(),
            "launches": sorted({x for x in launches if x is not None}),  # every node's launch_id()
            "history": state.history,
            "best_weights": best_weights(path, state),  # what an evaluation of checkpoint.pth records
        }, path)

    save_or_stop(write, path, "the training state")
    if distributed.is_main():  # last.pth names the new shards, or none: any other is stale
        _remove_other_shards(os.path.dirname(path), shards)


# The folder beside last.pth that holds an FSDP2 run's sharded training states (one subfolder per save, named
# by last.pth's "shards"): each rank writes and reads its own shards through torch.distributed.checkpoint.
SHARDS = "last.shards"


def _remove_other_shards(folder, keep):
    root = os.path.join(folder, SHARDS)
    if not os.path.isdir(root):
        return
    for name in os.listdir(root):
        if name != keep:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)


def shards_folder(path, saved):
    """The folder of the shards the training state `saved` (read from `path`) names, or None; one line if it is
    gone."""
    if not saved.get("shards"):
        return None
    folder = os.path.join(os.path.dirname(path), SHARDS, saved["shards"])
    if not os.path.isfile(os.path.join(folder, ".metadata")):
        raise UserError(f"{path} keeps its weights and optimizer state in {folder}, which is missing or incomplete: "
                        "copy the whole checkpoint folder with last.pth, or delete last.pth to start over")
    return folder


def best_weights(last_path, state):
    """What checkpoint.pth beside last.pth holds, or None before the first: its sha256 and the epoch and step of
    the evaluation that saved it, the history's last new best as EarlyStopping counted it (below the best
    before it by more than its delta)."""
    path = os.path.join(os.path.dirname(last_path), "checkpoint.pth")
    best, lowest, delta = None, math.inf, getattr(state.stopper, "delta", 0.0)
    for record in state.history:
        loss = record.get("vali_loss")
        if isinstance(loss, (int, float)) and loss < lowest - delta:
            best, lowest = record, loss
    if best is None or not os.path.isfile(path):
        return None
    return {"sha256": file_sha256(path), "epoch": best["epoch"], "step": best["step"]}


def weights_being_trained(path):
    """None, or the line refusing to evaluate `path` while a training run holds the lock of the folder that holds
    it (setting_lock): that run replaces the weights as it goes, so the scores would be of whichever it saved
    last, and its own test would then overwrite the records."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    holder = lock_holder(os.path.join(folder, ".lock"))
    if holder is None:
        return None
    return (f"cannot evaluate {path}: a run is still training in {folder} ({holder}) and replaces these weights as "
            "it goes; wait for it to end, or evaluate a copy of them with --checkpoint PATH")


def read_training_state(path):
    """The full training state that save_training_state wrote (last.pth), on the CPU: the loads move
    each value where it belongs (a model's to its device, a --zero rank's optimizer shard only), and
    the generators' states must be CPU tensors."""
    if not os.path.isfile(path):
        raise UserError(f"training state not found: {path}; pass --resume without a path to continue the setting's last.pth")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        newer = written_by_newer_torch(exc)
        if newer:
            raise UserError(f"cannot read training state {path}: {newer}; upgrade PyTorch here (pip install -U "
                            "torch) to resume it, or resume where it was written") from None
        raise UserError(f"cannot read training state {path}: it is truncated or corrupt ({type(exc).__name__}); "
                        "delete it to start over") from None
    required = {"model", "optimizer", "early_stopping", "epoch", "rng", "model_args", "history"}
    if not isinstance(state, dict) or not required <= set(state):
        raise UserError(f"{path} is not a training state written by this codebase (need {', '.join(sorted(required))})")
    return state


def identity_problem(path, state, args, data_content_hash):
    """None if the training state `state` (read from `path`) is this run's (run_identity), else a one-line
    message naming every argument that differs (the world size may differ: load_training_state
    warns)."""
    if "identity" not in state:
        return (f"cannot resume from {path}: it carries no run identity (written by an older version of this "
                "code), so nothing shows it is this run's; delete it to start over, or use another --checkpoints")
    differing = identity_differences(state["identity"], run_identity(args, data_content_hash))
    if not differing:
        return None
    return (f"cannot resume from {path}: it is another run's training state: " + "; ".join(differing)
            + ". Use the same arguments, or another --checkpoints folder")


def load_training_state(path, state, args, data_content_hash, saved=None):
    """Load last.pth (`saved`: what it holds, if read already) into `state`, a TrainingState, once rank 0
    has checked that it is this run's (the same identity of `args` and `data_content_hash`): the model
    (strictly), optimizer, early stopping, fp16's loss scale, every random generator, the history and where
    training stands, as the interrupted run left them. Returns what last.pth holds."""
    if saved is None:
        saved = read_training_state(path)
    distributed.raise_on_every_rank(lambda: identity_problem(path, saved, args, data_content_hash), on="main")
    folder = shards_folder(path, saved)
    if folder is not None and ddp.is_sharded(state.model):  # each rank reads its part, on any number of processes
        ddp.load_shards(state.model, state.optimizer, folder)
    else:
        if folder is not None:  # an FSDP2 run's shards, whole, into an unsharded model (DDP, --zero)
            saved = {**saved, **ddp.read_shards(folder)}
        if ddp.is_sharded(state.model):  # every rank read the file: rank 0's copy is scattered
            ddp.load_sharded(state.model, saved["model"])
        else:
            state.model.load_state_dict(saved["model"], strict=True)
        ddp.load_optimizer_state(state.optimizer, saved["optimizer"])  # full state: with or without --zero
    scaler = state.grad_scaler
    if scaler is not None and scaler.is_enabled() and saved.get("grad_scaler"):
        scaler.load_state_dict(saved["grad_scaler"])  # else fp16 would start again from 2**16
    state.stopper.load_state_dict(saved["early_stopping"])
    if len(saved["rng"]) == distributed.world_size():
        set_rng_state(saved["rng"][distributed.rank()])
    else:
        was, now = saved["identity"].get("global_batch_size"), getattr(args, "global_batch_size", None)
        batch = (f"; the global batch is {now} windows, not {was}: the steps differ from an uninterrupted run's"
                 if was is not None and now is not None and was != now else "")
        logger.warning(f"resuming on {distributed.world_size()} processes from a run on {len(saved['rng'])}: "
                       "random streams are re-seeded: dropout and a model's keyed draws follow the sample as before, "
                       f"other random draws differ from an uninterrupted run{batch}")
        seed_everything(args.seed + saved["epoch"])
    _restore_position(state, saved)
    position = saved.get("position")
    where = (f"at step {saved['global_step']} (in epoch {position['epoch']})"
             if position and not position["end_of_epoch"] else f"after epoch {saved['epoch']}")
    logger.info(f"resumed from {path} {where} (best vali {state.stopper.best_loss:.6f})")
    return saved


def _restore_position(state, saved):
    """The history, the steps taken and where, whether early stopping had ended the run, and the running
    train-loss sums (each rank's own on as many processes as saved them, else moved: _running_moved)."""
    state.history, state.step, state.stopper.stopped = saved["history"], saved["global_step"], saved["stopped"]
    position = saved.get("position")
    if position and not position["end_of_epoch"]:
        state.epoch, state.windows = position["epoch"], _windows_done(position, saved.get("world_size") or 1)
    else:
        state.epoch, state.windows = saved["epoch"] + 1, 0
    if "running" not in saved:
        return
    same = saved.get("world_size") == distributed.world_size()
    for name, sums in state.running.items():
        ranks = [per_rank[name] for per_rank in saved["running"]]
        sums.load_state_dict(ranks[distributed.rank()] if same else _running_moved(ranks, distributed.is_main()))


def _running_moved(ranks, main):
    """One rank's running train-loss sums on another number of processes than saved them (`ranks`: each saved
    rank's): records all-reduce the additive sums, so rank 0 takes all of them and the others none; gradient
    norms and step counts are every rank's alike."""
    additive = ("loss_sum", "n_scored", "samples")
    return {**ranks[0], **{key: sum(r[key] for r in ranks) if main else 0 for key in additive}}


def resume_path(args, setting):
    """last.pth to continue from, or None: --resume [PATH], or any torchrun restart."""
    resume = args.resume
    if resume is None and restart_count() > 0:
        resume = "auto"  # an elastic restart continues its own first attempt's state (see resume)
    if resume is None:
        return None  # a fresh run never reads an older last.pth
    if resume != "auto":
        return resume
    path = checkpoint_path(args, setting, "last.pth")
    if os.path.isfile(path):
        return path
    logger.info(f"--resume: no {path} yet, starting from epoch 1")
    return None


def _written_by_another_launch(state):
    """On every rank: whether no node of this launch wrote `state` (rank 0 decides). A collective."""
    ours = set(distributed.gather_objects(launch_id())) - {None}
    return distributed.broadcast_object(not ours & set(state.get("launches", ())))


def resume(args, setting, state, data_content_hash):
    """Continue the run that --resume, or an elastic restart, names: its last.pth loaded into `state`, a
    TrainingState (load_training_state; `data_content_hash`: the prepared data's, for the run's identity). A
    fresh start leaves `state` as it is. Every rank must see the same file."""
    path = resume_path(args, setting)
    distributed.require_same(bool(path) and os.path.isfile(path),
                             f"the nodes disagree on the training state to resume (rank 0: {path}): a "
                             "multi-node run resumes and restarts from --checkpoints, so put it on storage every "
                             "node shares, or copy last.pth to every node")
    if not path:
        return
    saved = read_training_state(path)
    # Without --resume only an elastic restart gets here: it continues what its own launch wrote;
    # a last.pth from an earlier launch means the first attempt died before saving an epoch.
    if args.resume is None and _written_by_another_launch(saved):
        logger.info(f"elastic restart: {path} was written by an earlier launch, not by this run's first attempt "
                    f"(stopped before it saved an epoch); starting from epoch 1")
        return
    load_training_state(path, state, args, data_content_hash, saved)


def _windows_done(position, saved_world_size):
    """Positions of the interrupted epoch's order done. The order and its global batches do not depend
    on the world size, so the count holds on any number of processes (a different global batch then
    cuts the rest of the epoch from there). A state written before global batches recorded each rank's
    own count of round-robin shares: those ranks had done the first `windows x ranks` positions."""
    if "global_windows" in position:
        return position["global_windows"]
    return position["windows"] * saved_world_size


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


# The setting locks this process holds: setting folder (absolute) -> (setting, lock path, its open fd).
_held_locks = {}


def _lost_lock(path):
    """None unless `path` lies in a setting folder whose lock this process holds and that lock file is
    gone or another's (the folder removed, `rm -rf` of --checkpoints, perhaps re-made by another run):
    then the line that stops this run before it writes into what may now be another run's folder. (A
    second run that takes the setting between this check and the write is not caught: microseconds.)"""
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in _held_locks:
        return None
    setting, lock, fd = _held_locks[folder]
    if same_file(lock, fd):
        return None
    return (f"the folder of setting {setting}, {folder}, was removed or replaced while this run trained (its lock "
            f"file {lock} is gone or another run's): this run stops rather than write into another run's files; "
            "start it again (with --resume if last.pth is still there)")


@contextlib.contextmanager
def setting_lock(args, setting):
    """Rank 0 holds an exclusive flock on <checkpoints>/<setting>/.lock while a training run writes
    the setting; a second run on the same setting stops on every rank, naming the holder. The kernel
    drops the lock when its process dies, so a killed run never blocks the next one. The lock lives
    in the folder it guards: every save checks that it still stands (save_or_stop), so a run whose
    folder was removed under it stops instead of writing beside a second run that took the setting."""
    if not args.is_training:  # evaluation only reads; weights a run is training are refused (weights_being_trained)
        yield
        return
    folder = os.path.join(args.checkpoints, setting)
    path = os.path.join(folder, ".lock")
    held = {}

    def take():
        problem = writable_dir_problem(args.checkpoints, "--checkpoints")
        if problem:
            return problem
        held["new_folder"] = not os.path.isdir(folder)
        os.makedirs(folder, exist_ok=True)
        fd, holder = take_file_lock(path)
        if fd is None:
            return (f"setting {setting} is in use by another run ({holder}): two runs must not write one "
                    f"setting's checkpoints; wait for it to end, or use another --checkpoints or --des")
        held["fd"] = fd
        _held_locks[os.path.abspath(folder)] = (setting, path, fd)
        return None

    def take_or_say_why():
        try:
            return take()
        except OSError as exc:
            return f"cannot lock {path} ({exc.strerror}); check that --checkpoints is a writable local or shared folder"

    distributed.raise_on_every_rank(take_or_say_why, on="main")
    try:
        yield
    finally:
        if "fd" in held:
            _held_locks.pop(os.path.abspath(folder), None)
            release_file_lock(path, held["fd"])  # a run leaves no lock file, and no folder if it wrote nothing else
            if held["new_folder"]:
                with contextlib.suppress(OSError):
                    os.rmdir(folder)


# ------------------------------------------------------------ python -m exp.export
def export(src, dst, to="openltm", formats=None, opener=None):
    """Write `src` (any file read_weights reads) to `dst` in a foreign layout (`to`: a key of all_formats(formats),
    "openltm" for OpenLTM's models/timer_xl.py or models/timer.py) or in ours (`to="ours"`), through the
    adapter of the model the file holds. Returns (that adapter, the adapter `src` was converted from or None)."""
    formats = all_formats(formats)
    folder_format = to != "ours" and any(getattr(a, "writes_folder", False) for a in formats.get(to, ()))
    if os.path.isdir(dst) and not folder_format:
        raise UserError(f"{dst} is a folder: name the file to write, e.g. {os.path.join(dst, 'checkpoint.pth')}")
    state, config = read_weights(src, opener=opener)
    candidates = formats.get(to, [a for adapters_ in formats.values() for a in adapters_])
    source = None
    if not any(a.holds_ours(state) for a in candidates):  # not ours: one of the foreign files we read?
        source = next((a for a in candidates if a.recognise(state, config)), None)
        if source is not None:
            try:
                state = source.to_ours(state, config)
            except UserError as exc:
                raise UserError(f"checkpoint {src} ({source.what}): {exc}") from None
    holder = next((a for a in candidates if a.holds_ours(state)), None)
    if holder is None:
        models = " or ".join(dict.fromkeys(a.model for a in candidates))
        raise UserError(f"{src} is not a {models} checkpoint: export converts only those models' files")
    out = holder.from_ours(state) if to != "ours" else state
    from safetensors import SafetensorError

    try:
        if folder_format:  # a released foundation model's folder (config.json + model.safetensors)
            before = file_versions(dst)
            holder.write(out, dst)
            give_open_mode(dst, before)  # the files get open()'s mode, as every file this codebase writes
        else:
            save_atomic(out, dst)
    except (OSError, SafetensorError) as exc:  # safetensors' save_file raises its own error for a full disk
        why = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise UserError(f"cannot write {dst} ({why}); free space, choose another path or fix its folder's "
                        "permissions") from None
    return holder, source


def main(argv=None, formats=None, opener=None):
    """`python -m exp.export`: the command line of export, `formats` the released models' (handed in from above)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m exp.export",
                                     description="Convert checkpoints between our layout and another codebase's, "
                                                 "through the adapters our models declare (utils/adapters.py; "
                                                 "OpenLTM's Timer-XL and Timer: utils/openltm.py, docs/openltm.md).")
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("export", help="write SRC in OpenLTM's layout (--to openltm) or ours (--to ours)")
    convert.add_argument("--to", choices=(*all_formats(formats), "ours"), default="openltm")
    convert.add_argument("src", help="a checkpoint.pth / last.pth of ours, or an OpenLTM checkpoint (.pth, "
                                     ".safetensors, a model.safetensors folder)")
    convert.add_argument("dst", help="the file to write (not a folder)")
    args = parser.parse_args(argv)
    holder, source = export(args.src, args.dst, args.to, formats, opener)
    origin = source.what if source is not None else f"our {holder.model}"
    target = holder.what if args.to != "ours" else f"our models/{holder.model}.py"
    print(f"wrote {args.dst}: {origin} weights in the layout of {target}")
    if holder.export_note:
        print(f"note: {holder.export_note}")
    return 0

