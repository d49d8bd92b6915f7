"""Any model of this codebase as a GIFT-Eval forecaster: a released foundation model zero-shot
(--pretrain_model_path FOLDER), pre-trained weights (--pretrain_model_path FILE) or a trained zoo model
(--checkpoint FILE), built by run.py's own code (utils.arguments, exp.settings) and run by its forward
(exp.forward), so the model forecasts exactly as `run.py --is_training 0` would.

How a GIFT-Eval window becomes the model's input:
- the history's NaNs are filled as GIFT-Eval's baselines fill them (last value, leading ones with the first);
- the last --seq_len steps are the context; a shorter history is left-padded with its first value, since
  a model here reads a full, finite context;
- weights trained by this codebase saw standardised data, so the context is standardised by its own mean and
  standard deviation and the forecast mapped back; a released foundation model (`series_as_given`, as run.py
  hands it the series: exp.adaptation) scales its input itself and gets the raw values;
- a model built for the horizon (a foundation model, which rolls out internally, and a token model, which
  exp.forward rolls out to --test_pred_len) forecasts it in one call; a direct model with fixed weights
  (--checkpoint) forecasts its trained --pred_len and is rolled out here, its point forecast (the median)
  fed back, as exp.forward.rollout does for token models;
- quantiles: a model's native ones (foundation models) or its probabilistic --loss's, at GIFT-Eval's nine
  levels, which must be among them; a point model gives none, and the CRPS and MSIS columns stay empty. The
  rule is run.py's (utils.probabilistic.QuantileObjective): a release's quantiles as it forecasts them (its
  package's pipeline and GIFT-Eval's own runs score them so), a --loss quantile's sorted; the forecaster counts
  the elements whose quantiles crossed before the rule, over all of the model's levels.
"""
import math

import numpy as np
import torch

from benchmarks.gift_eval_scores import LEVELS
from utils.errors import require


class ModelForecaster:
    """forecast(histories, horizon) -> (point [B, P], quantiles [B, 9, P] or None, elements whose quantiles
    crossed before the rule was applied)."""

    def __init__(self, run_argv, world_size, device=None):
        self.run_argv = [str(a) for a in run_argv]
        self.world_size = world_size
        self.device = torch.device("cpu") if device is None else torch.device(device)  # where the model forecasts
        self.models = {}  # horizon built for -> (model, args)
        self.fixed_horizon = self._value("--checkpoint") is not None

    def _value(self, flag):
        argv = self.run_argv
        return argv[argv.index(flag) + 1] if flag in argv[:-1] else None

    def _built(self, horizon):
        from exp.settings import build_model, resolve_args
        from utils.arguments import parse_args
        from exp.export import load_weights

        if horizon not in self.models:
            extra = [] if self.fixed_horizon else ["--pred_len", str(horizon)]
            # the synthetic data set only decides the channel count (one: GIFT-Eval scores univariate series)
            argv = [*self.run_argv, *extra, "--data", "synthetic", "--features", "S", "--synthetic_rows", "2000",
                    "--is_training", "0"]
            args = resolve_args(parse_args(argv), self.world_size)
            if args.autoregressive:
                args = args.replace(test_pred_len=horizon)
            model = build_model(args)
            weights = args.checkpoint or args.pretrain_model_path
            require(weights, f"--model {args.model}: give its weights, --pretrain_model_path or --checkpoint")
            load_weights(model, weights)
            self.models[horizon] = (model.to(self.device).eval(), args)
        return self.models[horizon]

    def forecast(self, histories, horizon, impute):
        return forecast_with(*self._built(horizon), histories, horizon, impute, self.device)


def forecaster(run_argv, world_size, device=None):
    """The forecaster of run.py arguments `run_argv`: an EnsembleForecaster for --model Ensemble, else a
    ModelForecaster."""
    from exp.ensemble import is_ensemble

    argv = [str(a) for a in run_argv]
    model = argv[argv.index("--model") + 1] if "--model" in argv[:-1] else ""
    return (EnsembleForecaster if is_ensemble(model) else ModelForecaster)(argv, world_size, device)


def forecast_with(model, args, histories, horizon, impute, device):
    """forecast's (point, quantiles, crossed) of `model` built for the settled run `args` (ModelForecaster's rules)."""
    from exp.adaptation import series_as_given

    contexts = np.stack([_context(impute(h), args.seq_len) for h in histories])  # [B, seq_len]
    loc = np.zeros((len(contexts), 1))
    scale = np.ones((len(contexts), 1))
    if not series_as_given(model, args):
        loc, scale = contexts.mean(1, keepdims=True), contexts.std(1, keepdims=True)
        scale = np.where(scale > 1e-8, scale, 1.0)
    # [B, seq_len, 1] on the model's device
    x = torch.tensor((contexts - loc) / scale, dtype=torch.float32, device=device)[..., None]
    points, quantiles, crossed = [], [], 0
    steps = args.test_pred_len if args.autoregressive else args.pred_len
    for _ in range(math.ceil(horizon / steps)):
        point, levels, crossings = _one_call(model, args, x, horizon - steps * len(points), device)
        points.append(point)
        quantiles.append(levels)
        crossed += crossings
        x = torch.cat([x, point[..., None].to(x.dtype)], 1)[:, -args.seq_len:]
    point = torch.cat(points, 1)[:, :horizon].cpu().double().numpy() * scale + loc
    if quantiles[0] is None:
        return point, None, 0
    q = torch.cat(quantiles, 1)[:, :horizon].cpu().double().numpy()  # [B, P, 9]
    return point, q.transpose(0, 2, 1) * scale[:, :, None] + loc[:, :, None], crossed


class EnsembleForecaster(ModelForecaster):
    """--model Ensemble --members ...: each member forecasts as its own row would (a release the raw history at
    the horizon, a trained member from its own context and horizon, rolled out), and the members' quantiles at
    GIFT-Eval's nine levels are combined as run.py combines them (models.Ensemble.combine: --ensemble_rule), a
    point member joining the median; the point forecast is the combined median. Crossings are counted on the
    combined quantiles."""

    def _built(self, horizon):
        from exp import settings
        from exp.ensemble import member_model
        from exp.settings import model_class, model_configs, resolve_args
        from utils.arguments import parse_args

        if horizon not in self.models:
            argv = [*self.run_argv, "--pred_len", str(horizon), "--data", "synthetic", "--features", "S",
                    "--synthetic_rows", "2000", "--is_training", "0"]
            args = resolve_args(parse_args(argv), self.world_size)
            configs = model_configs(args)
            members = [member_model(configs, spec, settings, fixed=True) for spec in model_class(args).members_given]
            self.models[horizon] = ([(model.to(self.device), run) for model, run in members], args)
        return self.models[horizon]

    def forecast(self, histories, horizon, impute):
        from models.Ensemble import combine, combine_members

        members, args = self._built(horizon)
        forecasts = [forecast_with(model, run, histories, horizon, impute, self.device) for model, run in members]
        quantiles = [torch.from_numpy(q) for _, q, _ in forecasts if q is not None]  # [B, 9, P] each
        points = [torch.from_numpy(p) for p, q, _ in forecasts if q is None]
        if not quantiles:
            return combine(torch.stack(points), args.ensemble_rule).numpy(), None, 0
        median = LEVELS.index(0.5)
        q = combine_members(quantiles, points, median, args.ensemble_rule, dim=1).numpy()  # [B, 9, P]
        return q[:, median].copy(), q, int((np.diff(q, axis=1) < 0).any(axis=1).sum())


def _context(history, length):
    if len(history) >= length:
        return history[-length:]
    return np.concatenate([np.full(length - len(history), history[0]), history])


def _one_call(model, args, x, wanted, device):
    """(point [B, steps], quantiles [B, steps, 9] or None, how many of the first `wanted` steps' elements had
    crossing quantiles before the rule) of one forward as exp.forward runs the test."""
    from exp.forward import forward

    batch = len(x)
    steps = args.test_pred_len if args.autoregressive else args.pred_len
    y = torch.cat([x[:, x.shape[1] - args.label_len:], x.new_zeros(batch, steps, 1)], 1)
    if args.autoregressive:
        y = x.new_zeros(batch, steps, 1)
    with torch.no_grad():
        pred, _ = forward(model, (x, y, None, None), args, "test", device)
    if pred.dim() == 3:  # a point forecast
        return pred[..., 0], None, 0
    objective = args.objective
    levels = list(objective.levels)
    crossed = int(objective.crossed(pred[:, :wanted, 0]))
    values = objective.quantiles(pred[:, :, 0])  # a release's as forecast, a --loss quantile's sorted
    missing = [q for q in LEVELS if q not in levels]
    require(not missing, f"--model {args.model} forecasts the levels {levels}, without GIFT-Eval's {missing}; "
            "train it with --quantiles including 0.1, 0.2, ..., 0.9")
    chosen = values[..., [levels.index(q) for q in LEVELS]]
    return chosen[..., LEVELS.index(0.5)], chosen, crossed
