"""TiRex-2 given a task's covariates (`python -m benchmarks.fev_bench --covariates`, which looks for this file in a
release's folder): the release's multivariate mode, the package's own TiRex2.predict on the folder's weights, each
series of a window one input of the package's form (tirex2.TimeseriesType):

- target: the task's target columns of the series together ([D, past]), one group: each block's variate attention
  lets them attend to each other (and to the covariates; a covariate never attends to a target);
- past_covariates: the past-only dynamic columns over the past;
- future_covariates: the known dynamic columns over the past and the horizon, which the bidirectional time mixer
  also reads backwards;
- static columns: the package has no static input; with --static_covariates constant each is a known covariate
  constant over the past and the horizon (a number as it is, a categorical one 0): the package's scaler leaves a
  row of only 0 and 1 as it is and turns any other constant row into zeros, so a forecast changes by the row's
  presence, and for 0 / 1 by its value.
A categorical column is given as the ordinal codes of its categories (sorted) in the window; a missing value is
NaN, which TiRex-2 reads as unobserved. The past is the last context_len steps (the package would cut the rest
silently); a horizon past future_len (no roll-out: the package would truncate it) is refused in one line.

The network is this folder's (TiRex2.build: the package's modules, patch embeddings eager) without the univariate
shortcuts, and one window is one call of the package's predict, so a window's forecast is the same in any batch
and on any number of processes.
"""
import numpy as np

from utils.errors import UserError, require


class CovariateForecaster:
    """forecast(inputs, horizon) -> quantiles [B, D, len(levels), horizon] at the given levels."""

    def __init__(self, run_argv, device, levels):
        from models.foundation.release import open_release
        from models.foundation.tirex2 import TiRex2
        from models.foundation.tirex2.adapter import LEVELS, PREFIX, read_release, release_state_to_ours

        argv = [str(a) for a in run_argv]
        require("--pretrain_model_path" in argv[:-1], "--covariates runs a TiRex-2 release: give its folder, "
                "--pretrain_model_path FOLDER")
        folder = argv[argv.index("--pretrain_model_path") + 1]
        config = read_release(folder)
        wanted = [round(float(q), 6) for q in levels]
        missing = [q for q in wanted if q not in LEVELS]
        require(not missing, f"{folder}: TiRex-2's quantiles {list(LEVELS)} lack {missing}")
        self.index = [LEVELS.index(q) for q in wanted]
        self.model = TiRex2.build(config, univariate=False)
        state, _ = open_release(folder).state()
        ours = release_state_to_ours(state, config)
        self.model.load_state_dict({k[len(PREFIX):]: v for k, v in ours.items() if k.startswith(PREFIX)}, strict=True)
        self.model.eval().to(device or "cpu")
        self.context, self.future = int(config["context_len"]), int(config["future_len"])

    def forecast(self, inputs, horizon):
        if horizon > self.future:
            raise UserError(f"TiRex-2 forecasts at most {self.future} steps (its future_len) in its one pass, with no "
                            f"roll-out; the task's horizon {horizon} is longer")
        return np.stack([self._one(one, horizon) for one in inputs])

    def _one(self, one, horizon):
        import tirex2
        import torch

        device = next(self.model.parameters()).device

        def rows(values, extra=0):
            if not len(values):
                return None
            array = np.stack([np.asarray(v, dtype=np.float64) for v in values])
            keep = min(self.context, array.shape[-1] - extra)
            return torch.as_tensor(array[:, -(keep + extra):], dtype=torch.float32, device=device)

        series = tirex2.TimeseriesType(target=rows(np.atleast_2d(one["target"])), past_covariates=rows(one["past"]),
                                       future_covariates=rows(one["known"], horizon))
        with torch.no_grad():
            out = self.model.predict([series], horizon)[0]  # [D, 9, H]
        return out[:, self.index].double().cpu().numpy()


def _numeric(values):
    """A column as float64: numbers as they are (None missing), a categorical one as the ordinal codes of its
    sorted categories in the window."""
    array = np.asarray(values, dtype=object) if not isinstance(values, np.ndarray) else values
    if array.dtype.kind in "fiub":
        return array.astype(np.float64)
    present = [v for v in array if v is not None]
    if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in present):
        return np.array([np.nan if v is None else float(v) for v in array], dtype=np.float64)
    codes = {c: float(k) for k, c in enumerate(sorted({str(v) for v in present}))}
    return np.array([np.nan if v is None else codes[str(v)] for v in array], dtype=np.float64)


def window_inputs(data, series, first, cut, horizon, target_columns, static=True):
    """One series' window in the form CovariateForecaster reads (module docstring)."""
    target = np.asarray(data["targets"][series], dtype=np.float64)[:, first:cut]
    if len(target_columns) != target.shape[0]:
        raise UserError(f"series {series}: {target.shape[0]} target rows for {len(target_columns)} target columns")
    past = [_numeric(p[first:cut]) for p in data["past"][series]]
    known = [_numeric(k[first:cut + horizon]) for k in data["known"][series]]
    if static:
        for value in data["static"][series]:
            number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
            known.append(np.full(cut - first + horizon, number))
    return {"target": target, "past": past, "known": known}
