"""Fast CPU tests for DLinear, TimerXL, TimesNet's block, TimeMixer's calendar pairing and their layers."""
import sys
import types

import pytest
import torch
from torch import nn

from layers.attention import RotaryEmbedding, timer_xl_blocked_mask
from layers.decomposition import SeriesDecomposition
from models import DLinear, TimerXL

B, L, C = 4, 96, 7


def make_configs(**overrides):
    base = dict(
        seq_len=L, label_len=48, pred_len=24, enc_in=C, dec_in=C, c_out=C, d_model=64, n_heads=4,
        e_layers=2, d_layers=1, d_ff=128, moving_avg=25, dropout=0.1, activation="gelu", use_norm=True,
        individual=False, input_token_len=24, output_token_len=24, covariate=False, features="M",
    )
    base.update(overrides)
    return types.SimpleNamespace(**base)


def make_inputs(configs, seed=0, batch=B, channels=C):
    g = torch.Generator().manual_seed(seed)
    x_enc = torch.randn(batch, configs.seq_len, channels, generator=g)
    x_mark_enc = torch.randn(batch, configs.seq_len, 4, generator=g)
    x_dec = torch.randn(batch, configs.label_len + configs.pred_len, channels, generator=g)
    x_mark_dec = torch.randn(batch, configs.label_len + configs.pred_len, 4, generator=g)
    return x_enc, x_mark_enc, x_dec, x_mark_dec


def build(module, configs, seed=0):
    torch.manual_seed(seed)
    return module.Model(configs)


# ---------------------------------------------------------------- decomposition

def reference_moving_average(x, kernel_size):
    """TSLib's moving_avg, written out: replicate-pad both ends, then AvgPool1d over time."""
    front = x[:, 0:1, :].repeat(1, (kernel_size - 1) // 2, 1)
    end = x[:, -1:, :].repeat(1, (kernel_size - 1) // 2, 1)
    padded = torch.cat([front, x, end], dim=1)
    return nn.AvgPool1d(kernel_size, stride=1, padding=0)(padded.permute(0, 2, 1)).permute(0, 2, 1)


@pytest.mark.parametrize("kernel_size,length", [(25, 96), (1, 96), (3, 10), (25, 12), (7, 336)])
def test_decomposition_matches_padded_avgpool(kernel_size, length):
    x = torch.randn(3, length, 5, dtype=torch.float32)
    seasonal, trend = SeriesDecomposition(kernel_size)(x)
    expected = reference_moving_average(x, kernel_size)
    torch.testing.assert_close(trend, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(seasonal, x - expected, atol=1e-6, rtol=1e-6)


def test_decomposition_rebuilds_for_new_length_and_is_not_persistent():
    decomposition = SeriesDecomposition(25, length=96)
    assert "averaging_matrix" not in decomposition.state_dict()
    x = torch.randn(2, 48, 3)
    _, trend = decomposition(x)
    torch.testing.assert_close(trend, reference_moving_average(x, 25), atol=1e-6, rtol=1e-6)


def test_decomposition_even_kernel_keeps_length():
    x = torch.randn(2, 30, 3)
    seasonal, trend = SeriesDecomposition(4)(x)
    assert seasonal.shape == trend.shape == x.shape
    # front pad 1, back pad 2: trend[0] = (x0 + x0 + x1 + x2) / 4
    torch.testing.assert_close(trend[:, 0], (2 * x[:, 0] + x[:, 1] + x[:, 2]) / 4)


# ---------------------------------------------------------------- DLinear

@pytest.mark.parametrize("individual", [False, True])
def test_dlinear_shape_and_init(individual):
    configs = make_configs(individual=individual)
    model = build(DLinear, configs)
    assert DLinear.Model.autoregressive is False
    out = model(*make_inputs(configs))
    assert out.shape == (B, configs.pred_len, C)
    for name, param in model.named_parameters():
        if name.endswith("weight"):
            torch.testing.assert_close(param, torch.full_like(param, 1 / configs.seq_len))


def test_dlinear_state_dict_keys():
    keys = set(build(DLinear, make_configs()).state_dict())
    assert keys == {"Linear_Seasonal.weight", "Linear_Seasonal.bias", "Linear_Trend.weight", "Linear_Trend.bias"}
    keys = set(build(DLinear, make_configs(individual=True)).state_dict())
    assert "Linear_Seasonal.6.weight" in keys and "Linear_Trend.0.bias" in keys and len(keys) == 4 * C


def test_dlinear_matches_explicit_formula():
    """Shared and individual heads agree with a direct TSLib-style computation."""
    configs = make_configs(individual=True)
    model = build(DLinear, configs)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    x = make_inputs(configs)[0]
    trend = reference_moving_average(x, configs.moving_avg)
    seasonal = x - trend
    expected = torch.stack(
        [model.Linear_Seasonal[c](seasonal[:, :, c]) + model.Linear_Trend[c](trend[:, :, c]) for c in range(C)], dim=-1
    )
    torch.testing.assert_close(model(x), expected, atol=1e-4, rtol=1e-5)


# ---------------------------------------------------------------- TimerXL

@pytest.mark.parametrize("output_token_len", [24, 48])
def test_timerxl_shape(output_token_len):
    configs = make_configs(output_token_len=output_token_len)
    model = build(TimerXL, configs)
    assert TimerXL.Model.autoregressive is True
    out = model(*make_inputs(configs))
    assert out.shape == (B, (L // configs.input_token_len) * output_token_len, C)


def test_timerxl_rejects_ragged_length():
    configs = make_configs()
    with pytest.raises(ValueError):
        build(TimerXL, configs)(torch.randn(2, 100, C), None, None, None)


@pytest.mark.parametrize(
    "module,overrides",
    [
        (DLinear, {}),
        (DLinear, {"individual": True}),
        (TimerXL, {}),
        (TimerXL, {"covariate": True, "output_token_len": 48, "activation": "relu"}),
        (TimerXL, {"use_norm": False}),
    ],
)
def test_every_parameter_gets_finite_gradient(module, overrides):
    configs = make_configs(**overrides)
    model = build(module, configs)
    model.train()
    out = model(*make_inputs(configs))
    out.square().mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(param.grad).all(), f"{name} has a non-finite gradient"
    # The variable bias must actually be learned, both "same" and "different" rows.
    if module is TimerXL:
        grad = model.blocks.layers[0].attention.variable_bias.emb.weight.grad
        assert (grad.abs().sum(dim=1) > 0).all()


@pytest.mark.parametrize("output_token_len", [24, 48])
def test_timerxl_is_causal(output_token_len):
    # use_norm=False: the instance statistics span the whole window and would leak later inputs.
    configs = make_configs(use_norm=False, output_token_len=output_token_len)
    model = build(TimerXL, configs).eval()
    P, N = configs.input_token_len, L // configs.input_token_len
    x = make_inputs(configs)[0]
    with torch.no_grad():
        base = model(x)
        for n in range(N - 1):
            changed = x.clone()
            changed[:, (n + 1) * P:, :] += torch.randn_like(changed[:, (n + 1) * P:, :]) * 3
            out = model(changed)
            rows = slice(0, (n + 1) * output_token_len)
            torch.testing.assert_close(out[:, rows], base[:, rows], atol=1e-5, rtol=1e-5)
            assert not torch.allclose(out[:, (n + 1) * output_token_len:], base[:, (n + 1) * output_token_len:])


def test_timerxl_variables_interact_without_covariate():
    configs = make_configs(use_norm=False)
    model = build(TimerXL, configs).eval()
    x = make_inputs(configs)[0]
    changed = x.clone()
    changed[:, :, -1] += 1.0
    with torch.no_grad():
        assert not torch.allclose(model(x)[..., 0], model(changed)[..., 0])


@pytest.mark.parametrize("use_norm", [False, True])
def test_timerxl_covariates_ignore_target(use_norm):
    configs = make_configs(covariate=True, use_norm=use_norm)
    model = build(TimerXL, configs).eval()
    x = make_inputs(configs)[0]
    changed = x.clone()
    changed[:, :, -1] = torch.randn_like(changed[:, :, -1]) * 5 + 2
    changed_covariate = x.clone()
    changed_covariate[:, :, 0] += 1.0
    with torch.no_grad():
        base, out = model(x), model(changed)
        torch.testing.assert_close(out[..., :-1], base[..., :-1], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out[..., -1], base[..., -1])
        # ...while the target does read the covariates.
        assert not torch.allclose(model(changed_covariate)[..., -1], base[..., -1])


def test_blocked_mask_structure():
    n_vars, n_tokens = 3, 4
    blocked = timer_xl_blocked_mask(n_vars, n_tokens)
    covariate_blocked = timer_xl_blocked_mask(n_vars, n_tokens, covariate=True)
    for i in range(n_vars * n_tokens):
        for j in range(n_vars * n_tokens):
            (ci, ni), (cj, nj) = divmod(i, n_tokens), divmod(j, n_tokens)
            assert blocked[i, j].item() == (nj > ni)
            allowed = nj <= ni and (ci == cj or ci == n_vars - 1)
            assert covariate_blocked[i, j].item() == (not allowed)


def test_rotary_scores_depend_on_relative_position_only():
    rotary = RotaryEmbedding(8)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        return (rotary(q, torch.tensor([m])) * rotary(k, torch.tensor([n]))).sum()

    torch.testing.assert_close(score(5, 2), score(13, 10), atol=1e-4, rtol=1e-5)
    assert not torch.allclose(score(5, 2), score(5, 3))
    # The features past rotary_dim are left untouched.
    torch.testing.assert_close(rotary(q, torch.tensor([7]))[..., 8:], q[..., 8:])


def test_timerxl_use_norm_scale_equivariance():
    configs = make_configs(use_norm=True)
    model = build(TimerXL, configs).eval()
    x = make_inputs(configs)[0]
    scale, shift = 3.5, -2.0
    with torch.no_grad():
        base = model(x)
        out = model(x * scale + shift)
    torch.testing.assert_close(out, base * scale + shift, atol=1e-3, rtol=1e-4)


# ---------------------------------------------------------------- shared behaviour

@pytest.mark.parametrize(
    "module,overrides", [(DLinear, {}), (DLinear, {"individual": True}), (TimerXL, {}), (TimerXL, {"covariate": True})]
)
def test_same_seed_same_output_and_state_dict_round_trip(module, overrides):
    configs = make_configs(**overrides)
    inputs = make_inputs(configs)
    first, second = build(module, configs, seed=7).eval(), build(module, configs, seed=7).eval()
    with torch.no_grad():
        reference = first(*inputs)
        torch.testing.assert_close(second(*inputs), reference, atol=0, rtol=0)

        # Perturb so the round trip is not trivially satisfied by identical initialisation.
        for p in first.parameters():
            p.add_(0.01 * torch.randn_like(p))
        perturbed = first(*inputs)
        fresh = build(module, configs, seed=123).eval()
        fresh.load_state_dict(first.state_dict(), strict=True)
        torch.testing.assert_close(fresh(*inputs), perturbed, atol=0, rtol=0)



# ---------------------------------------------------------------- TimesNet

def reference_times_block(block, x, padding="zeros"):
    """TSLib's TimesBlock.forward written plainly: each of the top_k periods on its own (repeated
    periods included), each inception block as the mean of its separate convolutions; the last
    grid row completed with zeros (TSLib's code since 2023-02-22) or with the series' last steps (its 2023-02-18 code)."""
    def inception(module, grid):
        return torch.stack([conv(grid) for conv in module.kernels], dim=-1).mean(-1)

    batch, length, channels = x.shape
    spectrum = torch.fft.rfft(x, dim=1).abs()
    frequencies = spectrum.mean(0).mean(-1)
    frequencies[0] = 0
    _, top = torch.topk(frequencies, block.top_k)
    weights = torch.softmax(spectrum.mean(-1)[:, top], dim=1)
    results = []
    for period in (length // top).tolist():
        rows = -(-length // period)
        missing = rows * period - length
        fill = x[:, length - missing:] if padding == "tail" else x.new_zeros(batch, missing, channels)
        padded = torch.cat([x, fill], dim=1)
        grid = padded.reshape(batch, rows, period, channels).permute(0, 3, 1, 2)
        grid = inception(block.conv[2], nn.functional.gelu(inception(block.conv[0], grid)))
        results.append(grid.permute(0, 2, 3, 1).reshape(batch, -1, channels)[:, :length])
    return (torch.stack(results, dim=-1) * weights[:, None, None]).sum(-1) + x, (length // top).tolist()


@pytest.mark.parametrize("padding", ["zeros", "tail"])
def test_times_block_equals_tslib_written_plainly(padding):
    """Our TimesBlock merges each inception block's kernels into one convolution, builds them once
    for every period, crops kernels wider than a grid and runs a repeated period once: the output
    and every gradient are TSLib's, with either way of completing the last grid row."""
    from models.TimesNet import TimesBlock

    torch.manual_seed(1)  # a seed whose periods are [6, 41, 3, 3, 2]
    block = TimesBlock(d_model=6, d_ff=8, top_k=5, num_kernels=4, padding=padding)
    x = torch.randn(3, 41, 6, requires_grad=True)
    ours = block(x)
    ours_grads = torch.autograd.grad(ours.square().sum(), [x, *block.parameters()])
    reference, periods = reference_times_block(block, x, padding)
    reference_grads = torch.autograd.grad(reference.square().sum(), [x, *block.parameters()])
    # the paths this test is for: a period repeated, and a grid narrower than the widest kernel (7)
    assert len(set(periods)) < len(periods) and min(periods) < 7, periods
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(ours_grads, reference_grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)


def test_times_block_in_evaluation_scores_each_window_as_if_alone():
    """In evaluation a TimesBlock takes each window's own top_k periods (eval_periods "window"): a batch
    gives, row by row, what each window gives alone, though the windows' periods differ; with "batch"
    it takes the batch's, as in training (TSLib's code at any batch size)."""
    from models.TimesNet import TimesBlock

    torch.manual_seed(0)
    block = TimesBlock(d_model=6, d_ff=8, top_k=3, num_kernels=3)
    steps = torch.arange(48.0)[None, :, None]
    cycles = torch.tensor([4.0, 6.0, 12.0, 16.0, 24.0, 8.0])[:, None, None]  # a dominant period per window
    x = torch.sin(2 * torch.pi * steps / cycles) + 0.3 * torch.randn(6, 48, 6)
    block.eval()
    periods = block.dominant_periods(x)[0]
    assert len({tuple(sorted(p)) for p in periods}) > 1, periods  # the windows disagree
    with torch.no_grad():
        together = block(x)
        alone = torch.cat([block(x[i:i + 1]) for i in range(len(x))])
        torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)
        block.eval_periods = "batch"
        batch_chooses = block(x)
        block.train()
        assert torch.equal(batch_chooses, block(x))
    assert not torch.allclose(batch_chooses, alone, atol=1e-3)


@pytest.mark.parametrize("pairing", ["window", "tiled"])
def test_timemixer_mark_pairing(pairing):
    """Channel-independent TimeMixer embeds series b*C + c with window b's calendar (window), or, as the
    official code's x_mark.repeat(C, 1, 1) does, with window (b*C + c) mod B's (tiled), at every scale."""
    from models import TimeMixer

    configs = make_configs(d_model=8, d_ff=16, down_sampling_layers=2, down_sampling_window=2,
                           down_sampling_method="avg", channel_independence=1, mark_dim=4,
                           mark_pairing=pairing)
    model = build(TimeMixer, configs).eval()
    x_enc, x_mark_enc, _, _ = make_inputs(configs)
    seen = []
    model.enc_embedding.register_forward_pre_hook(lambda module, args: seen.append(args[1]))
    model(x_enc, x_mark_enc)
    assert len(seen) == 3
    rows = torch.arange(B * C)
    windows = rows // C if pairing == "window" else rows % B
    for scale, marks in enumerate(seen):
        step = 2 ** scale
        expected = x_mark_enc[windows][:, ::step][:, :L // step]
        torch.testing.assert_close(marks, expected, rtol=0, atol=0)


def test_timemixer_rejects_unknown_mark_pairing():
    from models import TimeMixer

    with pytest.raises(ValueError, match="mark_pairing must be window or tiled"):
        build(TimeMixer, make_configs(down_sampling_layers=1, down_sampling_window=2,
                                      down_sampling_method="avg", mark_pairing="shuffled"))


# ---------------------------------------------------------------- cache-blocked MLPs (CPU kernels)

def _blocked_case():
    """(the blocked kernel's output, the plain ops' output, their inputs) as functions of fresh inputs,
    wide enough for several blocks and a ragged last one, in float64 so that only the summation order
    differs."""
    from models.TiDE import CHUNK_ROWS, WideHiddenMLP

    g = torch.Generator().manual_seed(0)
    x, w1, b1, w2 = (torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
                     for shape in ((2 * CHUNK_ROWS + 19, 6), (48, 6), (48,), (2, 48)))
    return (lambda: WideHiddenMLP.apply(x, w1, b1, w2), lambda: torch.relu(x @ w1.t() + b1) @ w2.t(), [x, w1, b1, w2])


def test_cache_blocked_mlp_computes_the_plain_ops_over_several_blocks():
    """TiDE's CPU kernel that keeps its wide hidden layer in cache-sized blocks (and recomputes it in
    backward) gives the plain ops' output and gradients, across block boundaries and a ragged last block."""
    name = "TiDE"
    blocked, plain, inputs = _blocked_case()
    out = blocked()
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad(out, inputs, grad)
    want_out = plain()
    want = torch.autograd.grad(want_out, inputs, grad)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name} forward: {m}")
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m, i=i: f"{name} gradient {i}: {m}")


def test_tide_runs_its_feature_encoder_once_per_distinct_calendar_row(monkeypatch):
    """Windows cut from one calendar share most of their time-feature rows; TiDE's feature encoder runs its
    per-row part on the distinct rows only and gathers it back: the same forecasts and gradients as
    running it on every row (float64, training with sample-keyed dropout masks)."""
    import models.TiDE as tide
    from layers.dropout import masks_follow_samples

    configs = make_configs(mark_dim=4)
    horizon = configs.pred_len
    model = build(tide, configs).double().train()
    x_enc, _, x_dec, _ = (t.double() for t in make_inputs(configs))
    g = torch.Generator().manual_seed(3)
    calendar = torch.randn(L + horizon + 40, 4, generator=g, dtype=torch.float64)
    windows = torch.stack([calendar[s:s + L + horizon] for s in torch.randint(0, 40, (B,), generator=g).tolist()])
    marks = (windows[:, :L], windows[:, L - configs.label_len:])
    found = []
    distinct_rows = tide.distinct_rows
    monkeypatch.setattr(tide, "distinct_rows", lambda x: found.append(distinct_rows(x)) or found[-1])

    def train_step():
        model.zero_grad()
        with masks_follow_samples(7, 0, B):
            out = model(x_enc, marks[0], x_dec, marks[1])
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    out, grads = train_step()
    rows, inverse = found[-1]
    assert len(rows) <= L + horizon + 40 < len(inverse) == B * (L + horizon)
    monkeypatch.setattr(tide, "distinct_rows", lambda x: None)  # every row through the encoder
    want_out, want_grads = train_step()
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_distinct_rows_are_exact_or_none(monkeypatch):
    import models.TiDE as tide

    x = torch.randn(30, 4)[torch.randint(0, 30, (500,), generator=torch.Generator().manual_seed(0))]
    rows, inverse = tide.distinct_rows(x)
    assert len(rows) <= 30 and torch.equal(rows[inverse], x)
    assert tide.distinct_rows(torch.randn(100, 4)) is None  # no repeats: nothing to gain
    with_nan = x.clone()
    with_nan[3, 1] = float("nan")
    assert tide.distinct_rows(with_nan) is None
    colliding = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 6.0, 9.0]]).repeat(10, 1)
    assert len(tide.distinct_rows(colliding)[0]) == 2
    monkeypatch.setattr(tide, "_ROW_HASH", 0)  # the hash then sees the last column only: the two rows collide
    assert tide.distinct_rows(colliding) is None


@pytest.mark.parametrize("name", ["TSMixer", "iTransformer", "TiDE"])
def test_a_training_forwards_masks_come_from_one_draw_per_sample(name):
    """TSMixer's four masks (two blocks x time and channel mixing), iTransformer's nine (the embedding's,
    then four a layer) and TiDE's (one a block) come from one draw per sample: on the CPU each keyed draw
    costs a reseed per sample, which made TSMixer's step slower than TSLib's. The masks still follow the
    samples: a sample's output is the same whatever its batch-mates."""
    import importlib

    from layers import dropout as layers_dropout

    torch.manual_seed(0)
    configs = make_configs(e_layers=2, dropout=0.5)
    model = importlib.import_module(f"models.{name}").Model(configs).train()
    x = make_inputs(configs)[0]
    with layers_dropout.masks_follow_samples(3, 10, len(x)):
        together = model(x)
        assert layers_dropout._keys.calls == 1
    with layers_dropout.masks_follow_samples(3, 11, 1):  # sample 1 alone, at its global position 11
        alone = model(x[1:2])
    torch.testing.assert_close(alone[0], together[1])


@pytest.mark.parametrize("imports, message", [
    ("from layers.Not_In_TSLib import series_decomp",
     "models/Borrowed.py imports layers.Not_In_TSLib, a module this codebase does not have; add "
     "layers/Not_In_TSLib.py or change the import"),
    ("from mamba_ssm import Mamba",
     "models/Borrowed.py imports mamba_ssm, which is not installed: pip install mamba-ssm"),
    ("from reformer_pytorch import LSHSelfAttention",
     "models/Borrowed.py imports reformer_pytorch, which is not installed: pip install reformer-pytorch"),
    ("import no_such_package_here.ops",  # a package the table does not know: its import name
     "models/Borrowed.py imports no_such_package_here, which is not installed: pip install no_such_package_here"),
    ("from borrowed_layer import Decomposition",  # TSLib's WPMixer: pywt through layers/tslib/DWT_Decomposition.py
     "models/Borrowed.py imports pywt (through models/borrowed_layer.py), which is not installed: "
     "pip install PyWavelets"),
])
def test_a_model_file_importing_what_is_not_here_is_named_in_one_line(tmp_path, monkeypatch, imports, message):
    """A TSLib model file dropped in unchanged that imports a layer we lack or a package not installed (TSLib's
    Mamba imports mamba_ssm) ends in one line naming the module and the pip command, not an import traceback."""
    import models
    from utils.errors import UserError

    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "Borrowed.py").write_text(f"{imports}\n\n\nclass Model(object):\n    pass\n")
    (folder / "borrowed_layer.py").write_text("import pywt\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setitem(models.PIP_NAMES, "pywt", "PyWavelets")  # the table's entry, whatever the table becomes
    monkeypatch.setitem(sys.modules, "pywt", None)  # not installed, even where it is
    monkeypatch.setattr(models, "_HERE", folder)
    monkeypatch.setattr(models, "__path__", [str(folder), *models.__path__])
    with pytest.raises(UserError) as refused:
        models.get_model_class("Borrowed")
    assert str(refused.value) == message


def test_a_layer_importing_its_package_when_built_is_refused_in_one_line(tmp_path, monkeypatch):
    """A layer module that imports its package only when a layer is built (so that importing the module works
    for everyone, as TSLib's ReformerLayer needs reformer_pytorch) ends the run in the same one line when the
    model is built, naming that layer's file and the pip command."""
    import models
    from helpers import make_args, make_experiment
    from utils.errors import UserError

    folder = tmp_path / "models"
    folder.mkdir()
    (tmp_path / "lazy_layer.py").write_text("class Lazy:\n    def __init__(self):\n"
                                            "        from reformer_pytorch import LSHSelfAttention\n")
    (folder / "Lazy.py").write_text("from torch import nn\n\nfrom lazy_layer import Lazy\n\n\n"
                                    "class Model(nn.Module):\n    def __init__(self, configs):\n"
                                    "        super().__init__()\n        Lazy()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "reformer_pytorch", None)  # not installed, even where it is
    monkeypatch.setattr(models, "_HERE", folder)
    monkeypatch.setattr(models, "__path__", [str(folder), *models.__path__])
    with pytest.raises(UserError) as refused:
        make_experiment(make_args("--model", "Lazy", "--num_threads", 1))
    assert str(refused.value) == ("models/Lazy.py imports reformer_pytorch (through lazy_layer.py), which is not "
                                  "installed: pip install reformer-pytorch")


def test_pip_names_of_the_packages_tslibs_files_import():
    """TSLib's model files and layers import packages whose pip names differ from their import names."""
    from models import pip_command

    assert pip_command("mamba_ssm.ops.selective_scan_interface") == "pip install mamba-ssm"
    assert pip_command("reformer_pytorch") == "pip install reformer-pytorch"
    assert pip_command("pywt") == "pip install PyWavelets"
    assert pip_command("einops") == "pip install einops"
