"""The model contract: every models/<Name>.py is held to the same clauses, through the real experiment code.

Models are found by models.available_models(), so a new file is checked without editing this suite. Each
clause is a plain function `check_<clause>(spec, ...)` that raises ContractViolation (an AssertionError)
whose message reads "<Model> breaks the model contract: <clause>: <details and what to do>"; the tests
parametrise them over the models, and the test_contract_catches_* tests feed them deliberately broken
models so the suite is known to catch what it claims to.

One model: python -m pytest tests/test_model_contract.py -k <Name>    (see models/README.md)
"""
import contextlib
import hashlib
import importlib.util
import inspect
import os
import shlex
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import NamedTuple
from unittest import mock

import numpy as np
import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from exp.forward import forward, training_loss as exp_training_loss
from helpers import make_args, make_experiment, run_on_ranks
from models import ZOO, available_models

# One small configuration for every model; each model reads the fields it needs.
CONTRACT_ARGS = [
    "--d_model", 16, "--d_ff", 32, "--n_heads", 2, "--e_layers", 1, "--d_layers", 1,
    "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--input_token_len", 8, "--output_token_len", 8,
    "--patch_len", 8, "--stride", 4, "--top_k", 2, "--num_kernels", 2, "--seg_len", 24,  # SegRNN: divides both
    "--down_sampling_layers", 1, "--down_sampling_window", 2, "--down_sampling_method", "avg",
    "--dropout", 0, "--data", "synthetic", "--synthetic_rows", 400, "--synthetic_channels", 7,
    "--batch_size", 4, "--num_threads", 1, "--use_gpu", "false",
    # A model that cannot run this small (TSLib's MultiPatchFormer fixes patches up to 32 steps) gets its own
    # settings on top: lab/tslib_models.py passes a dropped-in file's here.
    *shlex.split(os.environ.get("TSL_CONTRACT_ARGS", "")),
]
SEED, OTHER_SEED = 2021, 7
DDP_STEPS = 2  # DDP only notices a parameter left out of the all-reduce when the next step starts
MODELS = available_models()


class ModelSpec(NamedTuple):
    """A model to check: a name in models/, or (for the self-tests) a file anywhere; `zoo` says whether the
    zoo's own clauses apply (None: by its name, see in_zoo)."""

    name: str
    path: str | None = None
    zoo: bool | None = None


# Files dropped in under a zoo model's name (lab/tslib_models.py copies TSLib's TiDE.py over ours in a
# scratch copy): held to what every file must do, not to the zoo's own clauses.
DROPPED_IN = frozenset(shlex.split(os.environ.get("TSL_CONTRACT_DROPPED_IN", "")))


def in_zoo(spec):
    """Whether `spec` is one of the zoo's own files (models.ZOO), which carry clauses beyond what runs
    correctly here: exact output length, half precision, undated data, a gradient for every parameter, the
    template's names and house style. A file from elsewhere (TSLib's) is held to what the experiment needs."""
    if spec.zoo is not None:
        return spec.zoo
    return spec.name in ZOO and spec.name not in DROPPED_IN


class ContractViolation(AssertionError):
    pass


def violation(spec, clause, details):
    return ContractViolation(f"{spec.name} breaks the model contract: {clause}: {details}")


_LIBRARY_PATHS = tuple({sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib")})


def describe_error(exc):
    """'Type: message (at file:line)', the line being the last one outside Python's and torch's own code."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if not f.filename.startswith(_LIBRARY_PATHS)] or frames
    where = f" (at {ours[-1].filename}:{ours[-1].lineno})" if ours else ""
    return f"{type(exc).__name__}: {str(exc).strip()[:1500]}{where}"


@contextlib.contextmanager
def clause(spec, title, hint):
    """Turn any error raised while checking `title` into a contract message that names the model."""
    try:
        yield
    except ContractViolation:
        raise
    except Exception as exc:
        raise violation(spec, title, f"{describe_error(exc)}; {hint}") from exc


# ---------------------------------------------------------------- building through the experiment

_file_modules = {}


def model_class(spec):
    if spec.path is None:
        from models import get_model_class

        return get_model_class(spec.name)
    if spec.path not in _file_modules:
        module_name = f"contract_fixture_{spec.name}"
        loader = importlib.util.spec_from_file_location(module_name, spec.path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module  # inspect.getmodule needs it registered
        loader.loader.exec_module(module)
        _file_modules[spec.path] = module
    return _file_modules[spec.path].Model


def build_experiment(spec, *extra, seed=SEED):
    """Exp_Forecast on the contract configuration: exp.raw_model, exp.model (DDP under a process group)
    and the completed exp.args (enc_in, c_out, mark_dim, autoregressive)."""
    # the data does not follow --seed: two experiments of two seeds see the same windows, and a released model's
    # input scaling (exp.adaptation.forecast_series_as_given: the data's scaler) is the same in both
    args = make_args("--model", spec.name, *CONTRACT_ARGS, "--seed", seed, "--synthetic_seed", SEED, *extra)
    registry = (mock.patch("exp.settings.get_model_class", return_value=model_class(spec)) if spec.path
                else contextlib.nullcontext())
    with registry:
        return make_experiment(args)


def first_windows(exp, split, batch_size, model_inputs=None):
    """The first `batch_size` windows of a split, in the layout its loader gives (with the
    time features of `model_inputs`, default the model's own declaration)."""
    from data_provider.data_factory import data_provider

    args = exp.args if model_inputs is None else exp.args.replace(model_inputs=model_inputs)
    dataset, _ = data_provider(args, split)
    return dataset.__getitems__(torch.arange(batch_size))


def training_loss(exp, model, batch):
    """--loss MSE, a quantile model's pinball loss, or a model's own objective (computes_loss), as train_step's."""
    return exp_training_loss(model, batch, exp.args, exp.device, exp.loss)[0]


def perturb_(model, seed):
    """Move every float parameter and persistent buffer off its initial value."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.state_dict().values():  # shares storage with the model
            if tensor.is_floating_point():
                tensor.add_(0.01 * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))


def eval_output(exp, model, batch):
    model.eval()
    with torch.no_grad():
        return forward(model, batch, exp.args, "val", exp.device)[0]


def max_difference(a, b):
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    return f"max |difference| {(a.double() - b.double()).abs().max().item():.3g}"


# A forward that is not bit-reproducible call to call (TSLib's Koopa solves torch.linalg.lstsq per batch, whose
# CPU result can move in the last bits between calls on the same input) is held to its own rounding, not bit
# equality: identical weights and an output difference within the rounding of float32 arithmetic.
ROUNDING = 1e-5  # of the output's scale: far above float32 rounding, far below any real randomness
JITTER_CALLS = 8


def call_to_call_jitter(exp, model, batch, first):
    """How far `model`'s eval output moves from `first` over repeated calls on the same batch (0: bit-reproducible)."""
    for _ in range(JITTER_CALLS):
        moved = (eval_output(exp, model, batch).double() - first.double()).abs().max().item()
        if moved:
            return moved
    return 0.0


def same_or_own_rounding(exp, model, batch, first, other, same_weights):
    """Bit-equal outputs; or, where the weights are bit-equal and the model's own forward moves from call to call,
    outputs apart by no more than rounding: the models are the same function, the difference is the forward's."""
    if torch.equal(first, other):
        return True
    difference = (first.double() - other.double()).abs().max().item()
    scale = max(first.abs().max().item(), 1e-12)
    return same_weights and difference <= ROUNDING * scale and call_to_call_jitter(exp, model, batch, first) > 0


def same_state(a, b):
    """Every parameter and buffer of two models bit for bit (state_dict keys, shapes and values)."""
    a, b = a.state_dict(), b.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def parameter_digests(model):
    return {name: hashlib.sha256(p.detach().contiguous().numpy().tobytes()).hexdigest()
            for name, p in model.named_parameters()}


def shown(names, limit=6):
    names = list(names)
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


# ---------------------------------------------------------------- the clauses

def check_output_shape(spec, features="M", batch_size=4, data_args=()):
    """pred and true from the experiment agree, and the raw output has the family's shape, in a training
    forward and in the test forward (a roll-out for token models). `data_args` name undated data (mark width
    0), a case for the zoo only: TSLib's experiment always gives time features, and its TiDE encodes them with
    a linear layer that cannot take zero. A direct model's output may be longer than pred_len, as TSLib's exp
    keeps `outputs[:, -pred_len:]` (SCINet returns seq_len + pred_len steps); the zoo's is exactly pred_len.
    A token model's is exactly N * output_token_len for every file: exp.forward reads it block by block."""
    zoo = in_zoo(spec)
    if data_args and not zoo:
        return
    title = f"output shape (--features {features}, batch {batch_size}{', undated data' if data_args else ''})"
    with clause(spec, title, "the model must build and run on this configuration; see models/README.md"):
        exp = build_experiment(spec, "--features", features, *data_args)
        args, model = exp.args, exp.raw_model
        outputs = []
        hook = model.register_forward_hook(lambda module, inputs, output: outputs.append(output))
        try:
            for split, training in (("train", True), ("test", False)):
                batch = first_windows(exp, split, batch_size)
                model.train(training)
                with torch.set_grad_enabled(training):
                    pred, true = forward(model, batch, exp.args, split, exp.device)
                levels = len(args.native_quantiles or ())  # a model forecasting its own quantiles: [..., C, levels]
                if pred.shape != (*true.shape, levels)[:true.dim() + bool(levels)]:
                    raise violation(spec, title, f"{split} prediction {tuple(pred.shape)} and truth {tuple(true.shape)} "
                                    "differ after the experiment's slicing; fix the model's output length or channels")
                if not torch.isfinite(pred).all():
                    raise violation(spec, title, f"{split} prediction has non-finite values")
                expected_channels = sorted({args.c_out, args.enc_in})
                for output in outputs:
                    if not isinstance(output, torch.Tensor):
                        raise violation(spec, title, f"forward returned {type(output).__name__}; return one tensor")
                    length, expected, longer = output_length(args, batch, levels, zoo)
                    if (output.dim() != 3 + bool(levels) or output.shape[0] != batch_size
                            or not (output.shape[1] == length or (longer and output.shape[1] > length))
                            or output.shape[2] not in expected_channels
                            or (levels and output.shape[3] != levels)):
                        raise violation(spec, title, f"{split} forward returned {tuple(output.shape)}; expected "
                                        f"{expected} = ({batch_size}, {'>= ' if longer else ''}{length}, C) with C in "
                                        f"{expected_channels} (enc_in {args.enc_in}, c_out {args.c_out})")
                    if output.device.type != "cpu":
                        raise violation(spec, title, f"output is on {output.device}; follow the input's device")
                outputs.clear()
        finally:
            hook.remove()


def output_length(args, batch, levels, zoo):
    """(steps, shape in words, whether more steps are accepted) of a raw output: a direct model from outside the
    zoo may return more than pred_len steps, of which exp.forward.direct_forward keeps the last pred_len."""
    if args.autoregressive:
        n_tokens = batch[0].shape[1] // args.input_token_len
        return n_tokens * args.output_token_len, "[B, N * output_token_len, C]", False
    steps = "pred_len" if zoo else "L >= pred_len"
    if levels:
        return args.pred_len, f"[B, {steps}, C, {levels}] (its quantile_levels)", not zoo
    return args.pred_len, f"[B, {steps}, C]" + (" (the zoo's own models return exactly pred_len)" if zoo else ""), not zoo


def check_gradients(spec):
    """One training forward/backward gives every gradient finite values, and (the zoo only) every parameter a
    gradient, unless the class declares `unused_parameters = {"name.prefix": "why"}` for it. A file from
    elsewhere may leave parameters without one (TSLib's FEDformer, MSGNet build layers a configuration never
    reads): the experiment finds them before training and has DDP search for them every step."""
    title = "every parameter gets a gradient"
    with clause(spec, title, "the model file must import"):
        cls = model_class(spec)
    declared = getattr(cls, "unused_parameters", {})
    if not isinstance(declared, dict) or not all(
            isinstance(prefix, str) and prefix and isinstance(reason, str) and reason.strip()
            for prefix, reason in declared.items()):
        raise violation(spec, title, f"unused_parameters = {declared!r}; it must map parameter-name prefixes "
                        "to a non-empty reason, e.g. {'head.spare': 'kept for TSLib checkpoints'}")
    with clause(spec, title, "a training forward/backward must run"):
        exp = build_experiment(spec, "--features", "M")
        model = exp.raw_model
        model.train()
        training_loss(exp, model, first_windows(exp, "train", 4)).backward()
    missing, non_finite = [], []
    for name, parameter in model.named_parameters():
        if parameter.grad is None:
            if not any(name.startswith(prefix) for prefix in declared):
                missing.append(name)
        elif not torch.isfinite(parameter.grad).all():
            non_finite.append(name)
    if missing and in_zoo(spec):
        raise violation(spec, title, f"no gradient for {shown(missing)}. A zoo model builds only the layers its "
                        "configuration uses (DDP then needs no find_unused_parameters, a search of the graph every "
                        "step); if one truly cannot take part, declare it in the class attribute "
                        "unused_parameters = {'prefix': 'why'} (and it must still pass the DDP clause)")
    if non_finite:
        raise violation(spec, title, f"non-finite gradient for {shown(non_finite)}; look for divisions by zero, "
                        "log/sqrt of non-positive values or overflow on this small configuration")


def ddp_training_steps(rank, world_size, specs):
    """Runs on every rank (inside run_on_ranks): DDP_STEPS training steps of each model through the
    experiment's own DDP wrapper; per model the parameter digests afterwards, or the error."""
    import torch.distributed as dist

    from data_provider.data_factory import data_provider

    results = {}
    for spec in map(ModelSpec._make, specs):
        try:
            exp = build_experiment(spec, "--features", "M")
            if not isinstance(exp.model, DistributedDataParallel):
                raise RuntimeError(f"the experiment built {type(exp.model).__name__}, not DistributedDataParallel")
            _, loader = data_provider(exp.args, "train")  # a different shard on every rank
            exp.allow_unused_parameters(loader.dataset)  # as training does, before the optimizer
            optimizer = exp.make_optimizer()
            loader.set_epoch(1)
            exp.model.train()
            buffers = {name: b.clone() for name, b in exp.raw_model.named_buffers()}
            for _, batch in zip(range(DDP_STEPS), loader):
                optimizer.zero_grad(set_to_none=True)
                exp.backward(training_loss(exp, exp.model, batch))
                exp.optimizer_step(optimizer)
            changed = [name for name, b in exp.raw_model.named_buffers() if not torch.equal(b, buffers[name])]
            results[spec.name] = {"digests": parameter_digests(exp.raw_model), "changed_buffers": changed,
                                  "broadcasts_buffers": exp.model.broadcast_buffers}
        except Exception as exc:
            results[spec.name] = {"error": describe_error(exc)}
        exp = optimizer = None
        dist.barrier()  # the next model starts on every rank together
    return results


def check_ddp_step(spec, per_rank):
    """`per_rank`: ddp_training_steps' results of every rank. Both ranks must finish and agree."""
    title = f"{DDP_STEPS} DDP training steps on 2 processes"
    outcomes = [results[spec.name] for results in per_rank]
    for rank, outcome in enumerate(outcomes):
        if "error" in outcome:
            raise violation(spec, title, f"rank {rank} failed (gloo): "
                            f"{outcome['error']}\nEvery parameter that requires grad must take part in "
                            "every training forward (see the gradient clause), and forward must not depend on the rank")
    first, second = (outcome["digests"] for outcome in outcomes)
    differing = [name for name in first if first[name] != second.get(name)]
    if differing or first.keys() != second.keys():
        raise violation(spec, title, f"parameters differ between ranks after the steps: {shown(differing)}; "
                        "a parameter changed outside the all-reduced gradient (in-place updates in forward, "
                        "rank-dependent initialisation after construction, or a gradient DDP did not reduce)")
    # DDP re-broadcasts buffers before every forward only when training changes some (BatchNorm's running
    # statistics): a constant table sent every step is wasted bandwidth, a changing buffer not sent diverges
    changed, broadcasts = outcomes[0]["changed_buffers"], outcomes[0]["broadcasts_buffers"]
    if bool(changed) != broadcasts:
        raise violation(spec, title, f"training changed the buffers {shown(changed) if changed else '(none)'} but "
                        f"DDP {'re-broadcasts' if broadcasts else 'does not re-broadcast'} buffers every step; a buffer "
                        "that training updates must be BatchNorm-style running statistics (running_mean, "
                        "track_running_stats), which utils.ddp.has_running_statistics detects")


INVARIANCE_STEPS = 2  # optimizer steps compared, each on its own global batch of 8 windows


def invariance_gradients(rank, world_size, specs):
    """Runs on every rank (inside run_on_ranks): INVARIANCE_STEPS training steps of each model, the global
    batch of 8 windows split over the ranks (data_provider.global_batches), with dropout 0.1 and --sync_bn; per
    model each step's gradients (as DDP averaged them) on rank 0, or the error."""
    import torch.distributed as dist

    from data_provider.data_factory import data_provider

    results = {}
    for spec in map(ModelSpec._make, specs):
        try:
            exp = build_experiment(spec, "--features", "M", "--dropout", 0.1, "--sync_bn", "--batch_size", 8 // world_size)
            declared = getattr(exp.raw_model, "randomness_follows_sample", True)
            if not declared:  # the claim is tested with masks keyed as for any other model
                exp.masks_follow_samples = True
            _, loader = data_provider(exp.args, "train")
            exp.allow_unused_parameters(loader.dataset)  # as training does, before the optimizer
            optimizer = exp.make_optimizer()
            loader.set_epoch(1)
            exp.model.train()
            steps = []
            for _, micro_batches in zip(range(INVARIANCE_STEPS), loader.steps()):
                exp.train_step(micro_batches, optimizer)
                steps.append({name: p.grad.detach().numpy().copy()  # numpy: sent by value, not shared memory
                              for name, p in exp.raw_model.named_parameters() if p.grad is not None})
            results[spec.name] = {"gradients": steps if rank == 0 else None, "follows": declared}
        except Exception as exc:
            results[spec.name] = {"error": describe_error(exc)}
        exp = optimizer = None
        if dist.is_initialized():
            dist.barrier()
    return results


def check_world_size_invariance(spec, single, pair):
    """`single`, `pair`: invariance_gradients' results on 1 and 2 processes. A model whose randomness follows
    the sample (the default) takes the same steps as 1 x 8 and 2 x 4 (gradients to 1e-4 of their norm; a
    different dropout mask changes them by tens of per cent); one that says it cannot
    (`randomness_follows_sample = False`) must really differ, or the claim gives away the guarantee. A
    `batch_dependent` model (its forward reads the batch-mates) is exempt; BatchNorm is not (--sync_bn)."""
    title = "the same training on 1 process x 8 windows and 2 processes x 4"
    outcomes = [single[0][spec.name], *(results[spec.name] for results in pair)]
    for where, outcome in zip(("1 process", "rank 0 of 2", "rank 1 of 2"), outcomes):
        if "error" in outcome:
            raise violation(spec, title, f"{where} failed: {outcome['error']}")
    if getattr(model_class(spec), "batch_dependent", None):
        return  # a forward that reads its batch-mates trains differently on other splits of the batch
    follows = outcomes[0]["follows"]
    worst = 0.0  # over the steps: |difference| / |gradient|, all parameters together (a bias with no real
    for one, two in zip(outcomes[0]["gradients"], outcomes[1]["gradients"]):  # gradient is all rounding)
        difference = sum(float(np.square(grad - two[name]).sum()) for name, grad in one.items())
        worst = max(worst, (difference / max(sum(float(np.square(g).sum()) for g in one.values()), 1e-24)) ** 0.5)
    if follows and worst > 1e-4:
        raise violation(spec, title, f"gradients differ by {worst:.2g} of their norm; use nn.Dropout modules (the "
                        "experiment keys them by the sample) on inputs that hold each sample's rows together along the "
                        "first dimension (a run names any that does not), not F.dropout or a fused kernel's dropout_p "
                        "in forward (layers.dropout.attention keys attention), and no other randomness; if that "
                        "cannot be, declare `randomness_follows_sample = False`")
    if not follows and worst <= 1e-4:
        raise violation(spec, title, "the model says its randomness cannot follow the sample "
                        "(randomness_follows_sample = False), yet 1 x 8 and 2 x 4 train alike: drop the claim")


def check_same_seed(spec):
    """Two models built with the same seed give identical eval-mode outputs on the same batch (within its own
    rounding for a forward that is not bit-reproducible call to call, when the weights are identical)."""
    title = "same seed, same output"
    with clause(spec, title, "the model must build and run in eval mode"):
        first, second = build_experiment(spec), build_experiment(spec)
        batch = first_windows(first, "train", 4)
        out_first, out_second = eval_output(first, first.raw_model, batch), eval_output(second, second.raw_model, batch)
        same = same_or_own_rounding(first, first.raw_model, batch, out_first, out_second,
                                    same_state(first.raw_model, second.raw_model))
    if not same:
        raise violation(spec, title, f"two models built with --seed {SEED} disagree ({max_difference(out_first, out_second)}); "
                        "draw initial values only from torch's global generator in __init__ (the experiment seeds it) "
                        "and use no randomness in eval-mode forward")


def check_state_dict_round_trip(spec, folder):
    """Weights saved with torch.save load strictly (utils.checkpoint.load_weights) into a model built with
    another seed, and that model then gives the same outputs."""
    from utils.checkpoint import load_weights

    title = "state_dict round trip"
    with clause(spec, title, "state_dict() must hold every tensor the output depends on, under stable names"):
        original, fresh = build_experiment(spec), build_experiment(spec, seed=OTHER_SEED)
        perturb_(original.raw_model, seed=1)  # so a deterministic initialisation cannot pass by itself
        path = folder / f"{spec.name}.pth"
        torch.save(original.raw_model.state_dict(), path)
        load_weights(fresh.raw_model, str(path))
        batch = first_windows(original, "train", 4)
        expected, loaded = eval_output(original, original.raw_model, batch), eval_output(fresh, fresh.raw_model, batch)
        same = same_or_own_rounding(original, original.raw_model, batch, expected, loaded,
                                    same_state(original.raw_model, fresh.raw_model))
    if not same:
        raise violation(spec, title, f"the reloaded model's output differs ({max_difference(expected, loaded)}); "
                        "register every tensor forward reads as a parameter or (persistent) buffer, or derive it "
                        "from configs deterministically")


def check_declared_inputs(spec):
    """A model that declares `inputs_used` reads no other forward argument: its eval-mode output is
    the same when the undeclared ones hold data as when they are None (what the experiment passes)."""
    from models import FORWARD_INPUTS, inputs_used

    title = "declared inputs"
    with clause(spec, title, "the model file must import"):
        cls = model_class(spec)
    with clause(spec, title, "fix the declaration"):
        declared = inputs_used(cls)
    undeclared = [name for name in FORWARD_INPUTS if name not in declared]
    if not undeclared:
        return
    with clause(spec, title, "the model must run with None for the arguments it does not declare"):
        exp = build_experiment(spec, "--features", "M")
        args, model = exp.args, exp.raw_model
        x, y, x_mark, y_mark = first_windows(exp, "train", 4, model_inputs=FORWARD_INPUTS)
        given = {"x_enc": x, "x_mark_enc": x_mark, "x_mark_dec": y_mark,
                 "x_dec": None if args.autoregressive else torch.cat(
                     [y[:, :args.label_len], torch.zeros_like(y[:, -args.pred_len:])], dim=1)}
        generator = torch.Generator().manual_seed(0)
        for name in undeclared:  # data nothing else would produce, so a read cannot go unnoticed
            if given[name] is not None:
                given[name] = torch.randn(given[name].shape, generator=generator) + 1
        only_declared = {name: (given[name] if name in declared else None) for name in FORWARD_INPUTS}
        model.eval()
        with torch.no_grad():  # by position, as exp.forward calls it: names are the file's own
            with_all = model(*(given[name] for name in FORWARD_INPUTS))
            with_declared = model(*(only_declared[name] for name in FORWARD_INPUTS))
    if not torch.equal(with_all, with_declared):
        raise violation(spec, title, f"inputs_used = {declared!r}, but the output changes when "
                        f"{', '.join(undeclared)} hold data ({max_difference(with_all, with_declared)}); add what "
                        "forward reads to inputs_used (the experiment passes None for the rest and the loader "
                        "does not gather it), or delete the declaration")


def check_windows_independent(spec):
    """In eval mode each window's forecast depends on that window only: a batch of 4 gives, row by row,
    what each window gives alone. Otherwise test metrics change with --batch_size and the world size.
    A model whose method needs its batch-mates declares `batch_dependent = "why"` instead."""
    title = "windows are independent"
    with clause(spec, title, "the model file must import"):
        cls = model_class(spec)
    reason = getattr(cls, "batch_dependent", None)
    if reason is not None:
        if not isinstance(reason, str) or not reason.strip():
            raise violation(spec, title, f"batch_dependent = {reason!r}; it must be a non-empty reason "
                            "(why the forecast of one window reads the others in its batch)")
        return
    with clause(spec, title, "the model must run in eval mode on batches of 4 and of 1"):
        exp = build_experiment(spec, "--features", "M")
        batch = first_windows(exp, "test", 4)
        together = eval_output(exp, exp.raw_model, batch)
        alone = torch.cat([eval_output(exp, exp.raw_model, tuple(None if t is None else t[i:i + 1] for t in batch))
                           for i in range(4)])
    if not torch.allclose(together, alone, rtol=1e-4, atol=1e-5):
        raise violation(spec, title, f"a window's forecast changes with the other windows of its batch "
                        f"({max_difference(together, alone)} between batch 4 and one by one); keep every "
                        "reduction and index within a sample (no statistics over dim 0, and reshape/repeat "
                        "so that row b of the batch only meets row b), or declare the class attribute "
                        "batch_dependent = 'why' if the method needs it")


def check_half_precision(spec):
    """In bfloat16 throughout (the model and its inputs, no autocast), the training and the test forward
    run and give finite outputs. CUDA autocast leaves some ops in half precision that CPU autocast
    upcasts (cuFFT then takes power-of-two lengths only), so an op that needs fp32 must say so itself.
    The zoo only: a file from elsewhere (TSLib's) runs in float32, and under --use_amp where its ops allow."""
    title = "runs in half precision"
    if not in_zoo(spec):
        return
    exp = build_experiment(spec)
    model = exp.raw_model.to(torch.bfloat16)
    batch = tuple(None if t is None else t.to(torch.bfloat16) for t in first_windows(exp, "train", 2))
    test_batch = tuple(None if t is None else t.to(torch.bfloat16) for t in first_windows(exp, "test", 2))
    model.eval()
    for stage, inputs in (("train", batch), ("test", test_batch)):
        try:
            with torch.no_grad():
                pred, _ = forward(model, inputs, exp.args, stage, exp.device)
        except Exception as exc:
            raise violation(spec, title, f"the {stage} forward of a bfloat16 model on bfloat16 inputs fails "
                            f"({describe_error(exc)}); cast to float before an op half precision lacks (e.g. "
                            "torch.fft: `torch.fft.rfft(x.float(), ...)`) and back with `.to(x.dtype)`") from None
        if not torch.isfinite(pred.float()).all():
            raise violation(spec, title, f"the {stage} forward in bfloat16 gives non-finite values")


def check_template(spec):
    """forward takes four positional inputs (the experiment calls model(x_enc, x_mark_enc, x_dec, x_mark_dec)
    positionally, None for those not read; any names: TSLib's TiDE calls the fourth batch_y_mark) and requires
    nothing more, `autoregressive` a bool where set (unset: direct, as in TSLib's files), runs on CPU. The
    template's names and defaults are the zoo's house style (check_house_style)."""
    title = "template and CPU"
    with clause(spec, title, "the model file must import"):
        cls = model_class(spec)
    autoregressive = getattr(cls, "autoregressive", False)  # as exp.settings reads it
    if not isinstance(autoregressive, bool):
        raise violation(spec, title, f"class attribute autoregressive is {autoregressive!r}; "
                        "set autoregressive = False (True only for token models like Timer), or leave it out")
    if not takes_four_positional(cls.forward):
        raise violation(spec, title, f"forward{inspect.signature(cls.forward)}; the experiment calls it with four "
                        "positional inputs and nothing more: write "
                        "forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None)")
    with clause(spec, title, "the model must build and run on CPU"):
        exp = build_experiment(spec)
        off_cpu = [name for name, t in [*exp.raw_model.named_parameters(), *exp.raw_model.named_buffers()]
                   if t.device.type != "cpu"]
        if off_cpu:
            raise violation(spec, title, f"{shown(off_cpu)} not on the CPU after building; create tensors on no "
                            "particular device (the experiment moves the model)")
        output = eval_output(exp, exp.raw_model, first_windows(exp, "train", 2))
        if output.device.type != "cpu":
            raise violation(spec, title, f"output is on {output.device}")


def takes_four_positional(function):
    """Whether `function(self, a, b, c, d)` binds: four positional parameters after self (or *args), and any
    other with a default."""
    try:
        inspect.signature(function).bind(None, *range(4))
    except TypeError:
        return False
    return True


def check_house_style(spec):
    """What the zoo's files and the template carry beyond what runs (a file dropped in from TSLib need not):
    a module docstring, `autoregressive` set, forward's inputs named as the template names them (names free
    elsewhere: the experiment passes them by position) and those after x_enc defaulting to None."""
    title = "house style"
    with clause(spec, title, "the model file must import"):
        cls = model_class(spec)
    if not (inspect.getdoc(inspect.getmodule(cls)) or "").strip():
        raise violation(spec, title, "the module has no docstring; say in 2-4 lines what the model does and cite the paper")
    if not isinstance(getattr(cls, "autoregressive", None), bool):
        raise violation(spec, title, f"class attribute autoregressive is {getattr(cls, 'autoregressive', None)!r}; "
                        "set autoregressive = False (True only for token models like Timer)")
    from models import FORWARD_INPUTS

    parameters = list(inspect.signature(cls.forward).parameters.values())[1:]
    if (tuple(p.name for p in parameters[:4]) != FORWARD_INPUTS
            or not all(p.default is None for p in parameters[1:4])):
        raise violation(spec, title, f"forward{inspect.signature(cls.forward)}; write "
                        "forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None)")


# ---------------------------------------------------------------- the tests, one per clause and model

@pytest.fixture(scope="module")
def undated_data(tmp_path_factory):
    """A headerless numeric CSV without dates: mark_dim is 0 and the marks have last dimension 0."""
    folder = tmp_path_factory.mktemp("undated")
    rng = np.random.default_rng(0)
    series = np.cumsum(rng.normal(size=(400, 7)), axis=0)
    np.savetxt(folder / "undated.csv", series, delimiter=",", fmt="%.5f")
    return ["--data", "custom", "--root_path", str(folder), "--data_path", "undated.csv"]


SHAPE_CASES = {"M": ("M", 4, False), "S": ("S", 4, False), "MS": ("MS", 4, False), "batch1": ("M", 1, False),
               "undated": ("M", 4, True)}


@pytest.mark.parametrize("case", SHAPE_CASES)
@pytest.mark.parametrize("name", MODELS)
def test_output_shape(name, case, undated_data):
    features, batch_size, undated = SHAPE_CASES[case]
    check_output_shape(ModelSpec(name), features, batch_size, undated_data if undated else ())


@pytest.mark.parametrize("name", MODELS)
def test_every_parameter_gets_gradient(name):
    check_gradients(ModelSpec(name))


@pytest.fixture(scope="module")
def ddp_results(request, broken_models):
    """Every selected model's DDP steps in ONE pair of processes: a spawn costs seconds, a model's steps don't."""
    specs = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "originalname", None) == "test_ddp_training_step":
            specs.append(ModelSpec(params["name"]))
        elif getattr(item, "originalname", None) == "test_contract_catches_ddp_breakage":
            specs.append(broken_models[params["broken"]])
    return run_on_ranks(ddp_training_steps, 2, [tuple(s) for s in dict.fromkeys(specs)], timeout=300)


@pytest.mark.parametrize("name", MODELS)
def test_ddp_training_step(name, ddp_results):
    check_ddp_step(ModelSpec(name), ddp_results)


@pytest.fixture(scope="module")
def invariance_results(request):
    """Every selected model's steps in one process and in ONE pair of processes."""
    specs = [ModelSpec(getattr(item, "callspec").params["name"]) for item in request.session.items
             if getattr(item, "originalname", None) == "test_world_size_invariance"]
    specs = [tuple(s) for s in dict.fromkeys(specs)]
    return run_on_ranks(invariance_gradients, 1, specs, timeout=300), run_on_ranks(invariance_gradients, 2, specs, timeout=300)


@pytest.mark.parametrize("name", MODELS)
def test_world_size_invariance(name, invariance_results):
    check_world_size_invariance(ModelSpec(name), *invariance_results)


@pytest.mark.parametrize("name", MODELS)
def test_same_seed_same_output(name):
    check_same_seed(ModelSpec(name))


@pytest.mark.parametrize("name", MODELS)
def test_state_dict_round_trip(name, tmp_path):
    check_state_dict_round_trip(ModelSpec(name), tmp_path)


@pytest.mark.parametrize("name", MODELS)
def test_declared_inputs(name):
    check_declared_inputs(ModelSpec(name))


@pytest.mark.parametrize("name", MODELS)
def test_windows_independent(name):
    check_windows_independent(ModelSpec(name))


@pytest.mark.parametrize("name", MODELS)
def test_half_precision(name):
    check_half_precision(ModelSpec(name))


@pytest.mark.parametrize("name", MODELS)
def test_template_and_cpu(name):
    check_template(ModelSpec(name))


@pytest.mark.parametrize("name", [name for name in MODELS if in_zoo(ModelSpec(name))])
def test_house_style(name):
    check_house_style(ModelSpec(name))


# ---------------------------------------------------------------- the suite catches breakage

BROKEN_TEMPLATE = '''"""{doc}"""
import torch
from torch import nn


class Model(nn.Module):
{attributes}
    def __init__(self, configs):
        super().__init__()
        self.time = nn.Linear(configs.seq_len, configs.pred_len)
{init}
    def forward(self, {inputs}):
        out = self.time(x_enc.transpose(1, 2)).transpose(1, 2)
{forward}        return out
'''
TEMPLATE_PARTS = dict(doc="A linear map over time, broken on purpose.", attributes="    autoregressive = False\n",
                      init="", inputs="x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None", forward="")

# Small models, each breaking one clause; Declared declares and freezes its unused parameter, and passes.
BROKEN_MODELS = {
    "Unused": dict(init="        self.spare = nn.Linear(4, 4)\n"),
    "Declared": dict(attributes='    autoregressive = False\n    unused_parameters = {"spare": "kept for old checkpoints"}\n',
                     init="        self.spare = nn.Linear(4, 4).requires_grad_(False)\n"),
    "EmptyReason": dict(attributes='    autoregressive = False\n    unused_parameters = {"spare": " "}\n',
                        init="        self.spare = nn.Linear(4, 4)\n"),
    "WrongLength": dict(forward="        out = torch.cat([out, out[:, :1]], dim=1)\n"),
    "Short": dict(forward="        out = out[:, 1:]\n"),
    "NeedsDates": dict(forward="        out = out + x_mark_enc[:, :, 0].mean()  # no time features: IndexError\n"),
    # TSLib's TiDE names its fourth input batch_y_mark; it declares reading it, and checks what it is given
    "Renamed": dict(attributes='    autoregressive = False\n    inputs_used = ("x_enc", "x_mark_dec")\n',
                    init="        self.decoder_steps = configs.label_len + configs.pred_len\n",
                    inputs="x_enc, x_mark_enc=None, x_dec=None, batch_y_mark=None",
                    forward="        given = None if batch_y_mark is None else tuple(batch_y_mark.shape[:2])\n"
                            "        if given != (x_enc.shape[0], self.decoder_steps):\n"
                            "            raise ValueError(f'batch_y_mark is {given}, not the decoder marks')\n"
                            "        out = out + batch_y_mark[:, -out.shape[1]:].mean(-1, keepdim=True)  # the horizon's\n"),
    "Unseeded": dict(init="        private = torch.Generator().manual_seed(torch.initial_seed() ^ id(self))\n"
                          "        self.offset = nn.Parameter(torch.randn(1, generator=private))\n",
                     forward="        out = out + self.offset\n"),
    # a forward that moves in the last bits from call to call (as TSLib's Koopa's lstsq can): held to rounding
    "Jittery": dict(forward="        out = out + 1e-8 * torch.randn_like(out)\n"),
    "JitteryUnseeded": dict(init="        private = torch.Generator().manual_seed(torch.initial_seed() ^ id(self))\n"
                                 "        self.offset = nn.Parameter(1e-9 * torch.randn(1, generator=private))\n",
                            forward="        out = out + self.offset + 1e-8 * torch.randn_like(out)\n"),
    "NoisyEval": dict(forward="        out = out + 1e-3 * torch.randn_like(out)  # randomness, not rounding\n"),
    "Unsaved": dict(init="        self.scale = torch.rand(1) + 0.5  # a plain attribute: not in the state_dict\n",
                    forward="        out = out * self.scale\n"),
    "NoTemplate": dict(doc="", attributes="", inputs="x_enc, x_mark=None"),
    "TSLibStyle": dict(doc="", attributes="", inputs="x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None"),
    "BatchMixing": dict(forward="        out = out - out.mean(0, keepdim=True)  # statistics over the batch\n"),
    "HalfFFT": dict(forward="        out = out + torch.fft.rfft(x_enc, dim=1).abs().mean()  # no fp32 cast\n"),
    "EmptyBatchReason": dict(attributes='    autoregressive = False\n    batch_dependent = ""\n'),
    "PlainDropout": dict(init="        self.drop = nn.Dropout(0.5)\n", forward="        out = self.drop(out)\n"),
    "FunctionalDropout": dict(forward="        out = torch.nn.functional.dropout(out, 0.5, self.training)\n"),
    "Undeclared": dict(attributes='    autoregressive = False\n    inputs_used = ("x_enc",)\n',
                       forward="        if x_mark_enc is not None:  # reads time features it does not declare\n"
                               "            out = out + x_mark_enc.mean()\n"),
}


@pytest.fixture(scope="module")
def broken_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("broken_models")
    specs = {}
    for name, parts in BROKEN_MODELS.items():
        path = folder / f"{name}.py"
        path.write_text(BROKEN_TEMPLATE.format(**{**TEMPLATE_PARTS, **parts}))
        specs[name] = ModelSpec(name, str(path))
    return specs


# broken model -> (clause check, clause title, a phrase the message must contain)
BREAKAGE_CASES = {
    "EmptyReason": (check_gradients, "every parameter gets a gradient", "non-empty reason"),
    "Short": (check_output_shape, "output shape (--features M, batch 4)", "train prediction (4, 23, 7) and truth (4, 24, 7) differ"),
    "Unseeded": (check_same_seed, "same seed, same output", "disagree"),
    "Unsaved": (lambda spec: check_state_dict_round_trip(spec, Path(spec.path).parent), "state_dict round trip",
                "output differs"),
    "JitteryUnseeded": (check_same_seed, "same seed, same output", "disagree"),
    "NoisyEval": (check_same_seed, "same seed, same output", "use no randomness in eval-mode forward"),
    "NoTemplate": (check_template, "template and CPU", "write forward(self, x_enc, x_mark_enc=None"),
    "TSLibStyle": (check_house_style, "house style", "no docstring"),
    "Undeclared": (check_declared_inputs, "declared inputs", "output changes when x_mark_enc, x_dec, x_mark_dec"),
    "BatchMixing": (check_windows_independent, "windows are independent", "changes with the other windows"),
    "EmptyBatchReason": (check_windows_independent, "windows are independent", "non-empty reason"),
}


@pytest.mark.parametrize("broken", BREAKAGE_CASES)
def test_contract_catches_breakage(broken_models, broken):
    check, title, phrase = BREAKAGE_CASES[broken]
    with pytest.raises(ContractViolation) as caught:
        check(broken_models[broken])
    message = str(caught.value)
    assert message.startswith(f"{broken} breaks the model contract: {title}: "), message
    assert phrase in message, message


# broken model -> (clause check given the spec and the undated data's arguments, title, phrase): clauses the
# zoo keeps and a file from elsewhere is not held to
ZOO_ONLY_CASES = {
    "Unused": (lambda spec, undated: check_gradients(spec), "every parameter gets a gradient",
               "no gradient for spare.weight, spare.bias"),
    "WrongLength": (lambda spec, undated: check_output_shape(spec), "output shape (--features M, batch 4)",
                    "returned (4, 25, 7); expected [B, pred_len, C]"),
    "HalfFFT": (lambda spec, undated: check_half_precision(spec), "runs in half precision", "Unsupported dtype BFloat16"),
    "NeedsDates": (lambda spec, undated: check_output_shape(spec, "M", 4, undated),
                   "output shape (--features M, batch 4, undated data)", "IndexError"),
}


@pytest.mark.parametrize("broken", ZOO_ONLY_CASES)
def test_zoo_only_clauses(broken_models, undated_data, broken):
    """A file from elsewhere passes a clause only the zoo carries (TSLib's SCINet returns seq_len + pred_len
    steps, FiLM fails in bfloat16, TiDE needs time features, FreTS leaves parameters without gradient); the same
    file held as a zoo model fails it."""
    check, title, phrase = ZOO_ONLY_CASES[broken]
    spec = broken_models[broken]
    check(spec, undated_data)
    with pytest.raises(ContractViolation) as caught:
        check(spec._replace(zoo=True), undated_data)
    message = str(caught.value)
    assert message.startswith(f"{broken} breaks the model contract: {title}: "), message
    assert phrase in message, message


def test_forward_rounding_is_the_models_own(broken_models):
    """A forward whose output moves in the last bits between calls (TSLib's Koopa: torch.linalg.lstsq) passes the
    same-seed and round-trip clauses when the weights are bit-equal; JitteryUnseeded and NoisyEval above fail."""
    spec = broken_models["Jittery"]
    check_same_seed(spec)
    check_state_dict_round_trip(spec, Path(spec.path).parent)


def test_zoo_membership():
    """The zoo's clauses go by models.ZOO, except for a file dropped in under a zoo name (TSLib's TiDE.py in
    lab/tslib_models.py's scratch copy: TSL_CONTRACT_DROPPED_IN) or a self-test's explicit flag."""
    assert in_zoo(ModelSpec("TiDE")) and not in_zoo(ModelSpec("SCINet"))
    with mock.patch(f"{__name__}.DROPPED_IN", frozenset({"TiDE"})):
        assert not in_zoo(ModelSpec("TiDE")) and in_zoo(ModelSpec("DLinear"))
        assert in_zoo(ModelSpec("TiDE", zoo=True))
    assert not in_zoo(ModelSpec("DLinear", "/elsewhere/DLinear.py", zoo=False))


def test_forward_inputs_go_by_position(broken_models):
    """The experiment calls forward by position: a file whose fourth input is batch_y_mark (TSLib's TiDE) and
    declares reading it as x_mark_dec gets the decoder's time features, [B, label_len + pred_len, mark_dim],
    and the contract's own calls pass it the same way. The template's names are the zoo's house style."""
    spec = broken_models["Renamed"]
    check_template(spec)
    check_declared_inputs(spec)
    check_output_shape(spec)
    check_template(spec._replace(zoo=True))
    with pytest.raises(ContractViolation, match="Renamed breaks the model contract: house style: forward"):
        check_house_style(spec._replace(zoo=True))


def test_contract_catches_the_official_timemixer_calendar_pairing():
    """TimeMixer pairing calendars as its official code does (--mark_pairing tiled: marks tiled with
    .repeat after the [B*C] reshape) breaks the independence clause; the default pairing passes it."""
    spec = ModelSpec("TimeMixer")
    check_windows_independent(spec)
    with mock.patch(f"{__name__}.CONTRACT_ARGS", (*CONTRACT_ARGS, "--mark_pairing", "tiled")):
        with pytest.raises(ContractViolation, match="changes with the other windows"):
            check_windows_independent(spec)


def test_contract_keys_nn_dropout_and_catches_functional_dropout(broken_models):
    """A plain nn.Dropout trains alike as 1 x 8 and 2 x 4 (the experiment converts it to a sample-keyed
    KeyedDropout when it builds the model); F.dropout in forward draws from each process's generator, and the
    world-size clause says what to use instead."""
    specs = [tuple(broken_models[name]) for name in ("PlainDropout", "FunctionalDropout")]
    single, pair = (run_on_ranks(invariance_gradients, ranks, specs, timeout=300) for ranks in (1, 2))
    check_world_size_invariance(broken_models["PlainDropout"], single, pair)
    with pytest.raises(ContractViolation, match="use nn.Dropout modules"):
        check_world_size_invariance(broken_models["FunctionalDropout"], single, pair)


def test_zoo_models_import_layers_dropout_only_for_a_measured_faster_path():
    """Model files use plain nn.Dropout (the experiment keys it); one that draws masks with layers.dropout
    keeps a measured faster path, and its docstring says so."""
    import ast

    from models import model_files

    for name in MODELS:
        tree = ast.parse(model_files()[name].read_text())
        imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "layers.dropout"]
        if imports:  # a measured faster path, or dropout the experiment cannot reach (a package's fused kernel)
            doc = ast.get_docstring(tree)
            assert "measured faster path" in doc or "dropout that follows the sample" in doc, (
                f"{model_files()[name]} imports layers.dropout without naming the measured faster path it keeps, "
                "or the dropout it keys itself so that it follows the sample")


def test_contract_runs_a_tslib_style_file(broken_models):
    """TSLib's files carry no module docstring and no `autoregressive`, and their forward's inputs have no
    defaults: the experiment runs them as direct models, so only the zoo's house style asks for those."""
    spec = broken_models["TSLibStyle"]
    check_template(spec)
    check_output_shape(spec)


def test_contract_accepts_a_declared_unused_parameter(broken_models):
    spec = broken_models["Declared"]
    check_gradients(spec)
    check_template(spec)


@pytest.mark.parametrize("broken,fails", [("Unused", False), ("Declared", False)])
def test_contract_catches_ddp_breakage(broken_models, ddp_results, broken, fails):
    """A parameter no training forward reads no longer breaks DDP: the clause, as training does, lets the
    experiment probe for it and wrap DDP with find_unused_parameters (Exp_Basic.allow_unused_parameters);
    that the zoo builds no such parameter is the gradient clause's (zoo only)."""
    spec = broken_models[broken]
    if not fails:
        check_ddp_step(spec, ddp_results)
        return
    with pytest.raises(ContractViolation) as caught:
        check_ddp_step(spec, ddp_results)
    message = str(caught.value)
    assert message.startswith(f"{broken} breaks the model contract: {DDP_STEPS} DDP training steps"), message
    assert "not used in producing loss" in message, message
