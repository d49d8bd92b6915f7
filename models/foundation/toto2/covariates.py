"""Toto 2.0 given a task's covariates (`python -m benchmarks.fev_bench --covariates`, which looks for this file in
a release's folder), as the release defines them (toto2's Toto2GluonTSModel and Toto2Model.forecast):

- target: the task's target columns of the series together ([D, past]), one series (series id 0): the variate
  layers attend across them;
- past-only dynamic columns: extra target rows of the same series over the past (the GluonTS wrapper's
  past_feat_dynamic_real), forecast like the targets and then dropped;
- known dynamic columns: future-known rows over the past and the horizon (known_dynamic), read and not forecast;
- static columns: the package has no static input; with --static_covariates constant each one is a
  future-known row constant over past and horizon (the causal scaler makes it zeros whatever its value, so a
  forecast changes by its presence only), as Chronos-2's covariates.py gives them.
Toto 2.0 reads numbers only: a categorical column is given as the ordinal codes of its categories (sorted) in the
window, a categorical static one as a constant 0 row. A missing value (NaN) is an unobserved step (mask false, its
value the last one before it, as the wrapper's ffill imputation). A past that is not whole patches is left-padded
with unobserved steps (the GluonTS wrapper's past_is_pad); one longer than the rotary table allows loses its oldest
patches.

Our native model (Toto2.py) computes it, one window at a time, so a window's forecast is the same in any batch
and on any number of processes.
"""
import math

import numpy as np

from utils.errors import UserError, require


class CovariateForecaster:
    """forecast(inputs, horizon) -> quantiles [B, D, len(levels), horizon] at the given levels."""

    def __init__(self, run_argv, device, levels):
        from argparse import Namespace

        from models.foundation.release import open_release
        from models.foundation.toto2 import Toto2
        from models.foundation.toto2.adapter import QUANTILES, TOTO2

        argv = list(run_argv)
        require("--pretrain_model_path" in argv[:-1], "--covariates runs a Toto 2.0 release: give its folder, "
                "--pretrain_model_path FOLDER")
        folder = str(argv[argv.index("--pretrain_model_path") + 1])
        missing = [q for q in levels if q not in QUANTILES]
        require(not missing, f"{folder}: Toto 2.0's quantiles {list(QUANTILES)} lack {missing}")
        self.index = [QUANTILES.index(q) for q in levels]
        self.model = Toto2.Model(Namespace(seq_len=4096, pred_len=1, pretrain_model_path=folder))
        state, config = open_release(folder).state()  # the release's layout: ours is one prefix away (adapter.py)
        self.model.load_state_dict(TOTO2.to_ours(state, config), strict=True)
        self.model.eval().to(device or "cpu")
        self.patch = self.model.patch

    def forecast(self, inputs, horizon):
        return np.stack([self._one(one, horizon) for one in inputs])

    def _one(self, one, horizon):
        import torch

        from models.foundation.toto2.adapter import ROPE_POSITIONS

        target = np.atleast_2d(np.asarray(one["target"], dtype=np.float64))
        targets, past = target.shape
        rows = np.concatenate([target, *[np.asarray(p, dtype=np.float64)[None] for p in one.get("past", [])]])
        known = [np.asarray(k, dtype=np.float64)[None] for k in one.get("known", [])]
        ahead = math.ceil(horizon / self.patch)
        keep = min(math.ceil(past / self.patch), ROPE_POSITIONS - ahead) * self.patch
        pad = max(keep - past, 0)

        def prepared(values, extra):
            values = values[:, max(past - keep, 0):past + extra]
            values = np.pad(values, ((0, 0), (pad, 0)), constant_values=np.nan)
            seen = ~np.isnan(values)
            device = next(self.model.parameters()).device
            return (torch.as_tensor(forward_filled(values), dtype=torch.float32, device=device)[None],
                    torch.as_tensor(seen, device=device)[None])

        values, seen = prepared(rows, 0)
        ids = torch.zeros(1, rows.shape[0], dtype=torch.long, device=values.device)
        extra = {}
        if known:
            known_values, known_seen = prepared(np.concatenate(known), horizon)
            extra = {"known": known_values, "known_mask": known_seen,
                     "known_ids": torch.zeros(1, len(known), dtype=torch.long, device=values.device)}
        with torch.no_grad():
            out = self.model.forecast(values, seen, ids, horizon, **extra)  # [9, 1, rows, H]
        return out[:, 0, :targets].permute(1, 0, 2)[:, self.index].double().cpu().numpy()


def forward_filled(values):
    """NaNs replaced by the last value before them, leading ones by 0 (the GluonTS wrapper's ffill imputation;
    they stay unobserved, but the last context patch counts as observed)."""
    seen = ~np.isnan(values)
    last = np.where(seen, np.arange(values.shape[-1]), 0)
    np.maximum.accumulate(last, axis=-1, out=last)
    filled = np.take_along_axis(values, last, -1)
    return np.where(np.isnan(filled), 0.0, filled)


def _numeric(values):
    """A column as numbers: as it is, or a categorical one as ordinal codes of its sorted categories in the
    window (None missing)."""
    array = np.asarray(values)
    if array.dtype.kind in "fiub":
        return array.astype(np.float64)
    try:
        return np.array([np.nan if v is None else float(v) for v in array], dtype=np.float64)
    except (TypeError, ValueError):
        codes = {c: float(k) for k, c in enumerate(sorted({str(v) for v in array if v is not None}))}
        return np.array([np.nan if v is None else codes[str(v)] for v in array], dtype=np.float64)


def window_inputs(data, series, first, cut, horizon, target_columns, static=True):
    """One series' window in the form CovariateForecaster reads (module docstring)."""
    target = np.asarray(data["targets"][series], dtype=np.float64)[:, first:cut]
    past = [_numeric(p[first:cut]) for p in data["past"][series]]
    known = [_numeric(k[first:cut + horizon]) for k in data["known"][series]]
    if static:  # a constant row: a number as it is, a category its only code, 0
        for value in data["static"][series]:
            number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
            known.append(np.full(cut - first + horizon, number))
    if len(target_columns) != target.shape[0]:
        raise UserError(f"series {series}: {target.shape[0]} target rows for {len(target_columns)} target columns")
    return {"target": target, "past": past, "known": known}
