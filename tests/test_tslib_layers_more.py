"""TSLib's layer surface, second half (layers/Autoformer_EncDec, AutoCorrelation, FourierCorrelation,
MultiWaveletCorrelation, ETSformer_EncDec, Pyraformer_EncDec, Crossformer_EncDec, MSGBlock,
TimeFilter_layers, DWT_Decomposition, MambaBlock), without TSLib: the names and signatures TSLib's model
files call, and small known values. lab/tslib_layers.py --tslib checks them against TSLib's code.
"""
import importlib
import importlib.util
import inspect
import math

import numpy as np
import pytest
import torch

from layers import dropout

# module -> {name: constructor (or function) parameters, as TSLib's model files call them}
SURFACE = {
    "layers.Autoformer_EncDec": {
        "my_Layernorm": ["channels"], "moving_avg": ["kernel_size", "stride"], "series_decomp": ["kernel_size"],
        "series_decomp_multi": ["kernel_size"],
        "EncoderLayer": ["attention", "d_model", "d_ff", "moving_avg", "dropout", "activation"],
        "Encoder": ["attn_layers", "conv_layers", "norm_layer"],
        "DecoderLayer": ["self_attention", "cross_attention", "d_model", "c_out", "d_ff", "moving_avg", "dropout",
                         "activation"],
        "Decoder": ["layers", "norm_layer", "projection"]},
    "layers.AutoCorrelation": {
        "AutoCorrelation": ["mask_flag", "factor", "scale", "attention_dropout", "output_attention"],
        "AutoCorrelationLayer": ["correlation", "d_model", "n_heads", "d_keys", "d_values"]},
    "layers.FourierCorrelation": {
        "FourierBlock": ["in_channels", "out_channels", "n_heads", "seq_len", "modes", "mode_select_method"],
        "FourierCrossAttention": ["in_channels", "out_channels", "seq_len_q", "seq_len_kv", "modes",
                                  "mode_select_method", "activation", "policy", "num_heads"],
        "get_frequency_modes": ["seq_len", "modes", "mode_select_method"]},
    "layers.MultiWaveletCorrelation": {
        "MultiWaveletTransform": ["ich", "k", "alpha", "c", "nCZ", "L", "base", "attention_dropout"],
        "MultiWaveletCross": ["in_channels", "out_channels", "seq_len_q", "seq_len_kv", "modes", "c", "k", "ich",
                              "L", "base", "mode_select_method", "initializer", "activation", "kwargs"],
        "get_filter": ["base", "k"]},
    "layers.ETSformer_EncDec": {
        "EncoderLayer": ["d_model", "nhead", "c_out", "seq_len", "pred_len", "k", "dim_feedforward", "dropout",
                         "activation", "layer_norm_eps"],
        "Encoder": ["layers"], "DecoderLayer": ["d_model", "nhead", "c_out", "pred_len", "dropout"],
        "Decoder": ["layers"], "Transform": ["sigma"]},
    "layers.Pyraformer_EncDec": {"Encoder": ["configs", "window_size", "inner_size"],
                                 "get_mask": ["input_size", "window_size", "inner_size"],
                                 "refer_points": ["all_sizes", "window_size"]},
    "layers.Crossformer_EncDec": {
        "scale_block": ["configs", "win_size", "d_model", "n_heads", "d_ff", "depth", "dropout", "seg_num", "factor"],
        "Encoder": ["attn_layers"], "Decoder": ["layers"],
        "DecoderLayer": ["self_attention", "cross_attention", "seg_len", "d_model", "d_ff", "dropout"]},
    "layers.MSGBlock": {
        "GraphBlock": ["c_out", "d_model", "conv_channel", "skip_channel", "gcn_depth", "dropout", "propalpha",
                       "seq_len", "node_dim"],
        "simpleVIT": ["in_channels", "emb_size", "patch_size", "depth", "num_heads", "dropout", "init_weight"],
        "Attention_Block": ["d_model", "d_ff", "n_heads", "dropout", "activation"],
        "Predict": ["individual", "c_out", "seq_len", "pred_len", "dropout"]},
    "layers.TimeFilter_layers": {
        "TimeFilter_Backbone": ["hidden_dim", "n_vars", "d_ff", "n_heads", "n_blocks", "top_p", "dropout", "in_dim"]},
}
FORWARDS = {  # forward parameters of the blocks models call directly
    ("layers.Autoformer_EncDec", "Encoder"): ["x", "attn_mask"],
    ("layers.Autoformer_EncDec", "Decoder"): ["x", "cross", "x_mask", "cross_mask", "trend"],
    ("layers.AutoCorrelation", "AutoCorrelationLayer"): ["queries", "keys", "values", "attn_mask"],
    ("layers.ETSformer_EncDec", "Encoder"): ["res", "level", "attn_mask"],
    ("layers.Pyraformer_EncDec", "Encoder"): ["x_enc", "x_mark_enc"],
    ("layers.Crossformer_EncDec", "Decoder"): ["x", "cross"],
    ("layers.TimeFilter_layers", "TimeFilter_Backbone"): ["x", "masks", "alpha"],
}


def _parameters(thing):
    return [name for name in inspect.signature(thing).parameters if name != "self"]


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_surface_names_and_signatures(module):
    imported = importlib.import_module(module)
    for name, parameters in SURFACE[module].items():
        assert _parameters(getattr(imported, name)) == parameters, f"{module}.{name}"
    for (owner, name), parameters in FORWARDS.items():
        if owner == module:
            assert _parameters(getattr(imported, name).forward) == parameters, f"{module}.{name}.forward"


@pytest.mark.parametrize("module, package", [("layers.MambaBlock", "mamba_ssm"),
                                             ("layers.DWT_Decomposition", "pywt")])
def test_layers_needing_a_package_name_it(module, package):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed")
    with pytest.raises(ModuleNotFoundError) as missing:
        importlib.import_module(module)
    assert missing.value.name.split(".")[0] == package  # what models.get_model_class turns into a pip command


def test_decomposition_of_a_ramp_replicates_the_ends():
    from layers.Autoformer_EncDec import moving_avg, series_decomp, series_decomp_multi
    x = torch.arange(10.0).view(1, 10, 1)
    seasonal, trend = series_decomp(3)(x)
    assert torch.allclose(trend[0, 1:-1, 0], x[0, 1:-1, 0])  # a linear series is its own moving average
    assert trend[0, 0, 0].item() == pytest.approx(1 / 3) and trend[0, -1, 0].item() == pytest.approx(26 / 3)
    assert torch.equal(seasonal + trend, x)
    assert moving_avg(3, 2)(x)[0, :, 0].tolist() == pytest.approx([1 / 3, 2, 4, 6, 8])
    multi_seasonal, multi_trend = series_decomp_multi([3, 5])(x)
    assert torch.allclose(multi_trend, (series_decomp(3)(x)[1] + series_decomp(5)(x)[1]) / 2)


def test_my_layernorm_removes_the_time_mean():
    from layers.Autoformer_EncDec import my_Layernorm
    out = my_Layernorm(4)(torch.randn(2, 7, 4) * 3 + 1)
    assert out.mean(dim=1).abs().max() < 1e-6


def test_autocorrelation_finds_the_delay():
    """Queries delayed by d against the keys: the top lag is d and the values come back rolled by it."""
    from layers.AutoCorrelation import AutoCorrelation
    torch.manual_seed(0)
    keys, values = torch.randn(2, 24, 2, 4), torch.randn(2, 24, 2, 4)
    queries = torch.roll(keys, 5, dims=1)
    layer = AutoCorrelation(factor=0.35).eval()  # int(0.35 * ln 24) = 1 lag
    out, _ = layer(queries, keys, values, None)
    assert torch.allclose(out, torch.roll(values, -5, dims=1), atol=1e-6)
    out, _ = layer.train()(queries, keys, values, None)  # training: the batch's lag, the same here
    assert torch.allclose(out, torch.roll(values, -5, dims=1), atol=1e-6)


def test_fourier_modes_are_numpy_draws():
    from layers.FourierCorrelation import FourierBlock, get_frequency_modes
    assert get_frequency_modes(96, 4, "low") == [0, 1, 2, 3]
    assert len(get_frequency_modes(10, 64)) == 5
    np.random.seed(3)
    first = get_frequency_modes(96, 8)
    np.random.seed(3)
    assert FourierBlock(8, 8, 2, 96, 8).index == first == sorted(first)
    assert get_frequency_modes(96, 8) != first  # the generator moved on


def test_fourier_block_with_identity_weights_keeps_low_frequencies():
    from layers.FourierCorrelation import FourierBlock
    block = FourierBlock(8, 8, 2, 16, 8, "low")
    with torch.no_grad():
        block.weights1.copy_(torch.eye(4).view(1, 4, 4, 1).expand(2, 4, 4, 8))
        block.weights2.zero_()
    t = torch.arange(16.0)
    x = (torch.cos(2 * math.pi * 3 * t / 16) + 0.5).view(1, 16, 1, 1).expand(3, 16, 2, 4)
    out, _ = block(x, x, x, None)  # [B, H, E, L]
    assert torch.allclose(out, x.permute(0, 2, 3, 1), atol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 4, 6, 8])
def test_multiwavelet_filters_are_orthogonal(k):
    from layers.MultiWaveletCorrelation import get_filter
    h0, h1, g0, g1, phi0, phi1 = get_filter("legendre", k)
    w = np.block([[h0, h1], [g0, g1]])
    assert np.abs(w @ w.T - np.eye(2 * k)).max() < 1e-12
    assert np.array_equal(phi0, np.eye(k)) and np.array_equal(phi1, np.eye(k))
    if k == 1:  # Haar
        assert np.allclose([h0[0, 0], h1[0, 0], g0[0, 0], g1[0, 0]], np.array([1, 1, 1, -1]) / np.sqrt(2))
    with pytest.raises(ValueError, match="legendre"):
        get_filter("chebyshev", k)


def test_multiwavelet_step_reconstructs_exactly():
    from layers.MultiWaveletCorrelation import MWT_CZ1d
    layer = MWT_CZ1d(k=8, alpha=4, c=2)
    x = torch.randn(3, 16, 2, 8)
    d, s = layer.wavelet_transform(x)
    assert torch.allclose(layer.evenOdd(torch.cat([s, d], -1)), x, atol=1e-5)


def test_exponential_smoothing_is_the_recursion():
    from layers.ETSformer_EncDec import ExponentialSmoothing
    layer = ExponentialSmoothing(dim=3, nhead=2, dropout=0.0)
    values = torch.randn(2, 9, 2, 3)
    alpha = layer.weight.detach().view(1, 2, 1)  # [1, H, 1]
    state, expected = layer.v0.detach()[:, 0], []
    for t in range(9):
        state = alpha * state + (1 - alpha) * values[:, t]
        expected.append(state)
    assert torch.allclose(layer(values), torch.stack(expected, 1), atol=1e-5)


def test_ets_transform_draws_as_tslib_alone_and_per_window_when_keyed():
    from layers.ETSformer_EncDec import Transform
    x = torch.randn(4, 6, 3)
    torch.manual_seed(1)
    out = Transform(0.2).transform(x)
    torch.manual_seed(1)
    scale, shift, jitter = torch.randn(3), torch.randn(3), torch.randn(4, 6, 3)
    assert torch.allclose(out, x * (scale * 0.2 + 1) + shift * 0.2 + jitter * 0.2)
    with dropout.masks_follow_samples(11, 0, 4):
        whole = Transform(0.2).transform(x)
    with dropout.masks_follow_samples(11, 2, 2):
        part = Transform(0.2).transform(x[2:])
    assert torch.equal(whole[2:], part)  # window 2 and 3 augmented alike however the batch is cut


def test_timefilter_routing_keeps_experts_up_to_top_p():
    from layers.TimeFilter_layers import mask_moe
    router = mask_moe(n_vars=1, top_p=0.5, in_dim=3).eval()
    probabilities = torch.tensor([[0.6, 0.3, 0.1], [0.25, 0.4, 0.35], [0.1, 0.1, 0.8]])
    with torch.no_grad():
        router.gate.weight.copy_(torch.log(probabilities).T)  # x = e_i gives row i's logits
    gates, _ = router.noisy_top_k_gating(torch.eye(3).view(1, 3, 3), False)
    # cumulative probability past 0.5: the expert crossing it is kept, the ones after it dropped
    assert gates[0].tolist() == [[True, False, False], [False, True, True], [False, False, True]]


def test_pyramid_mask_and_reference_points():
    from layers.Pyraformer_EncDec import get_mask, refer_points
    mask, sizes = get_mask(4, [2], 3)
    assert sizes == [4, 2]
    allowed = ~mask
    assert allowed[0, :2].all() and not allowed[0, 2:4].any()  # neighbours on the fine scale
    assert allowed[4, 0:2].all() and allowed[0, 4] and not allowed[0, 5]  # node 4 is steps 0-1's parent
    assert refer_points(sizes, [2]).view(4, 2).tolist() == [[0, 4], [1, 4], [2, 5], [3, 5]]
    mask, sizes = get_mask(5, [2], 1)  # a coarse scale's last node takes the remainder: steps 2, 3 and 4
    assert sizes == [5, 2] and (~mask)[6, 2:5].all() and (~mask)[2:5, 6].all()
    assert refer_points(sizes, [2]).view(5, 2)[4].tolist() == [4, 6]


def test_segment_merging_repeats_the_last_segments():
    from layers.Crossformer_EncDec import SegMerging
    layer = SegMerging(d_model=2, win_size=2)
    assert layer(torch.randn(1, 3, 3, 2)).shape == (1, 3, 2, 2)


def test_mixprop_with_alpha_one_repeats_the_input():
    from layers.MSGBlock import mixprop
    layer = mixprop(c_in=2, c_out=3, gdep=2, dropout=0.1, alpha=1.0)
    x = torch.randn(2, 2, 4, 5)
    assert torch.allclose(layer(x, torch.rand(4, 4)), layer.mlp(torch.cat([x, x, x], dim=1)))
