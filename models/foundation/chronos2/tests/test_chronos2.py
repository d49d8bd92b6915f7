"""Chronos-2 against chronos-forecasting: a folder the package wrote (tests/writer.py: its
Chronos2Model at a reduced size, random weights, save_pretrained) forecasts what Chronos2Pipeline.predict_quantiles
forecasts on the same windows, and an export of ours is what the package reads and forecasts from alike. What
every release shares (zero-shot and fine-tuning on several processes, the export's layout, the bad inputs) is
tests/test_foundation.py's contract."""
import argparse
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

chronos = pytest.importorskip("chronos.chronos2", reason="the chronos extra (chronos-forecasting) is not installed")

from models.foundation.chronos2.Chronos2 import UNROLLED_QUANTILES, Model  # noqa: E402
from models.foundation.chronos2 import adapter as chronos2  # noqa: E402
from exp.export import load_weights  # noqa: E402
from test_foundation import checkpoints  # noqa: E402
from models.foundation.chronos2.tests.writer import write as write_chronos2  # noqa: E402

LEVELS = list(chronos2.RELEASED_QUANTILES)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_chronos2(tmp_path_factory.mktemp("chronos-2") / "chronos-2")


def ours(path, pred_len, seq_len=64, is_training=0, dropout=0.1):
    model = Model(argparse.Namespace(pretrain_model_path=str(path), seq_len=seq_len, pred_len=pred_len, dropout=dropout,
                                     is_training=is_training))
    return load_weights(model, str(path)).eval()


def windows(seed=1, batch=6, length=64, channels=3):
    generator = torch.Generator().manual_seed(seed)
    steps = torch.arange(length, dtype=torch.float32)
    level = 5 * torch.randn(batch, 1, channels, generator=generator)
    return level + torch.sin(steps / 4)[None, :, None] + torch.randn(batch, length, channels, generator=generator)


def packages_quantiles(path, x, pred_len, batch_size=256):
    """Chronos2Pipeline.predict_quantiles on every channel of `x` [B, L, C] as a univariate series: [B, T, C, Q]."""
    pipeline = chronos.Chronos2Pipeline.from_pretrained(str(path))
    batch, length, channels = x.shape
    quantiles, _ = pipeline.predict_quantiles(x.transpose(1, 2).reshape(batch * channels, 1, length),
                                              prediction_length=pred_len, quantile_levels=LEVELS, batch_size=batch_size)
    return torch.stack(quantiles).reshape(batch, channels, pred_len, len(LEVELS)).permute(0, 2, 1, 3)


def zero_shot_quantiles(release, windows, pred_len, monkeypatch):
    """The package's own forecast of every channel of raw `windows` [B, L, C]: [B, pred_len, C, levels], for the
    checks of tests/ that hold a packaged release's zero-shot runs to its package (test_zero_shot, test_gift_eval)."""
    return packages_quantiles(release, windows, pred_len)


def relative(a, b):
    return float(((a - b).abs() / b.abs().clamp_min(1e-6)).max())


@pytest.mark.parametrize("pred_len", [24, 40], ids=["one-pass", "rolled-out"])
def test_forecasts_are_the_packages_predict_quantiles(release, pred_len):
    """One pass up to max_output_patches (2 patches here), the package's long-horizon rollout beyond."""
    x = windows()
    with torch.no_grad():
        forecast = ours(release, pred_len)(x)
    assert forecast.shape == (6, pred_len, 3, len(LEVELS))
    assert relative(forecast, packages_quantiles(release, x, pred_len)) <= 1e-5
    assert forecast.std() > 0.1  # the weights show: not a flat forecast that any model would match


def test_each_channel_is_its_own_series(release):
    """A channel's forecast does not depend on the other channels of its window, nor on the other windows."""
    x, model = windows(), ours(release, 24)
    with torch.no_grad():
        whole = model(x)
        alone = model(x[2:3, :, 1:2])
    assert torch.allclose(alone[0, :, 0], whole[2, :, 1], rtol=1e-5, atol=1e-6)


class Allocations(TorchDispatchMode):
    """The ops run and the bytes of the largest storage any op's output holds."""

    def __init__(self):
        super().__init__()
        self.largest, self.ops = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, [t.dtype for t in torch.utils._pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def with_gaps(x):
    """x with whole patches missing (a group attention row the package masks through) and partial ones."""
    x = x.clone()
    x[1, 8:40, 2] = float("nan")
    x[3, :20, 0] = float("nan")
    return x


@pytest.mark.parametrize("case", ["one-pass", "rolled-out", "training", "training without dropout"])
def test_memory_is_linear_in_windows_times_channels(release, case):
    """N = windows x channels series: four times the windows, four times the largest tensor a forward (and
    backward) allocates. The package's group mask over all of them ([time, 1, N, N], in training the weights
    [time, heads, N, N]) grew sixteen-fold."""
    pred_len = 40 if case == "rolled-out" else 24
    training = case.startswith("training")
    model = ours(release, pred_len, is_training=int(training), dropout=0.0 if case.endswith("dropout") else 0.1)
    largest = []
    for batch in (16, 64):
        x = windows(batch=batch, channels=4)
        with Allocations() as allocations:
            if training:
                model.train()
                model(x).square().mean().backward()
            else:
                with torch.no_grad():
                    model.eval()(x)
        largest.append(allocations.largest)
    assert largest[1] <= 4 * largest[0], largest


def test_the_group_attention_in_closed_form_is_the_packages_bit_for_bit(release):
    """Each series alone in its group: ours (closed form, memory linear) forecasts what the package's model forecasts
    with its group mask over the whole batch, bit for bit, whole patches missing included."""
    x = with_gaps(windows())
    package = chronos.Chronos2Model.from_pretrained(str(release)).eval()
    with torch.no_grad():
        want = package(context=x.transpose(1, 2).reshape(-1, 64), num_output_patches=2).quantile_preds[..., :24]
        assert torch.equal(ours(release, 24)(x), want.reshape(6, 3, len(LEVELS), 24).permute(0, 3, 1, 2))


def dense_group_attention(self, query, key, value, mask):
    """The group attention over the package's [time, 1, N, N] mask, its weights dropped by one keyed draw per
    (series, head, step): what the closed form replaces."""
    weights = torch.softmax((query @ key.transpose(-2, -1) + mask).float(), dim=-1).type_as(query)
    if self.training and self.weights_dropout.p:
        steps, heads, series = query.shape[:3]
        weights = weights * self.weights_dropout(weights.new_ones(series, heads, steps, 1)).permute(2, 1, 0, 3)
    return weights @ value, None


@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_fine_tuning_gradients_are_the_dense_group_attentions(release, dropout):
    """A training step's forecasts and gradients with the group attention in closed form equal the dense one's over
    the package's mask: bit for bit with dropout; without, the package's own fused attention (SDPA) leaves a
    rounding residue on the group attention's q and k gradients, exactly 0 here (2e-10 of the largest gradient)."""
    import types

    x = with_gaps(windows())
    results = []
    for dense in (False, True):
        model = ours(release, 24, is_training=1, dropout=dropout).train()
        if dense:
            del model.chronos.encoder._construct_and_invert_group_time_mask  # the package's mask again
            for module in model.chronos.modules():
                if isinstance(module, chronos.layers.GroupSelfAttention):
                    attention = module.self_attention
                    if dropout:
                        attention._sdpa_attention = types.MethodType(dense_group_attention, attention)
                    else:
                        del attention._sdpa_attention, attention._eager_attention  # the package's own
        torch.manual_seed(5)
        forecast = model(x)
        forecast.square().mean().backward()
        results.append((forecast, {k: p.grad for k, p in model.named_parameters()}))
    (ours_forecast, ours_grads), (dense_forecast, dense_grads) = results
    assert torch.equal(ours_forecast, dense_forecast)
    assert all(v is not None for v in ours_grads.values()) and ours_grads.keys() == dense_grads.keys()
    scale = max(float(grad.abs().max()) for grad in dense_grads.values())
    for name, grad in ours_grads.items():
        if dropout:
            assert torch.equal(grad, dense_grads[name]), name
        else:
            assert float((grad - dense_grads[name]).abs().max()) <= 1e-7 * scale, name


def packages_rollout(release, x, pred_len):
    """Chronos2Pipeline's long-horizon rollout (_predict_batch, the package's model) on every channel of x."""
    pipeline = chronos.Chronos2Pipeline.from_pretrained(str(release))
    batch, length, channels = x.shape
    series, count = x.transpose(1, 2).reshape(-1, length), batch * channels
    out = pipeline._predict_batch(context=series, group_ids=torch.arange(count),
                                  future_covariates=torch.full((count, pred_len), torch.nan),
                                  unrolled_quantiles_tensor=torch.tensor(UNROLLED_QUANTILES),
                                  prediction_length=pred_len, max_output_patches=2, target_idx_ranges=[(0, count)])[0]
    return out.reshape(batch, channels, len(LEVELS), pred_len).permute(0, 3, 1, 2)


@pytest.mark.parametrize("pred_len", [40, 100])
def test_the_long_horizon_rollout_is_the_packages_bit_for_bit(release, pred_len):
    """Past one pass (2 patches here): the rollout on the input's device, integer cumulative masses, is the package's
    on CPU bit for bit; tied samples (rounded, constant and periodic windows) included."""
    x = windows(batch=4)
    x[1] = x[1].round()
    x[2] = 1.0
    x[3, :, 0] = torch.arange(64.0) % 4
    model = ours(release, pred_len)
    with torch.no_grad():
        assert torch.equal(model(x), packages_rollout(release, x, pred_len))


def test_the_long_horizon_rollout_runs_deterministic_kernels_only(release):
    """No float cumsum (no deterministic CUDA kernel: --deterministic would raise) and no op reading back to the
    host: the cumulative masses are integer prefix sums."""
    model = ours(release, 100)
    with Allocations() as allocations, torch.no_grad():
        model(windows())
    cumsums = [dtypes for func, dtypes in allocations.ops if func.overloadpacket is torch.ops.aten.cumsum]
    assert cumsums and all(not dtype.is_floating_point for dtypes in cumsums for dtype in dtypes), cumsums


def test_the_long_horizon_rollout_makes_no_host_sync(release):
    """On the meta device under utils.host_syncs' recorder: no host read and no host-to-device copy per batch."""
    from utils.host_syncs import record_host_syncs, summary, to_meta

    model, x = to_meta(ours(release, 100)), to_meta(windows())
    with record_host_syncs() as recorder, torch.no_grad():
        model(x)
    assert recorder.syncs == [], summary(recorder)


def test_an_export_is_read_by_the_package_and_forecasts_as_ours(tmp_path, release):
    """Changed weights exported to the released layout (export --to chronos2): the
    package's pipeline forecasts from them what ours does, and ours reads them back alike."""
    model = ours(release, 24, seq_len=32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    torch.save(model.state_dict(), tmp_path / "checkpoint.pth")
    exported = tmp_path / "exported"
    checkpoints().export(str(tmp_path / "checkpoint.pth"), str(exported), "chronos2")
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["Chronos2Model"] and config["d_model"] == 32 and config["num_heads"] == 4
    x = windows(length=32)
    with torch.no_grad():
        assert relative(model(x), packages_quantiles(exported, x, 24)) <= 1e-5
        assert relative(ours(exported, 24, seq_len=32)(x), packages_quantiles(exported, x, 24)) <= 1e-5


def read_release(folder):
    from utils.adapters import read_safetensors

    return read_safetensors(str(folder / "model.safetensors")), json.loads((folder / "config.json").read_text())


def test_a_training_horizon_past_one_pass_is_kept_as_fit_keeps_it(release, tmp_path):
    """Chronos2Pipeline.fit raises max_output_patches to the horizon it trained; so does a training run here, and
    export writes it: the package then forecasts those 3 patches in one pass, as ours does."""
    model = ours(release, 40, is_training=1)
    assert model.one_pass == 3 and int(model.max_output_patches[0]) == 3
    out = chronos2.CHRONOS2.from_ours(model.state_dict())
    chronos2.CHRONOS2.write(out, tmp_path / "fit")
    assert json.loads((tmp_path / "fit" / "config.json").read_text())["chronos_config"]["max_output_patches"] == 3
    x = windows()
    with torch.no_grad():
        assert relative(model(x), packages_quantiles(tmp_path / "fit", x, 40)) <= 1e-5
    assert ours(release, 40).one_pass == 2  # zero-shot keeps the release's


def test_the_released_layout_round_trips_key_for_key(release):
    state, config = read_release(release)
    converted = chronos2.CHRONOS2.to_ours(state, config)
    weights, written = chronos2.CHRONOS2.from_ours(converted)
    assert set(weights) == set(state) and all(torch.equal(weights[k], state[k]) for k in state)
    assert written["chronos_config"] == config["chronos_config"]
    assert {k: written[k] for k in chronos2.CORE_FIELDS if k in config} == {k: config[k] for k in chronos2.CORE_FIELDS
                                                                             if k in config}


def test_a_missing_package_is_one_line(monkeypatch):
    import importlib
    import sys

    from utils.errors import UserError

    monkeypatch.setitem(sys.modules, "chronos.chronos2", None)
    monkeypatch.delitem(sys.modules, "models.foundation.chronos2.Chronos2")
    with pytest.raises(UserError, match=r"model Chronos2 needs the chronos-forecasting package .*pip install -e "
                                        r"'\.\[chronos\]'"):
        importlib.import_module("models.foundation.chronos2.Chronos2")
