"""Cases of lab/tslib_layers.py for the rest of TSLib's layer surface: Autoformer_EncDec,
AutoCorrelation, FourierCorrelation, MultiWaveletCorrelation, ETSformer_EncDec, Pyraformer_EncDec,
Crossformer_EncDec, MSGBlock and TimeFilter_layers (the driver imports this module; run it there:
`python lab/tslib_layers.py --tslib PATH --only Autoformer_EncDec.`).

Besides forward and gradients with TSLib's weights loaded strictly, every case checks the fresh build:
under the same torch and NumPy seeds ours must draw the same weights as TSLib's (FEDformer's random
Fourier modes, ETSformer's and MSGNet's parameters...), so a seeded run here starts where TSLib's does.
The one stated exception is the multiwavelet filters (buffers): ours are exact, TSLib's lose digits
(layers/MultiWaveletCorrelation.get_filter); its buffers are loaded like its weights for the comparison.

Every case holds to the driver's 1e-5: the FFT-based layers (FEDformer's mode products run as one einsum
where TSLib loops over modes) differ by rounding only.
"""
import argparse

import numpy as np
import torch

from lab.tslib_layers import case

_built = {}  # (case, shape) -> TSLib's fresh state_dict, awaiting ours (the driver builds TSLib's first)
_USES = ("layers.AutoCorrelation", "layers.SelfAttention_Family")


def _same_init(name, build, differ=()):
    """build, NumPy seeded too, and the two sides' fresh state_dicts compared (keys in `differ` may differ)."""
    def seeded(lib, shape):
        np.random.seed(shape.get("np_seed", 7))
        layer = build(lib, shape)
        state = {k: v.clone() for k, v in layer.state_dict().items()}
        for path, module in layer.named_modules():  # FEDformer's modes, drawn from NumPy at construction
            for attribute in ("index", "index_q", "index_kv"):
                if isinstance(getattr(module, attribute, None), list):
                    state[f"{path}.{attribute} (modes)"] = torch.tensor(getattr(module, attribute))
        key = (name, id(shape))
        if key not in _built:
            _built[key] = state
            return layer
        theirs = _built.pop(key)
        for key, value in theirs.items():
            if key not in differ and not torch.equal(value, state[key]):
                raise AssertionError(f"fresh {key} differs from TSLib's under the same seed")
        return layer
    return seeded


def _case(name, module, build, inputs, shapes, differ=(), **options):
    case(name, module, _same_init(name, build, differ), inputs, shapes, uses=_USES, **options)


class _Training(torch.nn.Module):
    """Runs the wrapped layer in training mode (the driver compares in eval mode)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, *args, **kwargs):
        return self.layer.train()(*args, **kwargs)


def _randn(generator, *shape):
    return torch.randn(*shape, generator=generator)


def _calendar(generator, B, L):
    """Integer month, day, weekday and hour marks (the fixed embedding Pyraformer's encoder builds)."""
    return torch.stack([torch.randint(high, (B, L), generator=generator) for high in (13, 32, 7, 24)], -1).float()


def _tokens(s, g):
    return (_randn(g, s["B"], s["L"], s["d"]),), {}


def _qkv(s, g):
    return (*(_randn(g, s["B"], n, s["H"], s["E"]) for n in (s["L"], s["S"], s["S"])), None), {}


def _qkv_tokens(s, g):
    return (*(_randn(g, s["B"], n, s["d"]) for n in (s["L"], s["S"], s["S"])), None), {}


_SERIES = [dict(B=2, L=24, d=3), dict(B=3, L=96, d=7), dict(B=1, L=37, d=16)]
_HEADS = [dict(B=2, L=24, S=24, H=2, E=8), dict(B=3, L=96, S=48, H=4, E=16), dict(B=1, L=37, S=50, H=8, E=4)]
_LAYERS = [dict(B=2, L=24, S=24, H=2, d=16), dict(B=3, L=96, S=48, H=4, d=32), dict(B=1, L=37, S=50, H=8, d=64)]


def _autoformer_cases():
    A, C = "layers.Autoformer_EncDec", "layers.AutoCorrelation"
    _case("Autoformer_EncDec.my_Layernorm", A, lambda lib, s: lib(A).my_Layernorm(s["d"]), _tokens, _SERIES)
    for kernel, stride in ((25, 1), (5, 2), (4, 1)):
        _case(f"Autoformer_EncDec.moving_avg {kernel} stride {stride}", A,
              lambda lib, s, k=kernel, st=stride: lib(A).moving_avg(k, st), _tokens, _SERIES)
    for kernel in (25, 3, 1):
        _case(f"Autoformer_EncDec.series_decomp {kernel}", A, lambda lib, s, k=kernel: lib(A).series_decomp(k),
              _tokens, _SERIES)
    _case("Autoformer_EncDec.series_decomp_multi 13 17", A, lambda lib, s: lib(A).series_decomp_multi([13, 17]),
          _tokens, _SERIES)

    def correlation(lib, s, mask=False):
        return lib(C).AutoCorrelationLayer(lib(C).AutoCorrelation(mask, 1, None, 0.1, False), s["d"], s["H"])

    def encoder_layer(lib, s, activation="gelu"):
        return lib(A).EncoderLayer(correlation(lib, s), s["d"], 2 * s["d"], 25, 0.1, activation)

    for activation in ("gelu", "relu"):
        _case(f"Autoformer_EncDec.EncoderLayer {activation}", A,
              lambda lib, s, a=activation: encoder_layer(lib, s, a), _tokens, _LAYERS)
    _case("Autoformer_EncDec.Encoder", A, lambda lib, s: lib(A).Encoder(
        [encoder_layer(lib, s) for _ in range(2)], norm_layer=lib(A).my_Layernorm(s["d"])), _tokens, _LAYERS)

    def decoder_layer(lib, s):
        return lib(A).DecoderLayer(correlation(lib, s, True), correlation(lib, s), s["d"], 3, 2 * s["d"], 25, 0.1,
                                   "gelu")

    pair = lambda s, g: ((_randn(g, s["B"], s["L"], s["d"]), _randn(g, s["B"], s["S"], s["d"])), {})  # noqa: E731
    _case("Autoformer_EncDec.DecoderLayer", A, decoder_layer, pair, _LAYERS)
    with_trend = lambda s, g: ((_randn(g, s["B"], s["L"], s["d"]), _randn(g, s["B"], s["S"], s["d"])),  # noqa
                               {"trend": _randn(g, s["B"], s["L"], 3)})
    _case("Autoformer_EncDec.Decoder", A, lambda lib, s: lib(A).Decoder(
        [decoder_layer(lib, s) for _ in range(2)], lib(A).my_Layernorm(s["d"]), torch.nn.Linear(s["d"], 3)),
        with_trend, _LAYERS)
    for mode in ("eval", "training", "weights"):
        def inner(lib, s, m=mode):
            layer = lib(C).AutoCorrelation(True, 2, None, 0.1, m == "weights")
            return _Training(layer) if m == "training" else layer
        _case(f"AutoCorrelation.AutoCorrelation {mode}", C, inner, _qkv, _HEADS)
    _case("AutoCorrelation.AutoCorrelationLayer", C, correlation, _qkv_tokens, _LAYERS)
    _case("AutoCorrelation.AutoCorrelationLayer training", C, lambda lib, s: _Training(correlation(lib, s)),
          _qkv_tokens, _LAYERS)


_FOURIER = [dict(B=2, L=24, S=24, H=2, E=8, m=4), dict(B=3, L=96, S=48, H=4, E=8, m=32),
            dict(B=1, L=37, S=50, H=8, E=4, m=64, np_seed=3)]


def _fourier_cases():
    F, W = "layers.FourierCorrelation", "layers.MultiWaveletCorrelation"
    for select in ("random", "low"):
        _case(f"FourierCorrelation.FourierBlock {select}", F, lambda lib, s, m=select: lib(F).FourierBlock(
            s["H"] * s["E"], s["H"] * s["E"], s["H"], s["L"], s["m"], m), _qkv, _FOURIER)
        for activation in ("tanh", "softmax"):
            _case(f"FourierCorrelation.FourierCrossAttention {select} {activation}", F,
                  lambda lib, s, m=select, a=activation: lib(F).FourierCrossAttention(
                      s["H"] * s["E"], s["H"] * s["E"], s["L"], s["S"], s["m"], m, a, num_heads=s["H"]),
                  _qkv, _FOURIER)
    filters = ("ec_s", "ec_d", "rc_e", "rc_o")
    waves = [dict(B=2, L=24, S=24, H=2, E=8, c=4, k=3, L0=0), dict(B=3, L=96, S=48, H=4, E=8, c=8, k=8, L0=1),
             dict(B=1, L=37, S=50, H=2, E=4, c=2, k=4, L0=0)]
    transform = lambda lib, s: lib(W).MultiWaveletTransform(s["H"] * s["E"], s["k"], 16, s["c"], 1, s["L0"])  # noqa
    _case("MultiWaveletCorrelation.MultiWaveletTransform", W, transform, _qkv, waves,
          differ=[f"MWT_CZ.0.{f}" for f in filters])
    _case("MultiWaveletCorrelation.MultiWaveletTransform nCZ 2", W, lambda lib, s: lib(W).MultiWaveletTransform(
        s["H"] * s["E"], s["k"], 8, s["c"], 2, s["L0"]), _qkv, waves,
        differ=[f"MWT_CZ.{i}.{f}" for f in filters for i in (0, 1)])
    for activation in ("tanh", "softmax"):
        _case(f"MultiWaveletCorrelation.MultiWaveletCross {activation}", W,
              lambda lib, s, a=activation: lib(W).MultiWaveletCross(
                  s["H"] * s["E"], s["H"] * s["E"], s["L"], s["S"], 8, s["c"], s["k"], s["H"] * s["E"], s["L0"],
                  activation=a), _qkv, waves, differ=filters)
    _case("MultiWaveletCorrelation.sparseKernelFT1d", W, lambda lib, s: lib(W).sparseKernelFT1d(s["k"], 8, s["c"]),
          lambda s, g: ((_randn(g, s["B"], s["L"], s["c"], s["k"]),), {}), waves)


def _ets_cases():
    E = "layers.ETSformer_EncDec"
    ets = [dict(B=2, L=24, P=12, d=16, H=2, c=3, k=2), dict(B=3, L=96, P=48, d=32, H=4, c=7, k=3),
           dict(B=1, L=37, P=5, d=8, H=8, c=1, k=1)]
    heads = lambda s, g: ((_randn(g, s["B"], s["L"], s["H"], s["d"] // s["H"]),), {})  # noqa: E731
    _case("ETSformer_EncDec.ExponentialSmoothing", E, lambda lib, s: lib(E).ExponentialSmoothing(
        s["d"] // s["H"], s["H"]), heads, ets)
    _case("ETSformer_EncDec.ExponentialSmoothing aux", E, lambda lib, s: lib(E).ExponentialSmoothing(
        s["d"] // s["H"], s["H"], aux=True), lambda s, g: (heads(s, g)[0] + heads(s, g)[0], {}), ets)
    _case("ETSformer_EncDec.Feedforward", E, lambda lib, s: lib(E).Feedforward(s["d"], 2 * s["d"]), _tokens, ets)
    _case("ETSformer_EncDec.GrowthLayer", E, lambda lib, s: lib(E).GrowthLayer(s["d"], s["H"]), _tokens, ets)
    _case("ETSformer_EncDec.FourierLayer", E, lambda lib, s: lib(E).FourierLayer(s["d"], s["P"], k=s["k"]),
          _tokens, ets)
    def level(s, g):
        return (_randn(g, s["B"], s["L"], s["c"]), *(_randn(g, s["B"], s["L"], s["d"]) for _ in "gs")), {}

    _case("ETSformer_EncDec.LevelLayer", E, lambda lib, s: lib(E).LevelLayer(s["d"], s["c"]), level, ets)
    layer = lambda lib, s: lib(E).EncoderLayer(s["d"], s["H"], s["c"], s["L"], s["P"], s["k"])  # noqa: E731
    res_level = lambda s, g: ((_randn(g, s["B"], s["L"], s["d"]), _randn(g, s["B"], s["L"], s["c"])), {})  # noqa
    _case("ETSformer_EncDec.EncoderLayer", E, layer, res_level, ets)
    _case("ETSformer_EncDec.Encoder", E, lambda lib, s: lib(E).Encoder([layer(lib, s) for _ in range(2)]),
          res_level, ets)
    _case("ETSformer_EncDec.DampingLayer", E, lambda lib, s: lib(E).DampingLayer(s["P"], s["H"]),
          lambda s, g: ((_randn(g, s["B"], 1, s["d"]),), {}), ets)
    def horizons(s, g):
        return (_randn(g, s["B"], s["L"] + 1, s["d"]), _randn(g, s["B"], s["L"] + s["P"], s["d"])), {}

    decoder_layer = lambda lib, s: lib(E).DecoderLayer(s["d"], s["H"], s["c"], s["P"])  # noqa: E731
    _case("ETSformer_EncDec.DecoderLayer", E, decoder_layer, horizons, ets)
    _case("ETSformer_EncDec.Decoder", E, lambda lib, s: lib(E).Decoder([decoder_layer(lib, s) for _ in range(2)]),
          lambda s, g: (tuple([list(x) for x in zip(horizons(s, g)[0], horizons(s, g)[0])]), {}), ets)


def _pyraformer_cases():
    P = "layers.Pyraformer_EncDec"
    pyra = [dict(B=2, L=24, C=3, d=16, H=2, w=[2, 2], i=3), dict(B=3, L=96, C=7, d=32, H=4, w=[4, 4], i=5),
            dict(B=1, L=37, C=2, d=16, H=8, w=[2, 3, 2], i=3)]
    configs = lambda s: argparse.Namespace(seq_len=s["L"], d_model=s["d"], d_ff=2 * s["d"], n_heads=s["H"],  # noqa
                                           dropout=0.1, e_layers=2, enc_in=s["C"])
    _case("Pyraformer_EncDec.Encoder", P, lambda lib, s: lib(P).Encoder(configs(s), s["w"], s["i"]),
          lambda s, g: ((_randn(g, s["B"], s["L"], s["C"]), _calendar(g, s["B"], s["L"])), {}), pyra)
    _case("Pyraformer_EncDec.Bottleneck_Construct", P, lambda lib, s: lib(P).Bottleneck_Construct(
        s["d"], s["w"], s["d"] // 4), lambda s, g: ((_randn(g, s["B"], s["L"], s["d"]),), {}), pyra)
    for before in (True, False):
        _case(f"Pyraformer_EncDec.PositionwiseFeedForward {'pre' if before else 'post'}-norm", P,
              lambda lib, s, b=before: lib(P).PositionwiseFeedForward(s["d"], 2 * s["d"], 0.1, b),
              lambda s, g: ((_randn(g, s["B"], s["L"], s["d"]),), {}), pyra)
    masked = lambda s, g: ((_randn(g, s["B"], s["L"], s["d"]),  # noqa: E731
                            torch.rand(s["L"], s["L"], generator=g).lt(0.5).fill_diagonal_(False).expand(
                                s["B"], -1, -1)), {})
    _case("Pyraformer_EncDec.EncoderLayer", P, lambda lib, s: lib(P).EncoderLayer(s["d"], 2 * s["d"], s["H"]),
          masked, pyra)


def _crossformer_cases():
    X, A = "layers.Crossformer_EncDec", "layers.SelfAttention_Family"
    cross = [dict(B=2, C=3, S=4, d=16, H=2, f=2, w=2, seg=6), dict(B=3, C=7, S=12, d=32, H=4, f=5, w=2, seg=12),
             dict(B=1, C=2, S=7, d=16, H=4, f=3, w=3, seg=4)]
    segments = lambda s, g: ((_randn(g, s["B"], s["C"], s["S"], s["d"]),), {})  # noqa: E731
    configs = lambda s: argparse.Namespace(factor=s["f"], dropout=0.1)  # noqa: E731
    _case("Crossformer_EncDec.SegMerging", X, lambda lib, s: lib(X).SegMerging(s["d"], s["w"]), segments, cross)

    def block(lib, s, win, segs):
        return lib(X).scale_block(configs(s), win, s["d"], s["H"], 2 * s["d"], 1, 0.1, segs, s["f"])

    _case("Crossformer_EncDec.scale_block", X, lambda lib, s: block(lib, s, s["w"], -(-s["S"] // s["w"])),
          segments, cross)
    _case("Crossformer_EncDec.Encoder", X, lambda lib, s: lib(X).Encoder(
        [block(lib, s, 1, s["S"]), block(lib, s, s["w"], -(-s["S"] // s["w"]))]), segments, cross)

    def decoder_layer(lib, s):
        return lib(X).DecoderLayer(
            lib(A).TwoStageAttentionLayer(configs(s), s["S"], s["f"], s["d"], s["H"], 2 * s["d"], 0.1),
            lib(A).AttentionLayer(lib(A).FullAttention(False, s["f"], attention_dropout=0.1, output_attention=False),
                                  s["d"], s["H"]), s["seg"], s["d"], 2 * s["d"], 0.1)

    def pair(s, g):
        return (_randn(g, s["B"], s["C"], s["S"], s["d"]), _randn(g, s["B"], s["C"], s["S"] + 2, s["d"])), {}

    _case("Crossformer_EncDec.DecoderLayer", X, decoder_layer, pair, cross)
    _case("Crossformer_EncDec.Decoder", X, lambda lib, s: lib(X).Decoder([decoder_layer(lib, s) for _ in range(2)]),
          lambda s, g: ((_randn(g, s["B"], s["C"], s["S"], s["d"]),
                         [_randn(g, s["B"], s["C"], s["S"] - i, s["d"]) for i in range(2)]), {}), cross)


def _msg_cases():
    M = "layers.MSGBlock"
    msg = [dict(B=2, L=24, P=12, C=3, d=16, H=2), dict(B=3, L=96, P=48, C=7, d=32, H=4),
           dict(B=1, L=37, P=5, C=2, d=16, H=8)]
    for individual in (False, True):
        _case(f"MSGBlock.Predict individual={individual}", M, lambda lib, s, i=individual: lib(M).Predict(
            i, s["C"], s["L"], s["P"], 0.1), lambda s, g: ((_randn(g, s["B"], s["C"], s["L"]),), {}), msg)
    _case("MSGBlock.Attention_Block", M, lambda lib, s: lib(M).Attention_Block(s["d"], 2 * s["d"], s["H"]),
          lambda s, g: ((_randn(g, s["B"], s["L"], s["d"]),), {}), msg)
    _case("MSGBlock.FullAttention unmasked weights", M, lambda lib, s: lib(M).FullAttention(
        False, output_attention=True), lambda s, g: ((*(_randn(g, s["B"], s["L"], s["H"], 4) for _ in "qkv"),
                                                      None), {}), msg)
    _case("MSGBlock.GraphBlock", M, lambda lib, s: lib(M).GraphBlock(s["C"], s["d"], 8, 16, 2, 0.1, 0.3, s["L"], 5),
          lambda s, g: ((_randn(g, s["B"], s["L"], s["d"]),), {}), msg)
    grids = [dict(B=2, C=4, N=6, P=4, e=8, h=2), dict(B=3, C=16, N=12, P=8, e=16, h=4),
             dict(B=1, C=2, N=5, P=3, e=8, h=1)]
    _case("MSGBlock.simpleVIT", M, lambda lib, s: lib(M).simpleVIT(s["C"], s["e"], 1, 2, s["h"]),
          lambda s, g: ((_randn(g, s["B"], s["C"], s["N"], s["P"]),), {}), grids)


def _timefilter_cases():
    T = "layers.TimeFilter_layers"
    graphs = [dict(B=2, n=3, N=4, d=16, H=2, p=0.5), dict(B=3, n=7, N=6, d=32, H=4, p=0.8),
              dict(B=1, n=2, N=5, d=8, H=1, p=0.0)]
    patches = lambda s, g: ((_randn(g, s["B"], s["n"] * s["N"], s["d"]),), {})  # noqa: E731
    _case("TimeFilter_layers.TimeFilter_Backbone", T, lambda lib, s: lib(T).TimeFilter_Backbone(
        s["d"], s["n"], None, s["H"], 2, s["p"], 0.1, s["n"] * s["N"]), patches, graphs)
    _case("TimeFilter_layers.GraphBlock alpha 0.3", T, lambda lib, s: _Alpha(lib(T).GraphBlock(
        s["d"], s["n"], None, s["H"], s["p"], 0.1, s["n"] * s["N"]), 0.3), patches, graphs)


class _Alpha(torch.nn.Module):
    """Calls the layer with masks=None and the given alpha."""

    def __init__(self, layer, alpha):
        super().__init__()
        self.layer, self.alpha = layer, alpha

    def forward(self, x):
        return self.layer(x, None, self.alpha)


_autoformer_cases()
_fourier_cases()
_ets_cases()
_pyraformer_cases()
_crossformer_cases()
_msg_cases()
_timefilter_cases()
