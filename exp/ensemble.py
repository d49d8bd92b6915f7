"""`--model Ensemble --members A,B,...`: released and trained forecasters combined level by level (models/Ensemble.py
combines; here its members are found, settled, built and loaded, where the experiment builds and loads any model).

A member is
- a release folder as downloaded, `DIR` (its --model found from the folder's signature, models.foundation's
  SIGNATURES) or `Name=DIR` (the --model named, which must be the one that reads the folder);
- a trained checkpoint, `checkpoints/SETTING/checkpoint.pth` (or `Name=...`), whose training record beside it
  (last.pth's run identity) says its model and the arguments that built it.

Each member is settled as its own zero-shot run would be (exp.settings.resolve_args on the ensemble's data, context
and horizon), built, its weights loaded, and forecasts through exp.forward as that run does: a release sees the
series as given, a trained model the run's scaled series, a --loss quantile's levels sorted, a release's as
forecast. The ensemble's levels are the levels every quantile member forecasts (a point member counts as its
median); `reconciled_levels` is the rule, docs/ensembles.md the words. Zero-shot only: the members are trained
already. Every problem is one line naming the member as given."""
import argparse
import logging
import os

import torch
from torch import nn

from exp.adaptation import forecast_series_as_given
from exp.forward import direct_forward
from models import FORWARD_INPUTS, canonical_name, get_model_class
from models.Ensemble import Ensemble
from models.foundation import export_formats, release_signatures
from models.foundation.release import open_release, release_of
from utils.checkpoint import load_weights
from utils.errors import UserError, require
from utils.probabilistic import POINT_LOSSES, native_levels, parse_levels

NAME = "Ensemble"
# what the ensemble refuses beside it: weights of its own, training (its members are trained already)
NOT_WITH_ENSEMBLE = ("pretrain_model_path", "checkpoint", "test_dir", "adaptation", "lora_rank", "resume")


def is_ensemble(name):
    """Whether --model `name` is the ensemble (any case, with or without '_' or '-', as the registry's names)."""
    return str(name).replace("_", "").replace("-", "").lower() == NAME.lower()


def check_not_an_ensemble(args):
    """One line for the ensemble's arguments given to another --model, which would ignore them."""
    stray = [f"--{name}" for name in ("members", "ensemble_rule") if name in getattr(args, "given", ())]
    require(not stray, f"{' and '.join(stray)} are read by --model {NAME} only, not --model {args.model}: use --model "
                       f"{NAME}, or drop {' and '.join(stray)}")


# ------------------------------------------------------------ --members, read
class MemberSpec(argparse.Namespace):
    """One member as the command line gave it (`given`): `kind` "release" or "checkpoint", `model` the --model
    that reads it, `path`, `levels` (its quantile levels, None for a point forecast), `release` (the release
    folder it is built from: its own, or the one a checkpoint was fine-tuned from; None for a model whose
    weights fix its context and horizon) and, for a checkpoint, the run identity its training record holds
    (`identity`)."""


def member_specs(text):
    """The MemberSpecs of --members `text`, or one line: none or one member, an empty item, a path that is no
    release folder and no trained checkpoint, a model named that does not read it, a member given twice."""
    items = [item.strip() for item in str(text or "").split(",")]
    require(text and all(items), f"--model {NAME} needs --members A,B,... (each a release folder, Name=DIR, or a "
                                 f"trained checkpoints/SETTING/checkpoint.pth), got {text!r}")
    require(len(items) >= 2, f"--members {text}: an ensemble needs at least two members; run --model with that "
                             "member alone for its own forecast")
    specs = [member_spec(item) for item in items]
    seen = {}
    for spec in specs:
        key = (spec.model, os.path.realpath(spec.path))
        require(key not in seen, f"--members: {spec.given} and {seen.get(key)} are the same member ({spec.model} "
                                 f"from {spec.path}); give each member once (one member, one vote)")
        seen[key] = spec.given
    return specs


def named_path(item):
    """(the --model named or None, the path) of one --members item, `DIR`, `Name=DIR` or a checkpoint: the first
    '=' ends the name, so a path may hold '=' when a name is given."""
    name, path = item.split("=", 1) if "=" in item else (None, item)
    return (name.strip() or None) if name else None, path.strip()


def member_spec(item):
    name, path = named_path(item)
    where = f"ensemble member {item}"
    require(os.path.exists(path), f"{where}: {path} not found; give a release folder as downloaded or a trained "
                                  "run's checkpoints/SETTING/checkpoint.pth")
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    found = release_of(folder)
    if found is not None and open_release(path) is not None:
        what, reads = found
        require(reads, f"{where}: {path} is {what}, which no --model here reads")
        model = reads
        if name is not None:
            named = canonical_name(name)
            get_model_class(named)  # an unknown name: the registry's line
            require(named == reads, f"{where}: {path} is {what}, read by --model {reads}, not {name}; write "
                                    f"{reads}={path} or the folder alone")
        cls = get_model_class(model)
        return MemberSpec(given=item, kind="release", model=model, path=path, levels=native_levels(cls), identity=None,
                          release=path)
    require(os.path.isfile(path), f"{where}: {path} is no release folder (no release's files and config.json) and no "
                                  "checkpoint file; give a release folder as downloaded or a trained run's "
                                  "checkpoints/SETTING/checkpoint.pth")
    identity = _identity_beside(path, where)
    model = canonical_name(str(identity.get("model")))
    if name is not None:
        require(canonical_name(name) == model, f"{where}: {path} was trained as --model {model}, not {name}")
    cls = get_model_class(model)
    base = identity.get("pretrain_model_path") if identity.get("adaptation") else None
    require(not base or os.path.exists(base) or model not in {reads for _, reads, _ in release_signatures()},
            f"{where}: {path} was fine-tuned from the release {base} (its training record, last.pth, says so), "
            f"which is not found from {os.getcwd()}; {model} is built from that folder: run the ensemble where that "
            "path is valid, or put the release folder back there")
    require(not identity.get("lora_rank"), f"{where}: {path} holds LoRA adapters; merge them first "
                                           "(python -m exp.export export --base) and give the merged checkpoint")
    levels = native_levels(cls)
    if levels is None and identity.get("loss") not in POINT_LOSSES:
        levels = parse_levels(identity.get("quantiles"))
    return MemberSpec(given=item, kind="checkpoint", model=model, path=path, levels=levels, identity=identity,
                      release=fine_tuned_release(identity))


def fine_tuned_release(identity):
    """The release folder a trained checkpoint was fine-tuned from (its record's --adaptation
    --pretrain_model_path, a release folder here), or None. Such a model is built from that folder, whose sizes
    do not depend on the context or horizon: its own `--is_training 0 --adaptation` run evaluates it at any."""
    base = identity.get("pretrain_model_path") if identity.get("adaptation") else None
    if not base or not os.path.isdir(base) or release_of(base) is None:
        return None
    return base if open_release(base) is not None else None


def _identity_beside(path, where):
    """The run identity in the training record (last.pth) beside the checkpoint `path`, or one line."""
    record = os.path.join(os.path.dirname(os.path.abspath(path)), "last.pth")
    require(os.path.isfile(record), f"{where}: no training record (last.pth) beside {path}, so nothing says which "
                                    "model and arguments made it; give a checkpoint.pth that run.py wrote, with the "
                                    "last.pth of its run beside it")
    try:  # memory-mapped: only the identity is read
        state = torch.load(record, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises many types for a truncated or foreign file
        raise UserError(f"{where}: cannot read {record} ({type(exc).__name__}), the training record of {path}") from None
    identity = state.get("identity") if isinstance(state, dict) else None
    require(isinstance(identity, dict) and identity.get("model"),
            f"{where}: {record} holds no run identity, so nothing says which model made {path}")
    return identity


def _key(level):
    return round(float(level), 9)


def reconciled_levels(specs):
    """The ensemble's levels: those every quantile member forecasts (a point member, its median only, joins the
    median level); 0.5 alone for point members only. One line where the quantile members share no level but the
    median while some forecast more."""
    quantile = [spec for spec in specs if spec.levels is not None]
    if not quantile:
        return (0.5,)
    common = set.intersection(*({_key(q) for q in spec.levels} for spec in quantile))
    more = any(len(spec.levels) > 1 for spec in quantile)
    require(common != {0.5} or not more,
            "--members share no quantile level but the median: " + "; ".join(
                f"{spec.given} forecasts {','.join(f'{q:g}' for q in spec.levels)}" for spec in quantile)
            + "; give members whose levels overlap (train a checkpoint with --quantiles among the others' levels)")
    return tuple(q for q in quantile[0].levels if _key(q) in common)


# ------------------------------------------------------------ the ensemble's class, and its members built
_classes = {}


def ensemble_class(args, settings):
    """The ensemble's model class for the run's --members and --ensemble_rule: models.Ensemble.Ensemble declaring
    the reconciled levels (`quantile_levels`), built from a configs as every model is (its members settled,
    built and loaded here). `settings`: the module exp.settings, which settles and builds each member as any run
    (handed in: it is the module asking). One line for an ensemble that cannot be: see member_specs,
    reconciled_levels."""
    require(not getattr(args, "is_training", 0),
            f"--model {NAME} combines members trained already: it is zero-shot, add --is_training 0 (train a member "
            "on its own, then give its checkpoint)")
    stray = [f"--{name}" for name in NOT_WITH_ENSEMBLE if getattr(args, name, None)]
    require(not stray, f"--model {NAME} takes its members' weights from --members, not {', '.join(stray)}; drop it")
    key = (args.members, args.ensemble_rule, _stamps(args.members))
    if key not in _classes:
        specs = member_specs(args.members)
        levels = reconciled_levels(specs)

        class Model(Ensemble):
            quantile_levels = levels
            inputs_used = FORWARD_INPUTS
            needs_no_training = True  # exp.settings: no weights of its own to load
            members_given = tuple(specs)

            def __init__(self, configs):
                members, picks = zip(*(built_member(configs, spec, levels, settings) for spec in specs))
                super().__init__(members, picks, levels.index(0.5), configs.ensemble_rule)

        _classes[key] = Model
    return _classes[key]


def _stamps(text):
    """What a member's files are now (their modification times), so that a class is built again for files that
    changed under the same --members."""
    stamps = []
    for item in str(text or "").split(","):
        path = named_path(item)[1]
        for name in (path, os.path.join(os.path.dirname(os.path.abspath(path)), "last.pth")):
            stamps.append(os.stat(name).st_mtime_ns if os.path.exists(name) else None)
    return tuple(stamps)


def member_run(configs, spec, settings, fixed=False):
    """The settled run of member `spec` inside the ensemble whose model configs are `configs`: its zero-shot
    evaluation on the ensemble's data, context and horizon (`fixed`: a trained member at the horizon it was
    trained for, which the GIFT-Eval harness rolls out, as its own row with --checkpoint does; at the context it
    was trained for too unless it is a fine-tuned release, which takes any)."""
    from utils.arguments import parser_defaults

    defaults = parser_defaults()
    ns = argparse.Namespace(**{**vars(configs), "given": frozenset(), "model": spec.model, "is_training": 0,
                               "members": None, "ensemble_rule": defaults["ensemble_rule"], "loss": defaults["loss"],
                               "quantiles": defaults["quantiles"], "num_samples": None, "checkpoint": None,
                               "pretrain_model_path": None, "adaptation": False, "test_dir": None,
                               "test_seq_len": None, "test_pred_len": None})
    where = f"ensemble member {spec.given}"
    if spec.kind == "release":
        ns.pretrain_model_path = spec.path
    else:
        identity = spec.identity
        shapes = {"seq_len": identity.get("seq_len"), "pred_len": identity.get("pred_len")}
        if spec.release is not None:  # a fine-tuned release: sized by its folder, evaluated at any shape
            if fixed:
                ns.pred_len = shapes["pred_len"]
        else:
            if fixed:
                vars(ns).update(shapes)
            require(shapes == {"seq_len": ns.seq_len, "pred_len": ns.pred_len},
                    f"{where}: {spec.model} was trained for --seq_len {shapes['seq_len']} --pred_len "
                    f"{shapes['pred_len']} and takes only those (its weights' shapes); the ensemble asks --seq_len "
                    f"{ns.seq_len} --pred_len {ns.pred_len}: give the ensemble those, or a checkpoint trained for "
                    "these")
        # --covariate sets which channels every member forecasts: a member trained otherwise cannot be combined
        trained = bool(identity.get("covariate", False))
        require(trained == bool(ns.covariate),
                f"{where}: {spec.model} was trained {'with' if trained else 'without'} --covariate (it forecasts "
                f"{'the target channel only' if trained else 'every channel'}), the ensemble runs "
                f"{'with' if ns.covariate else 'without'} it: give the ensemble the same, or a checkpoint trained so")
        for name in (*settings.EVALUATION_IDENTITY, "loss", "quantiles", "adaptation", "pretrain_model_path"):
            if name in identity and name not in ("members", "ensemble_rule"):
                setattr(ns, name, identity[name])
        ns.model, ns.checkpoint = spec.model, spec.path
    quiet = logging.getLogger("tsl")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # its settling's info lines (its levels) are the ensemble's to say
    try:
        run = settings.resolve_args(ns, 1)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    finally:
        quiet.setLevel(level)
    require(not run.autoregressive, f"{where}: --model {spec.model} is a token model, rolled out step by step; an "
                                    "ensemble combines direct forecasters")
    return run


def member_model(configs, spec, settings, fixed=False):
    """(the member's model, built and its weights loaded, in eval mode; its settled run)."""
    run = member_run(configs, spec, settings, fixed)
    where = f"ensemble member {spec.given}"
    try:
        model = settings.build_model(run)
        load_weights(model, spec.path, map_location="cpu", formats=export_formats(), opener=open_release)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    return model.eval(), run


def built_member(configs, spec, levels, settings):
    """(the member as the ensemble runs it, the indices of the ensemble's `levels` among its own or None)."""
    model, run = member_model(configs, spec, settings)
    pick = None if spec.levels is None else [[_key(q) for q in spec.levels].index(_key(level)) for level in levels]
    return Member(model, run), pick


class Member(nn.Module):
    """A member forecasting from the ensemble's forward inputs as its own zero-shot run would, through
    exp.forward: its quantiles [B, P, C, its levels] (its objective's rule: a release's as forecast, a --loss
    quantile's sorted), or its point forecast [B, P, C]. A release sees the series as given (exp.adaptation's
    hooks, installed for the device the input is on)."""

    def __init__(self, model, run):
        super().__init__()
        self.model, self.run = model, run
        self._hooked, self._handles = None, ()

    def _see_series_as_given(self, device):
        if self._hooked == device:
            return
        for handle in self._handles:
            handle.remove()
        self._handles = forecast_series_as_given(self.model, self.run, device) or ()
        self._hooked = device

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        run = self.run
        self._see_series_as_given(x_enc.device)
        label = run.label_len
        # the decoder's known steps are the context's last: a window's y starts label_len steps before its end
        y = torch.cat([x_enc[:, x_enc.shape[1] - label:], x_enc.new_zeros(x_enc.shape[0], run.pred_len,
                                                                           x_enc.shape[2])], 1)
        y_mark = None
        if x_mark_enc is not None and x_mark_dec is not None:
            y_mark = torch.cat([x_mark_enc[:, x_mark_enc.shape[1] - label:], x_mark_dec[:, -run.pred_len:]], 1)
        pred = direct_forward(self.model, (x_enc, y, x_mark_enc, y_mark), run, x_enc.device)[0]
        return pred if run.objective is None else run.objective.quantiles(pred)
