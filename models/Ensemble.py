"""An ensemble: the members' quantiles combined level by level, their median (default) or mean.

The members are forecasters handed in ready to run (exp/ensemble.py builds them from --members: release folders
and trained checkpoints, their weights loaded); this module knows nothing of where they came from. Each member
maps the ensemble's forward inputs to its quantiles at its own levels, [B, pred_len, C, its levels], or to a point
forecast, [B, pred_len, C]. `picks` says, for each member, which of its levels are the ensemble's levels in order
(None for a point member, which joins the median level only: its point forecast is its median). Every member
runs once per forward, whatever the number of levels.

The combination at each level is over the members that forecast it: the median of their values (the mean of the
two middle values where their number is even, as numpy's median), or their mean (`rule` "mean"), in float64,
returned in the widest of the members' dtypes. The ensemble's quantiles are kept as combined (not sorted): the
median and the mean of non-crossing quantiles do not cross, and a point member moves the median level alone.

Not a registered --model file of its own: `--model Ensemble` is exp/ensemble.py's, which subclasses this one."""
import functools

import torch
from torch import nn

RULES = ("median", "mean")


def combine(values, rule):
    """The members' values [M, ...] combined along the first dimension: their median (the mean of the two middle
    values for an even M) or their mean, in float64."""
    values = values.double()
    if rule == "mean":
        return values.mean(0)
    ordered = values.sort(dim=0).values
    count = ordered.shape[0]
    middle = ordered[(count - 1) // 2]
    return middle if count % 2 else (middle + ordered[count // 2]) / 2


def combine_members(quantiles, points, median, rule, dim=-1):
    """The ensemble's forecast from its members': `quantiles`, each at the ensemble's levels along `dim`; `points`,
    point forecasts (without that dimension), which join the level at index `median` only. Every level combined
    over the members that forecast it (float64); point members only: their combination as the one level."""
    if not quantiles:
        return combine(torch.stack(points), rule).unsqueeze(dim)
    combined = combine(torch.stack(quantiles), rule)
    if points:  # the median level over every member, point members included
        medians = torch.stack([q.select(dim, median) for q in quantiles] + points)
        combined.select(dim, median).copy_(combine(medians, rule))
    return combined


class Ensemble(nn.Module):
    """members: modules forecasting [B, P, C, levels] (or [B, P, C], a point); picks: per member, the indices of
    the ensemble's levels among its own (None: a point member); median: the index of 0.5 among the ensemble's
    levels; rule: "median" or "mean"."""

    autoregressive = False
    randomness_follows_sample = True

    def __init__(self, members, picks, median, rule="median"):
        super().__init__()
        if rule not in RULES:
            raise ValueError(f"the ensemble rule is one of {', '.join(RULES)}, not {rule!r}")
        if len(members) != len(picks):
            raise ValueError("one pick of levels per member")
        self.members = nn.ModuleList(members)
        self.picks = [None if p is None else list(p) for p in picks]
        self.median, self.rule = median, rule

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        outputs = [member(x_enc, x_mark_enc, x_dec, x_mark_dec) for member in self.members]  # once each
        quantiles = [out[..., pick] for out, pick in zip(outputs, self.picks) if pick is not None]
        points = [out for out, pick in zip(outputs, self.picks) if pick is None]
        # the widest of the members' dtypes: a distribution member's quantiles (float64, its inverse CDF's) are
        # combined and returned as its own run scores them, whatever the members' order
        dtype = functools.reduce(torch.promote_types, [out.dtype for out in outputs])
        return combine_members(quantiles, points, self.median, self.rule).to(dtype)  # [B, P, C, levels]
