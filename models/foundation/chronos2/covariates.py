"""Chronos-2 given a task's covariates (`python -m benchmarks.fev_bench --covariates`, which looks for this file in
a release's folder): the release's folder run by its official package's pipeline (chronos-forecasting's
Chronos2Pipeline.predict), each series of a window one input of the package's covariate form:

- target: the task's target columns of the series together ([D, past]): the package's multivariate mode, its
  group attention across them;
- past_covariates: the known and the past-only dynamic columns over the past;
- future_covariates: the known dynamic columns over the horizon (fev hands a model the same split); a
  categorical column (not numbers in the data) as strings, None where missing, which the package encodes
  (target encoding with one target column, ordinal codes over the batch's categories with several);
- static columns: the package's pipeline has no static input (nor has fev's own Chronos-2 run, which drops
  them), so each is given as a known covariate constant over the past and the horizon: a number as it is, a
  categorical one as strings, which the package encodes as it encodes categorical covariates. Chronos-2
  standardises every input row over its own past, so a constant row reaches the model as zeros (or +-arcsinh 1
  where float32 rounds its mean) whatever its value: a forecast changes by the row's presence, not its value.
  `static=False` leaves them out (fev's own Chronos-2 protocol).

This folder's own module (Chronos2.py) forecasts each channel alone, without covariates; this path is the
package's, on the same weights. Its forward runs once per batch of --batch_size
windows, the batches shared out whole, so the file is the same on any number of processes; another batch
size may round a window's float32 forward differently (the package left-pads a batch to its longest past) and,
with categorical covariates and several target columns, code their categories over another set.
"""
import numpy as np

from utils.errors import UserError, require


class CovariateForecaster:
    """forecast(inputs, horizon) -> quantiles [B, D, len(levels), horizon] at the given levels."""

    def __init__(self, run_argv, device, levels):
        argv = list(run_argv)
        require("--pretrain_model_path" in argv[:-1], "--covariates runs a Chronos-2 release: give its folder, "
                "--pretrain_model_path FOLDER")
        folder = argv[argv.index("--pretrain_model_path") + 1]
        try:
            from chronos import Chronos2Pipeline
        except ImportError:
            raise UserError("--covariates runs Chronos-2's package: pip install 'chronos-forecasting>=2.3,<3'") \
                from None
        try:
            self.pipeline = Chronos2Pipeline.from_pretrained(folder, device_map=str(device or "cpu"))
        except (OSError, ValueError) as exc:
            raise UserError(f"--pretrain_model_path {folder} is not a Chronos-2 release folder "
                            f"({str(exc).splitlines()[0]})") from None
        missing = [q for q in levels if q not in self.pipeline.quantiles]
        require(not missing, f"{folder}: its quantiles lack {missing}")
        self.index = [list(self.pipeline.quantiles).index(q) for q in levels]

    def forecast(self, inputs, horizon):
        import torch

        with torch.no_grad():
            out = self.pipeline.predict(inputs, prediction_length=horizon, batch_size=max(len(inputs), 1))
        return np.stack([o[:, self.index, :horizon].double().cpu().numpy() for o in out])


def window_inputs(data, series, first, cut, horizon, target_columns, static=True):
    """One series' window in the package's covariate form (module docstring)."""
    target = data["targets"][series][:, first:cut]
    known, past = data["known"][series], data["past"][series]
    constant = data["static"][series] if static else []
    one = {"target": target[0] if len(target_columns) == 1 else target}
    covariates = {**{f"known_{i}": k[first:cut] for i, k in enumerate(known)},
                  **{f"past_{i}": p[first:cut] for i, p in enumerate(past)},
                  **{f"static_{i}": _repeat(v, cut - first) for i, v in enumerate(constant)}}
    if covariates:
        one["past_covariates"] = covariates
    if len(known) or len(constant):
        one["future_covariates"] = {**{f"known_{i}": k[cut:cut + horizon] for i, k in enumerate(known)},
                                    **{f"static_{i}": _repeat(v, horizon) for i, v in enumerate(constant)}}
    return one


def _repeat(value, n):
    """A static value as a constant covariate: float64, or an object array of str (None missing), the package's
    categorical form."""
    if isinstance(value, float):
        return np.full(n, value)
    return np.array([value] * n, dtype=object)
