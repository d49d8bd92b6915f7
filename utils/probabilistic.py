"""Probabilistic forecasts: what a widened model output means, how it is trained, and how it is read.

A point forecaster (--loss MSE / MAE) forecasts one value per step. A probabilistic one forecasts
`width` values per step, asked of the model by widening its horizon: the experiment builds the model
with pred_len (token models: output_token_len) times `width` and reads the output as `width` blocks of
the horizon, one per parameter (exp.settings.build_model, exp.forward). Model files are not edited.

    --loss quantile --quantiles 0.1,...,0.9   one block per level, trained by the pinball loss averaged
                                              over the levels; sorted when read, so quantiles never cross
    a model's own quantile_levels             a released model's quantiles, kept as it forecasts them (its
                                              package's pipeline and GIFT-Eval score them so), crossing or not
    --loss studentt                           blocks (loc, scale, degrees of freedom), trained by the
                                              negative log-likelihood; quantiles from the inverse CDF
    --loss normal                             blocks (loc, scale); quantiles from the closed-form inverse CDF
    --num_samples N                           a distribution forecast is scored from N samples a window,
                                              drawn from a stream keyed by (seed, window number), sample s
                                              the s-th draw: the same on any number of processes and at any
                                              --eval_batch_size (sample_key, SampleStream)

Parameters arrive as [..., C, width] (`params`); quantile forecasts leave as [..., C, L] in the order of
`levels`, non-decreasing along L (a release's: as it forecast them). `crossed(params)` counts the elements whose
quantiles decrease somewhere along L before that rule is applied: every metrics record carries the count.
"""
import functools
import math

import torch
import torch.nn.functional as F

from utils import distributed
from utils.errors import require
from utils.keyed_random import generator_seed, splitmix64
from utils.metrics import vector_like

POINT_LOSSES = ("MSE", "MAE", "SMAPE", "MAPE")  # SMAPE, MAPE: TSLib's M4 losses (--data m4 only)
DISTRIBUTIONS = ("studentt", "normal")
LOSSES = POINT_LOSSES + ("quantile",) + DISTRIBUTIONS
# what --quantiles defaults to: GIFT-Eval's nine levels, the ends of the 50 / 90 % intervals and MSIS's
DEFAULT_LEVELS = (0.05, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95)
SCALE_FLOOR = 1e-6  # a scale of exactly 0 has no density


def parse_levels(text):
    """--quantiles "0.1,0.5,0.9" as a sorted tuple of floats, or a UserError naming what is wrong."""
    try:
        levels = tuple(float(part) for part in str(text).split(","))
    except ValueError:
        levels = None
    require(levels is not None, f"--quantiles {text!r} is not a comma-separated list of numbers; give levels "
                                "such as 0.1,0.5,0.9")
    outside = [q for q in levels if not 0 < q < 1]
    require(not outside, f"--quantiles {text}: {', '.join(map(str, outside))} outside (0, 1); every level is a "
                         "probability strictly between 0 and 1")
    repeated = sorted({q for q in levels if levels.count(q) > 1})
    require(not repeated, f"--quantiles {text} repeats {', '.join(map(str, repeated))}; give each level once")
    require(list(levels) == sorted(levels), f"--quantiles {text} is not in increasing order; give it as "
                                            f"{','.join(map(str, sorted(levels)))}")
    require(0.5 in levels, f"--quantiles {text} lacks 0.5: the median is the point forecast that MSE, MAE, MASE "
                           "and sMAPE score; add 0.5")
    return levels


def objective_for(args):
    """The training objective of --loss, or None for a point loss (MSE / MAE)."""
    return _objective(args.loss, getattr(args, "quantiles", None), getattr(args, "num_samples", None),
                      bool(getattr(args, "native_quantiles", None)))


@functools.lru_cache(maxsize=16)
def _objective(loss, quantiles, samples, native=False):
    if loss in POINT_LOSSES:
        return None
    if loss == "quantile":
        return QuantileObjective(parse_levels(quantiles), native)
    return DistributionObjective(loss, parse_levels(quantiles), samples or 0)


def output_width(args):
    """How many times the model's horizon is widened: 1 for a point loss, and for a model that forecasts its
    quantiles natively (`quantile_levels`: it returns them as a last dimension of their own)."""
    objective = objective_for(args)
    return 1 if objective is None or objective.native else objective.width


def native_levels(model_class):
    """The quantile levels a model class forecasts natively (its `quantile_levels`), or None; a declaration
    that is not a sorted tuple of distinct levels in (0, 1) with 0.5 is the model file's error, in one line."""
    declared = getattr(model_class, "quantile_levels", None)
    if declared is None:
        return None
    try:
        levels = tuple(float(q) for q in declared)
    except (TypeError, ValueError):
        levels = ()
    require(levels and list(levels) == sorted(set(levels)) and all(0 < q < 1 for q in levels) and 0.5 in levels,
            f"{model_class.__module__}.Model.quantile_levels = {declared!r}: declare the levels its forward returns, "
            "increasing, each once, in (0, 1), with 0.5")
    return levels


class QuantileObjective:
    """One block of the horizon per quantile level; pinball loss averaged over levels and elements.

    `native`: the quantiles are a released model's own (its quantile_levels), read as it forecasts them. Its
    package's pipeline returns them unsorted (most released packages do; one fixes crossings inside its
    forecast, a documented flag of it) and GIFT-Eval scores them so: re-sorting here would
    score another forecast than the package's. Quantiles trained here are sorted: a crossing is this codebase's
    training's, and sorting never raises the pinball loss."""

    def __init__(self, levels, native=False):
        self.levels = levels
        self.width = len(levels)
        self.samples = 0
        self.native = native
        self.order = "as forecast" if native else "sorted"  # what metrics records name as the rule applied
        self._on_device = {}  # (device, dtype) -> the levels there, built once

    def loss_elements(self, params, true):
        """[..., C] pinball loss of each element, averaged over the levels."""
        levels = levels_like(self, params)
        diff = true.unsqueeze(-1) - params
        return torch.maximum(levels * diff, (levels - 1) * diff).mean(-1)

    def loss(self, params, true):
        return self.loss_elements(params, true).mean()

    def point(self, params):
        """The median, what a token model's rollout feeds back."""
        return self.quantiles(params)[..., self.levels.index(0.5)]

    def quantiles(self, params, keys=None):
        """Sorted along the levels (a model's raw quantiles may cross; what is scored and written then never
        does), or a release's as it forecast them (`native`)."""
        return params if self.native else params.sort(dim=-1).values

    def crossed(self, params):
        """How many elements of `params` [..., L] have a quantile above the next level's: a 0-dim int64 tensor
        (no host sync)."""
        return (params[..., 1:] < params[..., :-1]).any(-1).sum()


class DistributionObjective:
    """A parametric distribution per element, trained by its negative log-likelihood."""

    native = False
    order = "sorted"  # from the inverse CDF or sorted samples: never crossing

    def __init__(self, name, levels, samples=0):
        self.name, self.levels, self.samples = name, levels, samples
        self.width = 3 if name == "studentt" else 2
        self._on_device = {}  # (device, dtype) -> the levels there, built once

    def crossed(self, params):
        return torch.zeros((), dtype=torch.int64, device=params.device)

    def parameters(self, params):
        """(loc, scale, df or None): scale and df kept positive by softplus (df above 2: a finite variance)."""
        params = params.float()
        loc, scale = params[..., 0], F.softplus(params[..., 1]) + SCALE_FLOOR
        df = 2.0 + F.softplus(params[..., 2]) if self.name == "studentt" else None
        return loc, scale, df

    def loss_elements(self, params, true):
        """[..., C] negative log-density of each element: torch.distributions' log_prob, its ops in its order (the
        same bits), written out because building a StudentT builds a Chi2 that checks its argument, reading the
        device back on every call."""
        loc, scale, df = self.parameters(params)
        true = true.float()
        if df is None:
            return -(-((true - loc) ** 2) / (2 * scale ** 2) - scale.log() - math.log(math.sqrt(2 * math.pi)))
        y = (true - loc) / scale
        log_norm = (scale.log() + 0.5 * df.log() + 0.5 * math.log(math.pi) + torch.lgamma(0.5 * df)
                    - torch.lgamma(0.5 * (df + 1.0)))
        return -(-0.5 * (df + 1.0) * torch.log1p(y ** 2.0 / df) - log_norm)

    def loss(self, params, true):
        return self.loss_elements(params, true).mean()

    def point(self, params):
        """The median (the location: both distributions are symmetric), what a rollout feeds back."""
        return params[..., 0]

    def quantiles(self, params, keys=None):
        """Quantiles at `levels`: from the inverse CDF (exact), or with --num_samples from that many samples
        a window drawn from `keys`' streams (one key per window of the batch)."""
        loc, scale, df = (None if t is None else t.double() for t in self.parameters(params))
        if self.samples:
            require(keys is not None, "sampled forecasts need each window's key")
            uniforms = SampleStream(keys, self.samples, loc.shape[1:], loc.device).uniforms()  # [B, N, ...]
            draws = loc.unsqueeze(1) + scale.unsqueeze(1) * standard_icdf(uniforms, None if df is None else df.unsqueeze(1))
            return sample_quantiles(draws, self.levels)
        # every level in one pass: [L], or with df [..., L]
        standard = standard_icdf(levels_like(self, loc), None if df is None else df.unsqueeze(-1))
        return loc.unsqueeze(-1) + scale.unsqueeze(-1) * standard  # non-decreasing: the inverse CDF is


def levels_like(objective, like):
    """The objective's levels as a tensor of `like`'s dtype on its device, built there once per objective."""
    key = (like.device, like.dtype)
    if key not in objective._on_device:
        objective._on_device[key] = vector_like(objective.levels, like)
    return objective._on_device[key]


def sample_quantiles(draws, levels):
    """[B, N, ...] samples -> [B, ..., L] quantiles at `levels`, interpolated linearly between order statistics
    (numpy's default, as gluonts' SampleForecast); no size limit, unlike torch.quantile."""
    ordered = draws.sort(dim=1).values
    last = ordered.shape[1] - 1
    out = []
    for q in levels:
        position = q * last
        below = math.floor(position)
        above = min(below + 1, last)
        fraction = position - below
        out.append(ordered[:, below] + fraction * (ordered[:, above] - ordered[:, below]))
    return torch.stack(out, dim=-1)


def standard_icdf(p, df=None):
    """The inverse CDF of the standard normal (df None: closed form) or Student-t (student_t_icdf) at
    probabilities p, in float64 on p's device."""
    if df is None:
        return math.sqrt(2.0) * torch.erfinv(2 * p.double() - 1)
    return student_t_icdf(p, df)


# Student-t's inverse CDF, computed where the tensors are (no copy to the host and back per level and batch).
# With x = df / (df + s^2), P(|T| > s) = I_x(df/2, 1/2) (the regularised incomplete beta, A&S 26.7.1) and
# P(|T| < s) = I_(1-x)(1/2, df/2). Both come from the beta's continued fraction (A&S 26.5.8) evaluated on the side
# where it converges, so each is accurate relative to itself: the far tail and the centre alike. s solves
# log P(T > s) = log q (q the tail's mass) or, near the median, log P(0 < T < s) = log |p - 1/2| (exact there),
# by Halley steps in log s, from a start below the root. From df 1e4 the expansion in 1/df (A&S 26.7.5, four
# terms) is the quantile to float64 rounding. Only elementwise ops whose result does not depend on the element's
# position (no tensor-exponent pow: its vectorised and scalar paths round apart), so a window's quantiles do not
# depend on its batch. Within 2e-10 relative of the exact quantile over df 1 to 1e6 and p 2^-53 to 1 - 2^-53,
# and of scipy's stdtrit within 1e-6 max(1, |t|) (tests/test_probabilistic.py).
_HALLEY_TERMS = (20, 40)  # continued-fraction terms of each Halley step: 5e-13 up to df 30, 2e-10 below 1e4
_EXPANSION_DF = 1e4
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188)  # B_2k / (2k (2k - 1))
_CHUNK = {"cpu": 1 << 14}  # elements per pass: a chunk's temporaries stay in the CPU's cache
_DEVICE_CHUNK = 1 << 22


def student_t_icdf(p, df):
    """Student-t's inverse CDF at probabilities p with df degrees of freedom (any df > 0), broadcast together,
    in float64 on p's device: +-inf at p 1 and 0, NaN where p or df is."""
    p, df = torch.broadcast_tensors(p.double(), df.double().to(p.device))
    flat_p, flat_df = p.reshape(-1), df.reshape(-1)
    chunk = _CHUNK.get(p.device.type, _DEVICE_CHUNK)
    parts = [_student_t_icdf(flat_p[i:i + chunk], flat_df[i:i + chunk]) for i in range(0, flat_p.numel(), chunk)]
    return (torch.cat(parts) if parts else flat_p.clone()).reshape(p.shape)


def _student_t_icdf(p, df):
    a = df / 2
    log_beta = math.lgamma(0.5) - _log_gamma_half_step(a)  # log B(df/2, 1/2)
    log_f0 = -log_beta - 0.5 * torch.log(df)  # log of the density at 0
    q = torch.minimum(p, 1 - p)  # the mass beyond |t|
    h = (p - 0.5).abs()  # the mass between 0 and |t|, exact
    log_q, log_h = q.log(), h.log()
    z = -torch.special.ndtri(q)
    z2 = z * z
    expansion = z * (1 + ((z2 + 1) / 4 + (((5 * z2 + 16) * z2 + 3) / 96 + ((((3 * z2 + 19) * z2 + 17) * z2 - 15) / 384
                     + (((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) / 92160) / df) / df) / df) / df)
    # starts: the expansion's first two terms, the tail's leading power (x^a / (a B) = 2q), the density at 0's line
    start = z * (1 + (z2 + 1) / (4 * df))
    tail = (-(math.log(2) + log_q + torch.log(a) + log_beta) / a).clamp(min=1e-300)  # log(1 / x)
    u = torch.maximum(torch.maximum(start.clamp(min=1e-300).log(), log_h - log_f0),
                      0.5 * (torch.log(df) + tail + torch.log(-torch.expm1(-tail))))  # u = log s
    central = q > 0.25
    for terms in _HALLEY_TERMS:
        log_tail, log_middle, log_x = _log_t_masses(u, a, log_beta, terms)
        g = torch.where(central, log_middle - log_h, log_tail - log_q)
        slope = torch.exp(u + log_f0 + (a + 0.5) * log_x - torch.where(central, log_middle, log_tail))
        slope = torch.where(central, slope, -slope)  # d g / d log s: +- s f(s) / mass
        curvature = slope * (1 + (2 * a + 1) * torch.expm1(log_x) - slope)
        u = u - 2 * g * slope / (2 * slope * slope - g * curvature)
    s = torch.where(df >= _EXPANSION_DF, expansion, u.exp())
    s = torch.where(h == 0, 0.0, torch.where(q == 0, math.inf, s))
    return torch.where(p < 0.5, -s, s)


def _log_t_masses(u, a, log_beta, terms):
    """(log P(T > s), log P(0 < T < s), log x) at s = exp(u), x = df / (df + s^2), for 2a degrees of freedom."""
    log_w = 2 * u - torch.log(2 * a)  # log(s^2 / df)
    log_x, log_y = -_log1p_exp(log_w), -_log1p_exp(-log_w)  # x and 1 - x, each without cancellation
    x, y = log_x.exp(), log_y.exp()
    flip = x > (a + 1) / (a + 2.5)  # the fraction of I_x(a, b) converges fast below (a + 1) / (a + b + 2)
    first, second = torch.where(flip, 0.5, a), torch.where(flip, a, 0.5)
    log_front = a * log_x + 0.5 * log_y - torch.log(first) - log_beta  # x^a y^(1/2) / (first B)
    direct = log_front - torch.log(_beta_fraction(torch.where(flip, y, x), first, second, terms))
    other = torch.log1p(-direct.exp())
    half = math.log(0.5)
    return half + torch.where(flip, other, direct), half + torch.where(flip, direct, other), log_x


def _beta_fraction(x, a, b, terms):
    """The continued fraction of I_x(a, b) = x^a (1 - x)^b / (a B(a, b)) / fraction, evaluated backwards from
    `terms` terms (A&S 26.5.8: d_2m+1 = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1)),
    d_2m = m (b - m) x / ((a + 2m - 1)(a + 2m)))."""
    fraction = torch.ones_like(x)
    ab = a + b
    for k in range(terms, 0, -1):
        m = float(k // 2)  # float scalars: an int one costs a conversion per op
        if k % 2:
            d = (a + m).mul_(ab + m).mul_(x).div_((a + 2 * m).mul_(a + (2 * m + 1)))
            fraction = d.div_(fraction).neg_().add_(1.0)
        else:
            d = (b - m).mul_(m * x).div_((a + (2 * m - 1)).mul_(a + 2 * m))
            fraction = d.div_(fraction).add_(1.0)
    return fraction


def _log_gamma_half_step(a):
    """log Gamma(a + 1/2) - log Gamma(a): lgamma's difference below 25, Stirling's series of the difference above
    (two large lgamma values would cancel to 1e-12 relative at df 1e6)."""
    big = a.clamp(min=25)
    series = 0.5 * torch.log(big) + big * torch.log1p(0.5 / big) - 0.5
    r1, r0 = 1 / (big + 0.5), 1 / big
    s1, s0 = r1 * r1, r0 * r0
    for c in _STIRLING:
        series = series + c * (r1 - r0)
        r1, r0 = r1 * s1, r0 * s0
    small = a.clamp(max=25)
    return torch.where(a < 25, torch.lgamma(small + 0.5) - torch.lgamma(small), series)


def _log1p_exp(v):
    return v.clamp(min=0) + torch.log1p(torch.exp(-v.abs()))


def sample_key(seed, split):
    """The key of a run's sampled forecasts on one split (distinct from dropout's mask keys)."""
    return splitmix64(splitmix64(seed ^ 0x5A4D504C45) ^ sum(map(ord, split)))


def window_keys(seed, split, numbers):
    """One key per window: the window's number in its split, whichever rank and batch it lands in."""
    base = sample_key(seed, split)
    return [generator_seed(splitmix64(base ^ int(n))) for n in numbers]


class SampleStream:
    """Uniform draws for sampled forecasts: window i's from a generator seeded with keys[i], in sample order,
    so sample s of a window is the same numbers however many samples, processes or batch sizes there are."""

    def __init__(self, keys, samples, shape, device):
        self.keys, self.samples, self.shape, self.device = keys, samples, tuple(shape), device

    def uniforms(self):
        """[windows, samples, *shape] float64 in (0, 1)."""
        generator = torch.Generator(device=self.device)
        draws = []
        for key in self.keys:
            generator.manual_seed(key)
            draws.append(torch.rand((self.samples, *self.shape), generator=generator, dtype=torch.float64,
                                    device=self.device))
        tiny = torch.finfo(torch.float64).tiny  # rand may return 0, whose inverse CDF is -inf
        return torch.stack(draws).clamp_(min=tiny) if draws else torch.zeros(0, self.samples, *self.shape,
                                                                               dtype=torch.float64, device=self.device)


class ObjectiveSums:
    """The objective's loss summed over every scored element in float64 (per-window sums first, so a window's
    sum does not depend on its batch or rank): the exact global validation loss after one all_reduce."""

    def __init__(self, objective):
        self.objective, self.total, self.count, self._pending = objective, 0.0, 0, []

    def update(self, params, true):
        elements = self.objective.loss_elements(params.float(), true.float())
        self._pending.append(elements.flatten(1).sum(1).sum(dtype=torch.float64))
        self.count += elements.numel()

    def all_reduce(self):
        local = torch.stack(self._pending).sum().item() if self._pending else 0.0
        self._pending = []
        self.total, self.count = distributed.all_reduce_sum([self.total + local, self.count])
        return self

    def loss(self):
        return self.total / self.count if self.count else math.nan
