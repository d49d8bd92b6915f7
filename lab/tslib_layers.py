"""TSLib's layer surface here against TSLib's own code: forward and gradients, weight for weight.

    git clone https://github.com/thuml/Time-Series-Library /path/to/TSLib
    python lab/tslib_layers.py --tslib /path/to/TSLib [--only Embed.] [--out FILE.md]

For every case of the registry (CASES) the layer is built twice, from TSLib's module (imported from the
checkout, nothing of it copied here) and from ours of the same name; TSLib's state_dict is loaded into
ours strictly, so the two share every weight and every key name. Both run in eval mode (dropout 0 for
the comparison) on the same inputs at several shapes, the global generator reseeded before each forward
(ProbAttention samples keys with it; ours draws as TSLib for the comparison), and are differentiated
against the same random cotangent. A row per case: the largest relative difference (max |ours - theirs| /
max |theirs|) of the outputs, and of the gradients of every input and parameter (the worst named; a
gradient that is zero in exact arithmetic, such as an attention key bias's, is measured against the
layer's largest gradient, see _rounding_floor), pass at the case's tolerance: 1e-5 in float32, looser only
with a stated reason. A difference over the tolerance passes only where TSLib's float32 is itself that far
from exact: ours' worst error against TSLib's layer run in float64 at most ROUNDING_FACTOR (3) times
TSLib's own float32 worst (compare_shape; the row gives both errors and how many quantities passed so).

Adding cases: call `case(...)` here (the registry below the driver), or in a module
lab/tslib_layers_<topic>.py, which this
driver imports (each such module does `from lab.tslib_layers import case`). A case names the
module, builds the layer from a `lib` (lib("layers.Embed") is that side's module) and gives its inputs.
Packages TSLib's modules import at the top and we do not install (reformer_pytorch, ...) are stubbed on
TSLib's side only (STUBBED): importing then works, building the class that needs them does not.
"""
import argparse
import contextlib
import copy
import importlib
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from unittest import mock

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if __name__ == "__main__":  # one registry: the case modules' `from lab.tslib_layers import case` finds this one
    sys.modules.setdefault("lab.tslib_layers", sys.modules[__name__])
from benchmarks.checkouts import packages_from  # noqa: E402
from utils.errors import UserError, require  # noqa: E402

# Third-party packages TSLib's layer modules import at their top that this environment may lack.
STUBBED = ("reformer_pytorch", "mamba_ssm", "pywt", "ptwt")
# Differences over the tolerance pass as rounding when ours' worst error against TSLib's float64 result is at
# most this many times TSLib's own float32 error (compare_shape). Measured: the fused attention's backward
# (PyTorch's CPU kernel forms the softmax gradient from the rounded output) is 1 to 2.2 times as far from exact
# as TSLib's einsum and softmax on Crossformer's router gradients, which cancel to 1e-3 of the layer's scale.
ROUNDING_FACTOR = 3
ROUNDING = 1e-6  # a gradient this much smaller than the layer's largest is rounding of a zero (_rounding_floor)


@dataclass
class Case:
    name: str  # the row: "<Module>.<Class>[ <variant>]"
    module: str  # "layers.Embed"
    build: Callable  # (lib, shape) -> nn.Module; lib(module name) is that side's module
    inputs: Callable  # (shape, generator) -> (args tuple, kwargs dict)
    shapes: list = field(default_factory=list)  # dicts handed to build and inputs
    tolerance: float = 1e-5
    reason: str = ""  # why a looser tolerance
    outputs: Callable = None  # forward's result -> the tensors compared (default: every tensor in it)
    uses: tuple = ()  # other modules the build takes from lib (a block built around another module's)


CASES = []


def case(name, module, build, inputs, shapes, tolerance=1e-5, reason="", outputs=None, uses=()):
    """Register a case (see Case); returns it."""
    require(tolerance <= 1e-5 or reason, f"case {name}: a tolerance above 1e-5 needs a reason")
    registered = Case(name, module, build, inputs, list(shapes), tolerance, reason, outputs, tuple(uses))
    CASES.append(registered)
    return registered


# ----------------------------------------------------------------------------- the two sides' modules

def _stub(name):
    """An importable stand-in for a missing package: any name imported from it is a class that refuses."""
    stub = types.ModuleType(name)

    def missing(attribute):
        def refuse(*args, **kwargs):
            raise ModuleNotFoundError(f"{name} is not installed (stubbed by lab/tslib_layers.py)")
        return type(attribute, (), {"__init__": refuse})

    stub.__getattr__ = missing
    return stub


def tslib_modules(root, names):
    """{name: TSLib's module} for the module names, imported from checkout `root`, missing packages stubbed."""
    root = Path(root)
    require((root / "layers" / "Embed.py").is_file(),
            f"--tslib {root} has no layers/Embed.py: give the root of a Time-Series-Library checkout")
    stubs = {name: _stub(name) for name in STUBBED if importlib.util.find_spec(name) is None}
    modules = {}
    with packages_from(root):
        sys.modules.update(stubs)
        try:
            for name in names:
                modules[name] = importlib.import_module(name)
                require(Path(modules[name].__file__).resolve().is_relative_to(root.resolve()),
                        f"imported {modules[name].__file__}, not {root}'s {name}")
        finally:
            for name in stubs:
                sys.modules.pop(name, None)
    return modules


def our_modules(names):
    return {name: importlib.import_module(name) for name in names}


# ----------------------------------------------------------------------------- the comparison

def _tensors(value):
    """The tensors in a (nested) forward result, in order."""
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _relative(ours, theirs, floor=0.0):
    scale = max(theirs.detach().abs().max().item() if theirs.numel() else 0.0, floor)
    gap = (ours.detach().double() - theirs.detach().double()).abs().max().item() if theirs.numel() else 0.0
    return gap / scale if scale > 0 else gap


def _map(value, fn):
    """value with fn applied to every tensor in it (nested tuples and lists kept)."""
    if torch.is_tensor(value):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_map(item, fn) for item in value)
    return value


def _inputs(a_case, shape, seed, dtype=None):
    """Two identical copies of the case's inputs (in `dtype`, if given), the floating tensors requiring
    gradients."""
    def fresh(t):
        t = t.detach().to(dtype) if dtype is not None and t.is_floating_point() else t.clone()
        return t.requires_grad_(t.is_floating_point())

    copies = []
    for _ in range(2):
        args, kwargs = a_case.inputs(shape, torch.Generator().manual_seed(seed))
        copies.append((_map(args, fresh), {key: _map(value, fresh) for key, value in kwargs.items()}))
    return copies


def _run(layer, args, kwargs, seed, pick):
    """Forward (the global generator seeded first) and backward against seeded random cotangents."""
    torch.manual_seed(seed)
    outputs = pick(layer(*args, **kwargs))
    generator = torch.Generator().manual_seed(seed + 1)
    total = sum((out * torch.randn(out.shape, generator=generator, dtype=torch.float32).to(out.dtype)).sum()
                for out in outputs if out.requires_grad)  # the same cotangent for a float64 run
    if torch.is_tensor(total):
        total.backward()
    grads = {f"input{i}": a.grad for i, a in enumerate(_tensors(args)) if a.grad is not None}
    grads.update({name: p.grad for name, p in layer.named_parameters() if p.grad is not None})
    return outputs, grads


@contextlib.contextmanager
def _as_tslib_draws():
    """Our ProbAttention draws its eval key sample from a fixed generator (TSLib: the global one, so that an
    eval forecast varies from call to call); for the comparison it draws from the global one, as TSLib."""
    with mock.patch.object(importlib.import_module("layers.SelfAttention_Family"), "eval_key_generator",
                           lambda: None):
        yield


def _gaps(outs, grads, ref_outs, ref_grads):
    """{quantity: relative difference} of outputs ("output") and gradients against a reference's."""
    largest = max((g.abs().max().item() for g in ref_grads.values() if g.numel()), default=0.0)
    gaps = {"output": max((_relative(a, b) for a, b in zip(outs, ref_outs)), default=0.0)}
    gaps.update({name: _relative(grads[name], ref_grads[name], _rounding_floor(ref_grads[name], largest))
                 for name in ref_grads})
    return gaps


def _exact(a_case, theirs, shape, seed, pick):
    """TSLib's layer in float64 on the same inputs: the exact result float32 rounding is measured against."""
    exact = copy.deepcopy(theirs).double()
    args, kwargs = _inputs(a_case, shape, seed, torch.float64)[0]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # tensors the layer makes in forward (torch.zeros, ...) too
    try:
        return _run(exact, args, kwargs, seed, pick)
    finally:
        torch.set_default_dtype(default)


def compare_shape(a_case, theirs_lib, ours_lib, shape, seed=0):
    """{quantity: (difference from TSLib's float32, passed, (ours, TSLib's) float64 errors or None)} at one
    shape; raises on a structural mismatch. Differences above the tolerance pass when ours is about as near
    TSLib's float64 result as TSLib's own float32 is (the worst quantity's error at most ROUNDING_FACTOR times
    TSLib's worst, or within the tolerance): rounding amplified by a cancellation (a gradient much smaller
    than the products summed into it) in both codes."""
    torch.manual_seed(seed)
    theirs = a_case.build(theirs_lib, shape).eval()
    torch.manual_seed(seed)
    ours = a_case.build(ours_lib, shape).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    (their_args, their_kwargs), (our_args, our_kwargs) = _inputs(a_case, shape, seed)
    pick = a_case.outputs or _tensors
    their_out, their_grads = _run(theirs, their_args, their_kwargs, seed, pick)
    with _as_tslib_draws():
        our_out, our_grads = _run(ours, our_args, our_kwargs, seed, pick)
    if len(their_out) != len(our_out) or any(a.shape != b.shape for a, b in zip(our_out, their_out)):
        raise AssertionError(f"outputs {[tuple(t.shape) for t in our_out]} vs TSLib's "
                             f"{[tuple(t.shape) for t in their_out]}")
    if set(their_grads) != set(our_grads):
        raise AssertionError(f"gradients of {sorted(set(their_grads) ^ set(our_grads))} on one side only")
    gaps = _gaps(our_out, our_grads, their_out, their_grads)
    if max(gaps.values()) <= a_case.tolerance:
        return {name: (gap, True, None) for name, gap in gaps.items()}
    exact_out, exact_grads = _exact(a_case, theirs, shape, seed, pick)
    ours_error = max(_gaps(our_out, our_grads, exact_out, exact_grads).values())
    theirs_error = max(_gaps(their_out, their_grads, exact_out, exact_grads).values())
    rounding = ours_error <= max(a_case.tolerance, ROUNDING_FACTOR * theirs_error)
    return {name: (gap, gap <= a_case.tolerance or rounding, (ours_error, theirs_error)) for name, gap in gaps.items()}


def _rounding_floor(grad, largest):
    """A gradient that vanishes in exact arithmetic (an attention key bias's: softmax ignores a constant
    added to a row) comes out as rounding, max |g| under ROUNDING of the layer's largest gradient: its
    difference is measured against that largest gradient, not divided by its own rounding."""
    small = grad.numel() and grad.abs().max().item() < ROUNDING * largest
    return largest if small else 0.0


def check_case(a_case, theirs, ours):
    """One row: {name, shapes, output, gradient, worst, gradients, rounding, passed, error}; `rounding`
    counts the quantities over the tolerance that passed as TSLib's own float32 rounding (compare_shape)."""
    row = {"name": a_case.name, "shapes": len(a_case.shapes), "output": 0.0, "gradient": 0.0, "worst": "",
           "gradients": 0, "rounding": 0, "error": "", "passed": True}
    lib_theirs, lib_ours = theirs.__getitem__, ours.__getitem__
    try:
        for index, shape in enumerate(a_case.shapes):
            gaps = compare_shape(a_case, lib_theirs, lib_ours, shape, seed=index)
            row["gradients"] = max(row["gradients"], len(gaps) - 1)
            for name, (gap, passed, errors) in gaps.items():
                row["passed"] &= passed
                row["rounding"] += passed and gap > a_case.tolerance
                if errors is not None:  # the float64 comparison's (ours, TSLib's) worst errors, worst shape
                    row["exact"] = max(row.get("exact", errors), errors)
                if name == "output":
                    row["output"] = max(row["output"], gap)
                elif gap >= row["gradient"]:
                    row["gradient"], row["worst"] = gap, name
    except Exception as error:  # a row that cannot run is a failed row, named, and the others go on
        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]
        row["passed"] = False
    return row


# ----------------------------------------------------------------------------- the report

def table(rows, cases):
    tolerance = {c.name: c for c in cases}
    lines = ["| layer | shapes | output | gradients | worst gradient | tolerance | result |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        a_case = tolerance[row["name"]]
        limit = f"{a_case.tolerance:.0e}" + (f" ({a_case.reason})" if a_case.reason else "")
        result = "pass" if row["passed"] else f"FAIL {row['error']}".strip()
        if "exact" in row:
            ours_error, theirs_error = row["exact"]
            result += (f" (vs float64: ours {ours_error:.1e}, TSLib's float32 {theirs_error:.1e}; "
                       f"{row['rounding']} over the tolerance passed as rounding)")
        lines.append(f"| {row['name']} | {row['shapes']} | {row['output']:.1e} | {row['gradient']:.1e} "
                     f"({row['gradients']}) | {row['worst']} | {limit} | {result} |")
    return lines


def load_case_modules():
    """Import lab/tslib_layers_<topic>.py: the other layer modules' cases."""
    for path in sorted(Path(__file__).parent.glob("tslib_layers_*.py")):
        importlib.import_module(f"lab.{path.stem}")


# ----------------------------------------------------------------------------- the registry
# Shapes: batch B, lengths L (queries) / S (keys), width d, heads H, channels C. Each case runs them all.

def _randn(generator, *shape):
    return torch.randn(*shape, generator=generator)


def _calendar(generator, B, L, minutes=True):
    """Integer calendar features as --embed fixed gives them: month, day, weekday, hour[, quarter-hour]."""
    highs = (13, 32, 7, 24, 4)[:5 if minutes else 4]
    return torch.stack([torch.randint(high, (B, L), generator=generator) for high in highs], -1).float()


_STEPS = [dict(B=2, L=24, C=3, d=16), dict(B=3, L=96, C=7, d=32), dict(B=1, L=37, C=1, d=8)]
_HEADS = [dict(B=2, L=12, S=12, H=2, E=8), dict(B=3, L=33, S=33, H=4, E=16), dict(B=1, L=96, S=96, H=8, E=4)]
_CROSS = [dict(B=2, L=12, S=20, H=2, E=8), dict(B=3, L=48, S=25, H=4, E=16)]
_LAYERS = [dict(B=2, L=16, S=16, H=2, d=16), dict(B=3, L=48, S=48, H=4, d=32), dict(B=1, L=96, S=96, H=8, d=64)]
_GRIDS = [dict(B=2, C=3, O=4, H=5, W=4, k=3), dict(B=2, C=8, O=8, H=12, W=24, k=6), dict(B=1, C=2, O=3, H=1, W=96, k=6)]


def _embed_cases():
    E = "layers.Embed"
    steps = lambda s, g: ((_randn(g, s["B"], s["L"], s["C"]),), {})  # noqa: E731
    case("Embed.PositionalEmbedding", E, lambda lib, s: lib(E).PositionalEmbedding(s["d"]), steps, _STEPS)
    case("Embed.TokenEmbedding", E, lambda lib, s: lib(E).TokenEmbedding(s["C"], s["d"]), steps, _STEPS)
    case("Embed.FixedEmbedding", E, lambda lib, s: lib(E).FixedEmbedding(24, s["d"]),
         lambda s, g: ((torch.randint(24, (s["B"], s["L"]), generator=g),), {}), _STEPS)
    for kind, freq in (("fixed", "h"), ("learned", "t")):
        case(f"Embed.TemporalEmbedding {kind} {freq}", E, lambda lib, s, k=kind, f=freq: lib(E).TemporalEmbedding(
            s["d"], k, f), lambda s, g, f=freq: ((_calendar(g, s["B"], s["L"], f == "t"),), {}), _STEPS)
    case("Embed.TimeFeatureEmbedding", E, lambda lib, s: lib(E).TimeFeatureEmbedding(s["d"], "timeF", "t"),
         lambda s, g: ((_randn(g, s["B"], s["L"], 5),), {}), _STEPS)
    with_marks = lambda s, g: ((_randn(g, s["B"], s["L"], s["C"]), _randn(g, s["B"], s["L"], 4)), {})  # noqa
    no_marks = lambda s, g: ((_randn(g, s["B"], s["L"], s["C"]), None), {})  # noqa: E731
    fixed_marks = lambda s, g: ((_randn(g, s["B"], s["L"], s["C"]), _calendar(g, s["B"], s["L"], False)), {})  # noqa
    for name in ("DataEmbedding", "DataEmbedding_wo_pos"):
        build = lambda lib, s, n=name, e="timeF": getattr(lib(E), n)(s["C"], s["d"], e, "h", 0.1)  # noqa: E731
        case(f"Embed.{name} timeF", E, build, with_marks, _STEPS)
        case(f"Embed.{name} no marks", E, build, no_marks, _STEPS)
        case(f"Embed.{name} fixed", E, lambda lib, s, n=name: getattr(lib(E), n)(s["C"], s["d"], "fixed", "h"),
             fixed_marks, _STEPS)
    inverted = lambda lib, s, extra=4: lib(E).DataEmbedding_inverted(s["L"], s["d"], "timeF", "h", 0.1)  # noqa
    case("Embed.DataEmbedding_inverted", E, inverted, with_marks, _STEPS)
    case("Embed.DataEmbedding_inverted no marks", E, inverted, no_marks, _STEPS)
    patches = [dict(B=2, C=3, L=24, d=16, p=8, s=4), dict(B=3, C=7, L=96, d=32, p=16, s=8),
               dict(B=1, C=2, L=37, d=8, p=5, s=3)]
    case("Embed.PatchEmbedding", E, lambda lib, s: lib(E).PatchEmbedding(s["d"], s["p"], s["s"], s["s"], 0.1),
         lambda s, g: ((_randn(g, s["B"], s["C"], s["L"]),), {}), patches)


def _heads(s, g, tau=False):
    q, k, v = (_randn(g, s["B"], n, s["H"], s["E"]) for n in (s["L"], s["S"], s["S"]))
    extra = {"tau": _randn(g, s["B"], 1).exp(), "delta": _randn(g, s["B"], s["S"])} if tau else {}
    return (q, k, v, None), extra


def _attention_cases():
    A = "layers.SelfAttention_Family"
    for name in ("FullAttention", "DSAttention"):
        tau = name == "DSAttention"
        for mask, weights, shapes in ((True, False, _HEADS), (False, False, _CROSS), (True, True, _HEADS),
                                      (False, True, _CROSS)):
            label = f"SelfAttention_Family.{name} {'causal' if mask else 'unmasked'}{' weights' if weights else ''}"
            case(label, A, lambda lib, s, n=name, m=mask, w=weights: getattr(lib(A), n)(m, 5, None, 0.1, w),
                 lambda s, g, t=tau: _heads(s, g, t), shapes)
    case("SelfAttention_Family.FullAttention scale 0.3", A, lambda lib, s: lib(A).FullAttention(False, 5, 0.3),
         _heads, _CROSS)
    # TSLib's weights [B, H, S, S] hold a row per query only when L == S: cross attention without them
    for mask, weights, shapes in ((True, True, _HEADS), (False, True, _HEADS), (False, False, _CROSS)):
        case(f"SelfAttention_Family.ProbAttention {'causal' if mask else 'unmasked'}{' weights' if weights else ''}",
             A, lambda lib, s, m=mask, w=weights: lib(A).ProbAttention(m, 3, None, 0.1, w), _heads, shapes)
    layer = lambda lib, s, inner="FullAttention", keys=None: lib(A).AttentionLayer(  # noqa: E731
        getattr(lib(A), inner)(True, 5, None, 0.1, False), s["d"], s["H"], keys, keys)
    tokens = lambda s, g: ((*(_randn(g, s["B"], n, s["d"]) for n in (s["L"], s["S"], s["S"])), None), {})  # noqa
    case("SelfAttention_Family.AttentionLayer", A, layer, tokens, _LAYERS)
    case("SelfAttention_Family.AttentionLayer d_keys 12", A, lambda lib, s: layer(lib, s, keys=12), tokens, _LAYERS)
    case("SelfAttention_Family.AttentionLayer ProbAttention", A, lambda lib, s: layer(lib, s, "ProbAttention"),
         tokens, _LAYERS)
    configs = lambda s: argparse.Namespace(factor=s["f"], dropout=0.1)  # noqa: E731
    case("SelfAttention_Family.TwoStageAttentionLayer", A, lambda lib, s: lib(A).TwoStageAttentionLayer(
        configs(s), s["L"], s["f"], s["d"], s["H"], 2 * s["d"], 0.1),
        lambda s, g: ((_randn(g, s["B"], s["C"], s["L"], s["d"]),), {}),
        [dict(B=2, C=3, L=4, f=2, d=16, H=2), dict(B=3, C=7, L=12, f=5, d=32, H=4)])



def _encdec_cases():
    T, A = "layers.Transformer_EncDec", "layers.SelfAttention_Family"

    def attn(lib, s, mask=False, inner="FullAttention"):
        return lib(A).AttentionLayer(getattr(lib(A), inner)(mask, 3, None, 0.1, False), s["d"], s["H"])

    def encoder_layer(lib, s, inner="FullAttention", activation="gelu"):
        return lib(T).EncoderLayer(attn(lib, s, inner=inner), s["d"], 2 * s["d"], 0.1, activation)

    tokens = lambda s, g: ((_randn(g, s["B"], s["L"], s["d"]),), {})  # noqa: E731
    case("Transformer_EncDec.ConvLayer", T, lambda lib, s: lib(T).ConvLayer(s["d"]), tokens, _LAYERS)
    for activation in ("gelu", "relu"):
        case(f"Transformer_EncDec.EncoderLayer {activation}", T,
             lambda lib, s, a=activation: encoder_layer(lib, s, activation=a), tokens, _LAYERS)
    case("Transformer_EncDec.Encoder", T, lambda lib, s: lib(T).Encoder(
        [encoder_layer(lib, s) for _ in range(2)], norm_layer=torch.nn.LayerNorm(s["d"])), tokens, _LAYERS)
    case("Transformer_EncDec.Encoder distilling", T, lambda lib, s: lib(T).Encoder(
        [encoder_layer(lib, s, "ProbAttention") for _ in range(3)], [lib(T).ConvLayer(s["d"]) for _ in range(2)],
        torch.nn.LayerNorm(s["d"])), tokens, _LAYERS)

    def decoder_layer(lib, s):
        return lib(T).DecoderLayer(attn(lib, s, True), attn(lib, s), s["d"], 2 * s["d"], 0.1, "gelu")

    pair = lambda s, g: ((_randn(g, s["B"], s["L"], s["d"]), _randn(g, s["B"], s["S"] + 5, s["d"])), {})  # noqa
    case("Transformer_EncDec.DecoderLayer", T, decoder_layer, pair, _LAYERS)
    case("Transformer_EncDec.Decoder", T, lambda lib, s: lib(T).Decoder(
        [decoder_layer(lib, s) for _ in range(2)], torch.nn.LayerNorm(s["d"]), torch.nn.Linear(s["d"], 3)),
        pair, _LAYERS)


class _RoundTrip(torch.nn.Module):
    """Normalize's two modes in one forward: normalise x, then map x_norm * 2 + 1 back."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        normed = self.norm(x, "norm")
        return normed, self.norm(normed * 2 + 1, "denorm")


class _Masks(torch.nn.Module):
    """utils/masking's masks applied to scores (their only use): hidden positions set to -1e4."""

    def __init__(self, lib):
        super().__init__()
        self.masking = lib("utils.masking")

    def forward(self, scores, index):
        B, H, L, S = scores.shape
        causal = self.masking.TriangularCausalMask(B, L).mask
        picked = scores.gather(2, index[..., None].expand(-1, -1, -1, S))
        prob = self.masking.ProbMask(B, H, L, index, picked).mask
        return scores.masked_fill(causal, -1e4), picked.masked_fill(prob, -1e4)


def _other_cases():
    N, C = "layers.StandardNorm", "layers.Conv_Blocks"
    for options in (dict(), dict(affine=True), dict(subtract_last=True, affine=True), dict(non_norm=True)):
        label = " ".join(options) or "plain"
        case(f"StandardNorm.Normalize {label}", N, lambda lib, s, o=options: _RoundTrip(lib(N).Normalize(
            s["C"], **o)), lambda s, g: ((_randn(g, s["B"], s["L"], s["C"]) * 3 + 2,), {}), _STEPS)
    case("StandardNorm.Normalize 4-d", N, lambda lib, s: _RoundTrip(lib(N).Normalize(s["C"], affine=True)),
         lambda s, g: ((_randn(g, s["B"], s["L"], 3, s["C"]),), {}), _STEPS)
    for name in ("Inception_Block_V1", "Inception_Block_V2"):
        case(f"Conv_Blocks.{name}", C, lambda lib, s, n=name: getattr(lib(C), n)(s["C"], s["O"], s["k"]),
             lambda s, g: ((_randn(g, s["B"], s["C"], s["H"], s["W"]),), {}), _GRIDS)
    case("masking.TriangularCausalMask, ProbMask", "utils.masking", lambda lib, s: _Masks(lib),
         lambda s, g: ((_randn(g, s["B"], s["H"], s["L"], s["L"]),
                        torch.randint(s["L"], (s["B"], s["H"], 3), generator=g)), {}), _HEADS)


_embed_cases()
_attention_cases()
_encdec_cases()
_other_cases()


def checkout(tslib):
    """The checkout's commit and date ("4e938a1 (2026-04-18)"), or its path where git cannot say."""
    try:
        return subprocess.run(["git", "-C", str(tslib), "log", "-1", "--format=%h (%cs)"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(tslib)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tslib", required=True, help="root of a thuml/Time-Series-Library checkout")
    p.add_argument("--only", default="", help="run the cases whose name starts with this (e.g. Embed.)")
    p.add_argument("--out", default=None, help="also write the report to this markdown file")
    args = p.parse_args(argv)
    load_case_modules()
    cases = [c for c in CASES if c.name.startswith(args.only)]
    require(cases, f"no case starts with --only {args.only!r}; cases: {', '.join(c.name for c in CASES)}")
    names = sorted({name for c in CASES for name in (c.module, *c.uses)})  # all: cases build from several
    theirs = tslib_modules(args.tslib, names)
    ours = our_modules(names)
    rows = []
    for a_case in cases:
        rows.append(check_case(a_case, theirs, ours))
        print(f"{a_case.name}: {'pass' if rows[-1]['passed'] else 'FAIL ' + rows[-1]['error']}", flush=True)
    passed = sum(row["passed"] for row in rows)
    report = "\n".join([
        f"# TSLib's layers: ours against TSLib {checkout(args.tslib)}", "",
        f"torch {torch.__version__}, float32, eval mode; max relative difference (max |ours - TSLib| / "
        f"max |TSLib|) over {sum(len(c.shapes) for c in cases)} shapes; gradients: the worst of (count) "
        "inputs and parameters.", "",
        *table(rows, cases), "", f"{passed} of {len(rows)} layers pass."]) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as error:
        sys.exit(f"error: {error}")
