"""What a run's arguments mean once the data and the model are known, decided before any work.

`resolve_args(args, world_size)` fills what the data and the model family decide (shapes,
the forward inputs, M4's horizons, the global batch and its learning rate, the objective, the
setting's name) and rejects every impossible setting, with no process group: run.py calls it
before distributed.setup, so a bad argument ends every rank alike before any collective. It
returns the settled run (`Run`): read-only from then on; the model gets a copy (`model_configs`).
"""
import argparse
import hashlib
import json
import logging
import os
import sys

import torch

from data_provider.data_factory import prepared_data, window_for
from data_provider.competitions import COMPETITIONS, competition_settings
from data_provider.m4 import M4, M4_LOSSES, short_term_settings
from data_provider.splits import SPLITS
from exp.adaptation import check_adaptation_args, check_series_as_given
from exp.scoring import check_mase_history
from models import FORWARD_INPUTS, canonical_name, get_model_class, inputs_used, missing_module_line
from models.foundation import export_formats
from utils import distributed
from utils.arguments import FORECAST_TASKS, MODEL_SHAPING_ARGS, OTHER_TSLIB_TASKS, SEED_LIMIT
from utils.checkpoint import checkpoint_path, identity_differences, load_weights, weights_being_trained
from utils.errors import UserError, require
from utils.probabilistic import LOSSES, POINT_LOSSES, native_levels, objective_for, parse_levels
from utils.tools import LearningRateSchedule, global_batch_size, scaled_learning_rate, seed_everything

logger = logging.getLogger("tsl")


class SettledError(AttributeError):
    """A write to a settled run: what a run does is decided once, in resolve_args."""


class Run(argparse.Namespace):
    """A run's arguments once resolve_args has settled them: every command-line argument under its own name
    (args.seq_len, ...) beside what resolve_args decided (shapes, model family, M4's horizons, the batch plan,
    the learning rate's start) and the fields of RUN_FIELDS, which are not arguments. Read-only: assigning or
    deleting raises SettledError; `replace` gives another run."""

    # not arguments: the training objective (utils.probabilistic; None for a point loss), the names the command
    # line gave, the setting's folder name, where --is_training 0's weights come from (weights_source). Neither
    # metrics.json's "args" nor a model's configs hold them.
    RUN_FIELDS = ("objective", "given", "setting", "weights_source")

    def __setattr__(self, name, value):
        raise SettledError(f"the run is settled: {name} cannot change after exp.settings.resolve_args; decide it "
                           f"there, or make another run with run.replace({name}=...)")

    def __delattr__(self, name):
        raise SettledError(f"the run is settled: {name} cannot be removed after exp.settings.resolve_args")

    @property
    def width(self):
        """How many times the model's horizon is widened: 1 for a point loss, and for a model that forecasts its
        quantiles natively (it returns them as a last dimension of their own)."""
        return 1 if self.objective is None or self.objective.native else self.objective.width

    def replace(self, **changes):
        """This run with `changes`, settled too (the objective kept: change no field it is built from)."""
        run = argparse.Namespace(**{**vars(self), **changes})
        run.__class__ = Run
        return run

    def for_itr(self, ii):
        """Run `ii` of --itr: the seed --seed + ii (the model's and the loaders'; the data keeps --synthetic_seed)
        and that run's setting name."""
        run = self.replace(seed=self.seed + ii)
        vars(run)["setting"] = setting_name(run, ii)
        return run


def settle(args):
    """`args` as a settled Run, in place: the objective is built here, once (None for a point loss)."""
    if isinstance(args, Run):
        return args
    args.objective = objective_for(args)
    args.setting = setting_name(args, 0)
    args.__class__ = Run
    return args


def model_configs(run):
    """The plain argparse.Namespace a model is built from (TSLib's `configs`): the run's arguments, a copy the
    model may keep and change without changing the run. configs.output_width is how many values it forecasts a
    step: 1, or with a probabilistic --loss `run.width`, and then its horizon (pred_len; a token model's
    output_token_len) is that many times the run's, read back as `width` blocks of the true one (exp.forward;
    models/README.md)."""
    configs = argparse.Namespace(**{k: v for k, v in vars(run).items() if k not in Run.RUN_FIELDS})
    configs.output_width = width = run.width
    if width == 1:
        return configs
    if run.autoregressive:
        configs.output_token_len = run.output_token_len * width
    else:
        configs.pred_len = run.pred_len * width
    return configs


def fill_defaults(args):
    """Defaults that other arguments decide, before the model is known: --model in the registry's
    spelling (OpenLTM's timer_xl is TimerXL, in setting names too), the data's seed is --seed's (the
    --itr loop then changes the run's seed, never the data), and the loaders gather every forward
    input until resolve_args narrows them to what --model reads."""
    args.model = canonical_name(args.model)
    if args.synthetic_seed is None:
        args.synthetic_seed = args.seed
    args.model_inputs = FORWARD_INPUTS
    return args


def model_class(args):
    """The Model class of --model (models/<Name>.py); `--model Ensemble`'s is built from --members (exp.ensemble)."""
    from exp import ensemble

    if ensemble.is_ensemble(args.model):  # each member settled and built by this module, handed over
        return ensemble.ensemble_class(args, sys.modules[__name__])
    ensemble.check_not_an_ensemble(args)
    return get_model_class(args.model)


def resolve_args(args, world_size):
    """Settle the parsed `args` in place for a run on `world_size` processes and return them as a Run (read-only
    from then on); a UserError for anything impossible. Reads the data (cached per process), never a process
    group. A settled run is returned as it is."""
    if isinstance(args, Run):
        return args
    args.ddp = args.ddp or distributed.launched_by_torchrun()  # a worker of torchrun (or of srun, adopted)
    check_task(args)
    check_setting_parts(args)
    fill_defaults(args)
    cls = model_class(args)
    _native_quantiles(args, cls)
    _check_probabilistic(args, cls)
    args.autoregressive = bool(getattr(cls, "autoregressive", False))
    args.computes_loss = bool(getattr(cls, "computes_loss", False))  # trains on its own objective (exp.forward)
    require(not (args.computes_loss and args.autoregressive),
            f"model {args.model}: a token model (autoregressive) cannot declare computes_loss; its tokens are scored")
    check_task_fits_model(args)
    args.model_inputs = inputs_used(cls)  # the loader gathers only what the model reads
    # every number is in its range already (utils.arguments' types); what is left are relations
    data = prepared_data(args)
    _fill_shapes(args, data, cls)
    require(args.label_len <= args.seq_len,
            f"--label_len must be between 0 and --seq_len ({args.seq_len}), got {args.label_len}")
    _check_windows(args, data)
    check_series_as_given(args, cls)  # a release sees each series as given: per-series scaling is refused
    require(args.seed + args.itr - 1 < SEED_LIMIT,
            f"--seed {args.seed} with --itr {args.itr} passes the largest seed, {SEED_LIMIT - 1}; use a smaller --seed")
    _split_data_parallel_batch(args, world_size)
    _split_global_batch(args, world_size)
    args.global_batch_size = global_batch_size(args, world_size)
    args.scaled_learning_rate = scaled_learning_rate(args, args.global_batch_size)  # the schedule's start
    LearningRateSchedule.check(args.lradj)  # an unknown --lradj fails before any training
    _check_weights_sources(args)
    _check_lora(args)
    if args.autoregressive:
        _check_tokens(args)
    _check_devices(args)
    if args.loss not in POINT_LOSSES and args.task_name != "short_term_forecast":  # short-term: its own scoring
        check_mase_history(args)  # a series shorter than one season: one line before anything runs
    _check_setting_length(args)
    return settle(args)


def _check_probabilistic(args, cls):
    """--loss, --quantiles and --num_samples (utils.probabilistic), before any data or model is touched. A model
    that samples its forecast itself declares `default_num_samples`, which --num_samples overrides."""
    require(args.loss in LOSSES, f"unknown --loss '{args.loss}'; choose one of {', '.join(LOSSES)}")
    own_samples = getattr(cls, "default_num_samples", None)
    if own_samples is not None:
        args.num_samples = args.num_samples or int(own_samples)
    else:
        require(args.num_samples is None or args.loss in ("studentt", "normal"),
                f"--num_samples draws samples from a distribution forecast; --loss {args.loss} forecasts "
                + ("quantiles directly" if args.loss == "quantile" else "one point") + ": drop --num_samples, or "
                "use --loss studentt or normal")
    if args.loss not in POINT_LOSSES:
        parse_levels(args.quantiles)  # levels in (0, 1), increasing, once each, with 0.5; settle builds the objective


def _native_quantiles(args, cls):
    """A model that forecasts quantiles natively (`quantile_levels`, a released foundation model) is scored and
    trained as one: --loss quantile at its own levels (the pinball loss over them, its training objective)."""
    levels = native_levels(cls)
    args.native_quantiles = None if levels is None else list(levels)
    if levels is None:
        return
    text = ",".join(f"{q:g}" for q in levels)
    given = "quantiles" in args.given
    require(not given or parse_levels(args.quantiles) == levels,
            f"model {args.model} forecasts the quantiles {text} itself; --quantiles {args.quantiles} asks for others: "
            "leave --quantiles out")
    require(args.loss in POINT_LOSSES + ("quantile",),
            f"model {args.model} forecasts quantiles ({text}), not a distribution: --loss {args.loss} cannot train "
            "it; leave --loss out (it trains on the pinball loss over its quantiles)")
    require(not getattr(cls, "autoregressive", False), f"model {args.model}: a token model cannot declare quantile_levels")
    if args.loss != "quantile" and distributed.is_main():
        logger.info(f"model {args.model} forecasts the quantiles {text}: --loss quantile at those levels")
    args.loss, args.quantiles = "quantile", text


def check_task(args):
    """Forecasting is what this codebase does; TSLib's other tasks are refused in one line, before any data is read."""
    task = args.task_name
    words = task.replace("_", " ")
    require(task not in OTHER_TSLIB_TASKS,
            f"--task_name {task} is TSLib's {words} task, which this codebase does not do: it does long-term "
            "forecasting (--task_name long_term_forecast, OpenLTM's forecast, or zero_shot_forecast) and M4's "
            "short-term forecasting only; run "
            f"{task} with TSLib")
    require(task in FORECAST_TASKS, f"unknown --task_name '{task}'; choose one of {', '.join(FORECAST_TASKS)} "
                                    "(TSLib's long-term forecasting, OpenLTM's name for it with its token models "
                                    "Timer and TimerXL, TSLib's zero-shot forecasting, TSLib's short-term "
                                    "forecasting of M4)")
    require(task != "zero_shot_forecast" or (not args.is_training and args.pretrain_model_path),
            "--task_name zero_shot_forecast evaluates pre-trained weights without training: add --is_training 0 "
            "--pretrain_model_path FILE")
    if task == "short_term_forecast" or args.data in (M4, *COMPETITIONS):
        whose = "TSLib's" if args.data == M4 else "a"
        require(task == "short_term_forecast", f"--data {args.data} is {whose} short-term forecasting benchmark: use "
                                               f"--task_name short_term_forecast (not {task})")
        # TSLib's short-term task: the frequency's horizon, an input twice it, a decoder label of it, MASE's lag
        settings = competition_settings if args.data in COMPETITIONS else short_term_settings
        args.pred_len, args.seq_len, args.label_len, args.frequency_map = settings(args)
        if getattr(model_class(args), "whole_history", False):  # Naive2: M4's reference reads each series whole
            args.seq_len = max(args.seq_len, *(len(s) for s in prepared_data(args).series))
    else:
        require(args.loss not in M4_LOSSES, f"--loss {args.loss} trains on M4 (--data m4) only; choose MSE or MAE")


def check_task_fits_model(args):
    """OpenLTM's `forecast` names the task of its token models; TSLib's models branch on TSLib's task names
    (their forward returns None for any other), so a direct model takes TSLib's name."""
    require(args.task_name != "forecast" or args.autoregressive,
            f"--task_name forecast is OpenLTM's name for its token models (Timer, TimerXL); {args.model} forecasts "
            "in one pass, as TSLib's models, which know TSLib's task names only: use --task_name long_term_forecast")


def zero_shot(args):
    """`--is_training 0 --pretrain_model_path FILE`: pre-trained weights evaluated on this data set, untrained.
    With --adaptation too, the arguments are a fine-tuning run's: its fine-tuned weights are evaluated (a model
    that builds its sizes from the released folder, a foundation model, still reads them there)."""
    return not args.is_training and bool(args.pretrain_model_path) and not args.adaptation


# Where --is_training 0's weights come from (Run.weights_source; None when the run trains): --pretrain_model_path
# (zero-shot), --checkpoint, OpenLTM's --test_dir, or the setting's own folder, a fine-tuning run's with --adaptation.
WEIGHTS_SOURCES = ("pretrain_model_path", "checkpoint", "test_dir", "setting")


def _check_weights_sources(args):
    """Training may start from --pretrain_model_path (--adaptation); --is_training 0 evaluates one set of
    weights, named by one of --pretrain_model_path (zero-shot), --checkpoint and --test_dir, or none (the
    setting's). Sets args.weights_source."""
    args.weights_source = None
    if args.is_training:
        check_adaptation_args(args)
        return
    sources = ("checkpoint", "test_dir") if args.adaptation else ("pretrain_model_path", "checkpoint", "test_dir")
    named = [name for name in sources if getattr(args, name)]
    require(len(named) <= 1, f"--is_training 0 evaluates one set of weights, but "
                             f"{' and '.join(f'--{name} {getattr(args, name)}' for name in named)} each name one; "
                             "keep one of them")
    args.weights_source = named[0] if named else "setting"
    if not named and getattr(model_class(args), "needs_no_training", False):  # a baseline: nothing to load
        args.weights_source = None
    if not zero_shot(args):
        check_adaptation_args(args)


def evaluated_weights(args, setting):
    """(path, pretrained) of the weights --is_training 0 evaluates (_weights_to_evaluate), once rank 0 has
    checked them against their training record: a collective, every rank raises the refusal together. (None, False)
    for a model that needs no training and is given no weights."""
    if args.weights_source is None:
        return None, False
    path, pretrained = _weights_to_evaluate(args, setting)
    distributed.raise_on_every_rank(lambda: weights_being_trained(path), on="main")  # not while a run writes them
    if not pretrained:  # zero-shot: pre-trained weights on other data, under arguments of their own by design
        distributed.raise_on_every_rank(lambda: trained_otherwise(path, args), on="main")
    return path, pretrained


# What --is_training 0 compares with the evaluated weights' training record, as --resume compares a training
# state: the arguments that decide what the model computes. Not: --dropout (off in evaluation); what the data
# decides (enc_in, dec_in, c_out, mark_dim, --features: a channel-independent model may be evaluated on other
# data, and a mis-shaped weight fails the strict load); seq_len and pred_len (in the setting's name, and the
# shapes of a direct model's weights; a token model may be evaluated on other lengths).
NOT_EVALUATION_IDENTITY = ("dropout", "enc_in", "dec_in", "c_out", "mark_dim", "features", "seq_len", "pred_len")
EVALUATION_IDENTITY = tuple(name for name in MODEL_SHAPING_ARGS if name not in NOT_EVALUATION_IDENTITY)


def trained_otherwise(weights, args):
    """None, or the one line refusing to evaluate `weights` under model arguments other than those that trained
    them, as the training state beside them (last.pth: the run's identity) records. Weights without one (another
    program's file, a copy) are evaluated as given."""
    record = os.path.join(os.path.dirname(weights), "last.pth")
    if not os.path.isfile(record):
        return None
    try:  # memory-mapped: only the identity is read, not the weights and optimizer state
        state = torch.load(record, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises many types for a truncated or foreign file
        logger.warning(f"cannot read {record} ({type(exc).__name__}), the training record beside {weights}: "
                       "the model arguments are not checked against those that trained the weights")
        return None
    saved = state.get("identity") if isinstance(state, dict) else None
    if not isinstance(saved, dict):
        return None
    # an argument newer than the record is not compared: the record cannot say what trained the weights
    differing = identity_differences(saved, {n: getattr(args, n) for n in EVALUATION_IDENTITY if n in saved})
    if not differing:
        return None
    return (f"cannot evaluate {weights}: it was trained under other model arguments ({record} records them): "
            f"{'; '.join(differing)}. Evaluate with the arguments it was trained with (compared: --model, "
            "--label_len, the token lengths, --covariate and the model's arguments but --dropout)")


def _weights_to_evaluate(args, setting):
    """(path, pretrained) of the weights --is_training 0 evaluates: --pretrain_model_path (zero-shot), --checkpoint,
    OpenLTM's <checkpoints>/<test_dir>/<test_file_name>, else <checkpoints>/<setting>/<test_file_name> (default
    checkpoint.pth). OpenLTM's rolling-forecast scripts give a --test_dir in a setting format that no run writes
    (not even OpenLTM's): when it holds no such file but this setting's folder does, those weights are the ones
    these arguments trained, and they are evaluated, with a warning. Only rank 0 reads the file."""
    source = args.weights_source
    if source == "pretrain_model_path":
        return args.pretrain_model_path, True
    if source == "checkpoint":
        return args.checkpoint, False
    own = checkpoint_path(args, setting, args.test_file_name or "checkpoint.pth")
    if args.pretrain_model_path and distributed.is_main():  # --adaptation: a fine-tuning run's weights, said so
        logger.warning(f"--is_training 0 with --adaptation evaluates the fine-tuned weights of setting {setting}, not "
                       f"--pretrain_model_path {args.pretrain_model_path}; drop --adaptation to evaluate those zero-shot")
    if source == "setting":
        return own, False
    named = os.path.join(args.checkpoints, args.test_dir, args.test_file_name or "checkpoint.pth")
    if os.path.exists(named) or not os.path.exists(own):
        return named, False
    if distributed.is_main():
        logger.warning(f"--test_dir: {named} does not exist; evaluating {own}, which these arguments trained")
    return own, False


def _fill_shapes(args, data, cls):
    """The channel counts come from the data; a given --enc_in/--dec_in/--c_out must agree (TSLib's
    scripts pass them), since a model either ignores a wrong one or fails on it. A model that
    reads one as a width of its own lists it in `Model.not_from_data` (TiDE's --c_out)."""
    n_channels = len(data.columns)
    args.mark_dim = data.mark_dim  # time features per step (0 for undated data)
    decided = {"enc_in": (n_channels,), "dec_in": (n_channels,),
               # MS scores the target alone: one output channel, or all of them as TSLib's MS scripts give
               "c_out": (1, n_channels) if args.features == "MS" else (n_channels,)}
    for name, allowed in decided.items():
        given = getattr(args, name)
        if given is None or name in getattr(cls, "not_from_data", ()):
            setattr(args, name, given or allowed[0])
            continue
        require(given in allowed,
                f"--{name} {given} does not match the data: {args.data} has {n_channels} channel(s) with --features "
                f"{args.features}, so --{name} is {' or '.join(map(str, allowed))}; drop --{name} (the data decides it)")
    require(args.autoregressive or args.test_pred_len in (None, args.pred_len),
            f"--test_pred_len {args.test_pred_len}: {args.model} forecasts --pred_len ({args.pred_len}) steps in one "
            "pass and does not roll out; drop --test_pred_len, or evaluate weights trained for --pred_len "
            f"{args.test_pred_len}")
    args.test_seq_len = args.test_seq_len or args.seq_len
    args.test_pred_len = args.test_pred_len or args.pred_len


def _check_windows(args, data):
    """Every split the run reads holds a window (seq_len + horizon rows), checked on the data before anything is
    allocated: the model's size follows pred_len (a DLinear of --pred_len 1e8 weighs 38 GB), and it is built
    after this. The data kind raises the one line naming the split and its length."""
    for flag in SPLITS if args.is_training else ("val", "test"):
        data.window_dataset(flag, window_for(args, flag), with_marks=False)


def build_model(args):
    """The Model of --model for a settled run (resolve_args; a plain Namespace is settled as a copy), on the CPU,
    built from model_configs. Models refuse impossible arguments in their constructor with ValueError (d_model
    not divisible by n_heads, PatchTST's patch_len or TimeMixer's scales past seq_len); that becomes the run's one
    line. Every rank builds the same model from the same arguments, so every rank raises it together."""
    args = args if isinstance(args, Run) else settle(argparse.Namespace(**vars(args)))
    width = args.width
    try:
        model = model_class(args)(model_configs(args))
    except ValueError as exc:
        raise UserError(f"model {args.model} cannot be built with these arguments: {exc}; change those arguments") from None
    except ModuleNotFoundError as missing:  # a layer importing its package when built (TSLib's ReformerLayer)
        if missing.name is None:
            raise
        raise UserError(missing_module_line(args.model, missing)) from None
    if width > 1 or getattr(args, "native_quantiles", None):
        _require_widened_output(model, args, width)
    return model


@torch.no_grad()
def _require_widened_output(model, args, width):
    """A model whose output does not lengthen with pred_len (output_token_len) cannot forecast `width` values a
    step: one line, before anything is trained or written. One forward of a zero window, in eval mode."""
    from exp.forward import decoder_inputs  # exp.forward imports this module's neighbours, not it

    x = torch.zeros(1, args.seq_len, args.enc_in)
    x_mark = torch.zeros(1, args.seq_len, args.mark_dim)
    y = torch.zeros(1, args.label_len + args.pred_len, args.dec_in)
    y_mark = torch.zeros(1, args.label_len + args.pred_len, args.mark_dim)
    inputs = {"x_enc": x, "x_mark_enc": x_mark}
    if not args.autoregressive:
        inputs["x_dec"], inputs["x_mark_dec"] = decoder_inputs(y, y_mark, args, width)
    used = [inputs.get(name) if name in args.model_inputs else None for name in FORWARD_INPUTS]
    was_training = model.training
    model.eval()
    try:
        out = model(*used)
    finally:
        model.train(was_training)
    steps = (args.seq_len // args.input_token_len * args.output_token_len if args.autoregressive else args.pred_len)
    native = getattr(args, "native_quantiles", None)
    if native:  # [B, pred_len, C, its levels]
        shape = None if out is None else tuple(out.shape)
        require(shape is not None and len(shape) == 4 and shape[1] >= steps and shape[3] == len(native),
                f"model {args.model} declares quantile_levels ({len(native)} levels), so its forward must return "
                f"[B, pred_len, C, {len(native)}]; it returned {shape} for pred_len {steps}")
        return
    got = None if out is None or out.dim() < 2 else out.shape[1]
    require(got is not None and got >= steps * width,
            f"--loss {args.loss} needs {width} values a step, asked of model {args.model} as a {width} times longer "
            f"{'output_token_len' if args.autoregressive else 'pred_len'}, but it returned {got} steps for "
            f"{steps * width}: its output does not follow configs.{'output_token_len' if args.autoregressive else 'pred_len'}; "
            "train it with --loss MSE or MAE, or have its output length follow that argument")


def _check_lora(args):
    """--lora_alpha, --lora_dropout and --lora_targets shape adapters only --lora_rank makes (exp.lora)."""
    stray = [f"--{name}" for name in ("lora_alpha", "lora_dropout", "lora_targets") if name in getattr(args, "given", ())]
    require(args.lora_rank or not stray,
            f"{', '.join(stray)} without --lora_rank changes nothing; add --lora_rank (e.g. 8) to fine-tune LoRA "
            "adapters, or leave them out for full fine-tuning")


def _check_tokens(args):
    token = args.input_token_len
    for name in ("seq_len", "test_seq_len"):
        require(getattr(args, name) % token == 0,
                f"--{name} ({getattr(args, name)}) must be a multiple of --input_token_len ({token}) "
                f"for token model {args.model}")
    require(not args.nonautoregressive or args.output_token_len >= args.test_pred_len,
            f"--nonautoregressive forecasts in one step, so --output_token_len ({args.output_token_len}) "
            f"must cover --test_pred_len ({args.test_pred_len})")


def data_parallel(args):
    """TSLib's --use_multi_gpu or OpenLTM's --dp: DataParallel there, DDP over --devices here."""
    return args.use_multi_gpu or args.dp


def _split_data_parallel_batch(args, world_size):
    """Under --use_multi_gpu / --dp, --batch_size is DataParallel's: the whole batch, split between the
    devices. Here each device is a DDP process, so each takes an equal share (the global batch stays
    --batch_size), and --gpu, which TSLib and OpenLTM overwrite with the first device, decides nothing."""
    if not data_parallel(args):
        return
    if world_size == 1:
        if args.devices:
            args.gpu = args.devices[0]  # one device: a single process on it
        return
    args.gpu = None
    whole = getattr(args, "data_parallel_batch_size", None) or args.batch_size  # resolved twice: split once
    flag = "--use_multi_gpu" if args.use_multi_gpu else "--dp"
    require(whole % world_size == 0,
            f"--batch_size {whole} cannot be split evenly between the {world_size} processes of {flag} (as in "
            f"DataParallel, it is the whole batch, shared by the devices); use a multiple of {world_size}")
    args.data_parallel_batch_size = whole
    args.batch_size = whole // world_size


def _split_global_batch(args, world_size):
    """--global_batch_size G: each micro-batch holds G / (processes x accumulation steps) windows, as evenly as
    possible (data_provider.global_batches); --batch_size becomes the largest (memory, the evaluation batch)."""
    if not getattr(args, "global_batch", None):
        return
    micro_batches = world_size * args.accumulation_steps
    require(args.global_batch >= micro_batches,
            f"--global_batch_size {args.global_batch} is smaller than the {world_size} processes x "
            f"{args.accumulation_steps} accumulation steps, so some micro-batch would hold no window; use at least "
            f"{micro_batches}")
    largest = -(-args.global_batch // micro_batches)
    if "batch_size" in args.given and args.batch_size != largest and distributed.env_rank() == 0:
        logger.warning(f"--batch_size {args.batch_size} is replaced by --global_batch_size {args.global_batch}: "
                       f"micro-batches of up to {largest} windows on each of {world_size} process(es); to hold them "
                       "smaller, add --accumulation_steps")
    args.batch_size = largest


def _check_devices(args):
    """What only a GPU can run: distributed.setup computes on CUDA exactly when this holds."""
    require(args.gpu_type != "mps", "--gpu_type mps: this codebase runs on CUDA GPUs or the CPU, not on Apple's MPS "
                                    "(PyTorch's DDP has no MPS backend); drop --gpu_type mps to run on the CPU")
    cuda = args.use_gpu and torch.cuda.is_available()
    require(not (args.use_amp and args.amp_dtype == "fp16" and not cuda),
            "--amp_dtype fp16 needs a GPU; on CPU use bf16 (the default)")
    # GPUs before Ampere (V100, T4) have no bfloat16: CUDA autocast would fail at the first forward
    require(not (args.use_amp and args.amp_dtype == "bf16" and cuda and not torch.cuda.is_bf16_supported()),
            "--use_amp uses bfloat16, which this GPU does not support; add --amp_dtype fp16 (with loss scaling)")
    require(not (args.data_on_device == "always" and args.num_workers > 0),
            f"--data_on_device always gathers batches on the GPU, which --num_workers {args.num_workers} loader "
            "processes cannot do; drop --num_workers, or use --data_on_device auto or never")
    check_gpu_choice(args.ddp, args.gpu)
    _check_fsdp(args)
    # layers.checkpointing re-enters the forward's keyed draws around each recompute, which torch.compile cannot trace
    require(not (args.activation_checkpointing and args.compile),
            "--activation_checkpointing cannot be combined with --compile (torch.compile does not trace the recompute "
            "that replays each block's random draws); drop one of them")


def _check_fsdp(args):
    """--fsdp is one choice of the distribution setting (DDP, --zero, --fsdp), without the options that
    do not compose with its sharded copy of the model. On one process it shards nothing and trains as DDP."""
    mixed = args.fsdp_mixed_precision != "none"
    require(not mixed or (args.fsdp and args.ddp),
            f"--fsdp_mixed_precision {args.fsdp_mixed_precision} is FSDP2's, which runs in a process group: add --fsdp "
            "and --ddp (one process is enough), or use --use_amp for mixed precision without FSDP2")
    if not args.fsdp:
        return
    clash = [flag for flag, given in (("--zero", args.zero), ("--compile", args.compile),
                                      ("--amp_dtype fp16", args.use_amp and args.amp_dtype == "fp16"),
                                      ("--lora_rank", getattr(args, "lora_rank", 0))) if given]
    require(not clash, f"--fsdp cannot be combined with {', '.join(clash)}: --fsdp already shards the Adam state "
                       "(drop --zero), trains uncompiled, without fp16 loss scaling, and all the weights (LoRA's "
                       "few adapters train under DDP); drop " + ", ".join(clash) + " or drop --fsdp")


def check_gpu_choice(ddp, gpu):
    """--gpu names a single process's GPU: refused under --ddp (run.py's and benchmarks.gift_eval's check)."""
    require(not (ddp and gpu is not None),
            f"--gpu {gpu} picks the GPU of a single-process run; under --ddp each process uses the GPU of "
            "its LOCAL_RANK: drop --gpu (set CUDA_VISIBLE_DEVICES to choose which GPUs the job sees)")


# The arguments setting_name joins as they are given: each becomes part of a folder name under --checkpoints and
# --results_dir, so each must be one harmless piece of a file name.
SETTING_PARTS = ("task_name", "model_id", "model", "data", "features", "des")
NAME_MAX = 255  # bytes of one file name on Linux's file systems (and macOS')


def check_setting_parts(args):
    """A setting part that is empty, holds a path separator or '..' (--model_id 'x/../../escaped' wrote
    checkpoint.pth outside --checkpoints), or a control character (NUL, a newline) is refused in one line."""
    for name in SETTING_PARTS:
        value = str(getattr(args, name))
        unsafe = ("is empty" if not value else
                  "holds a path separator" if "/" in value or "\\" in value else
                  "holds '..'" if ".." in value else
                  "holds a control character" if any(ord(c) < 32 or ord(c) == 127 for c in value) else None)
        require(unsafe is None, f"--{name} {value!r} {unsafe}, but it is part of the name of the run's folders "
                                "under --checkpoints and --results_dir (the setting); use letters, digits, '-', '_' "
                                "and single dots")


def _check_setting_length(args):
    """The longest setting name of the run (its last --itr, whose seed is the largest) fits in one file name."""
    last = argparse.Namespace(**{**vars(args), "seed": args.seed + args.itr - 1})
    name = setting_name(last, args.itr - 1)
    size = len(name.encode())
    require(size <= NAME_MAX, f"the setting name {name[:60]}... is {size} bytes long, longer than the {NAME_MAX} a "
                              "file name may have (it names the run's folders under --checkpoints and --results_dir); "
                              "shorten --model_id or --des")


def setting_name(args, ii):
    """The folder name of run `ii` under --checkpoints and --results_dir: TSLib's, with the seed
    before the run index, so two seeds never share checkpoints or metrics.json (the training
    state's identity and the setting lock guard the other arguments)."""
    parts = [args.task_name, args.model_id, args.model, args.data, f"ft{args.features}", f"sl{args.seq_len}",
             f"ll{args.label_len}", f"pl{args.pred_len}", f"dm{args.d_model}", f"nh{args.n_heads}",
             f"el{args.e_layers}", f"dl{args.d_layers}", f"df{args.d_ff}"]
    if args.autoregressive:
        parts += [f"it{args.input_token_len}", f"ot{args.output_token_len}"]
    if args.loss not in POINT_LOSSES:  # a probabilistic model is another model: its own folder
        parts.append(args.loss)
    if getattr(args, "members", None):  # an ensemble is its members and its rule: each its own folder
        from exp.ensemble import named_path

        members = ",".join(os.path.realpath(named_path(item)[1]) for item in args.members.split(","))
        parts.append(f"{args.ensemble_rule}{hashlib.sha256(members.encode()).hexdigest()[:8]}")
    return "_".join(parts + [args.des, f"seed{args.seed}", str(ii)])


def load_trained_model(metrics_json_path, checkpoint=None, device="cpu"):
    """The model of a finished run, in eval mode, outside run.py: its configuration is the
    "args" that run saved in metrics.json (shapes included, so no data is read), its weights
    `checkpoint`, by default <checkpoints>/<setting>/checkpoint.pth, loaded strictly (a LoRA run's adapters on the
    base weights its --pretrain_model_path holds, checked by their hash)."""
    try:
        with open(metrics_json_path) as f:
            record = json.load(f)
        saved = record["args"]
        setting = record["setting"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"cannot read the run's arguments from {metrics_json_path} ({exc}); pass the "
                        "metrics.json that run.py wrote under --results_dir/<setting>/") from None
    args = argparse.Namespace(**saved)
    lora = getattr(args, "lora_rank", 0)
    if lora:  # its base, as Exp_Basic built it: the seeded initialisation, or the pre-trained weights
        seed_everything(args.seed)
    model = build_model(args)
    if checkpoint is None and getattr(model, "needs_no_training", False):  # a baseline, an ensemble: no weights
        return model.to(device).eval()  # of its own (an ensemble's members load theirs as it is built)
    if lora:  # a LoRA run's checkpoint holds its adapters, checked against the base's hash as they load
        from exp.adaptation import load_pretrained
        from exp.lora import apply_lora

        if args.adaptation:
            load_pretrained(model, args.pretrain_model_path, torch.device("cpu"))
        model = apply_lora(model, args)
    load_weights(model, checkpoint or os.path.join(args.checkpoints, setting, "checkpoint.pth"), map_location=device,
                 formats=export_formats())
    return model.to(device).eval()
