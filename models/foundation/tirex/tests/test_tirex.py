"""TiRex against the tirex-ts package: a release folder written with the package's own TiRexZero at a reduced size
(tests/writer.py: random weights, saved as NX-AI/TiRex ships it, model.ckpt) forecasts what the
package's load_model(...).forecast(...) does on the same windows, and an export of ours is what the package loads and
forecasts from alike. What every release shares (zero-shot and fine-tuning on several processes, the export's
layout, the bad inputs) is tests/test_foundation.py's contract."""
import os
from argparse import Namespace

import pytest
import torch

tirex = pytest.importorskip("tirex", reason="the tirex-ts package is not installed")

from exp.export import export, load_weights  # noqa: E402
from models.foundation.tirex import TiRex  # noqa: E402
from models.foundation.tirex.tests.writer import write as write_tirex  # noqa: E402
from utils.errors import UserError  # noqa: E402


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    return write_tirex(tmp_path_factory.mktemp("tirex") / "NX-AI" / "TiRex")


def configs(folder, seq_len, pred_len, **sizes):
    return Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=None if folder is None else str(folder),
                     **{"d_model": 16, "n_heads": 2, "e_layers": 1, "d_ff": 32, **sizes})


def ours(folder, seq_len, pred_len):
    return load_weights(TiRex.Model(configs(folder, seq_len, pred_len)), str(folder)).eval()


def packages_forecast(folder, windows, pred_len, monkeypatch):
    """tirex.load_model(...).forecast(...) on every channel of `windows` [B, L, C]: [B, pred_len, C, 9]. The
    package reads a local file whose path's second component is the model's name: NX-AI/TiRex/model.ckpt."""
    monkeypatch.chdir(folder.parent.parent)
    reference = tirex.load_model(os.path.join(folder.parent.name, folder.name, "model.ckpt"), device="cpu",
                                 backend="torch")
    batch, seq_len, channels = windows.shape
    series = windows.permute(0, 2, 1).reshape(batch * channels, seq_len)
    quantiles, _ = reference.forecast(context=series, prediction_length=pred_len, batch_size=5)
    return quantiles.reshape(batch, channels, pred_len, -1).transpose(1, 2)


def zero_shot_quantiles(release, windows, pred_len, monkeypatch):
    """The package's own forecast of every channel of raw `windows` [B, L, C]: [B, pred_len, C, levels], for the
    checks of tests/ that hold a packaged release's zero-shot runs to its package (test_zero_shot, test_gift_eval)."""
    return packages_forecast(release, windows, pred_len, monkeypatch)


def windows_to_forecast(seq_len, channels=3):
    generator = torch.Generator().manual_seed(1)
    walk = torch.randn(4, seq_len, channels, generator=generator).cumsum(1) * 2 + 5
    walk[2, :, 0] = 3.0  # constant: std 0, the package's scaler takes |mean| + eps
    return walk


@pytest.mark.parametrize("seq_len, pred_len", [(40, 24), (96, 100), (512, 100)],
                         ids=["padded-one-patch", "padded-rolled-out", "full-rolled-out"])
def test_forecasts_equal_the_packages_load_model_forecast(released, seq_len, pred_len, monkeypatch):
    """40 steps are NaN-padded to the 512 of train_ctx_len (14 patches of padding alone, which ours runs once for
    all series); 100 steps take 4 patches, the last three rolled out as NaN patches, which with 512 steps of
    context push the oldest out (the package's batches of 5 series are not ours of 12: the same rows)."""
    windows = windows_to_forecast(seq_len)
    with torch.no_grad():
        got = ours(released, seq_len, pred_len)(windows)
    want = packages_forecast(released, windows, pred_len, monkeypatch)
    assert got.shape == want.shape == (4, pred_len, 3, 9)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_a_block_with_its_state_is_the_packages_block(released):
    """TiRex._block (the package's sLSTMBlock with the sLSTM state in and out) is block(x), and a sequence
    cut in two, the second half started from the first's state, is the whole (the shared padding's premise)."""
    model = ours(released, 96, 24)
    block = model.tirex.blocks[1]
    x = torch.randn(3, 10, 24, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole, _ = TiRex._block(block, x, None)
        head, state = TiRex._block(block, x[:, :6], None)
        tail, _ = TiRex._block(block, x[:, 6:], state)
        assert torch.equal(whole, block(x))
    assert torch.equal(torch.cat([head, tail], dim=1), whole)


def test_the_padding_prefix_runs_once_in_evaluation_and_forecasts_alike(released):
    """The sLSTM states after k patches of NaN padding are kept per k in evaluation: a second batch (its roll-out
    steps' k included) runs no block on the padding and far fewer ops, and forecasts bit for bit what the uncached
    path does (a gradient wanted: nothing kept); a weight changed in place is seen (a fresh model agrees)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Ops.count += 1
            return func(*args, **(kwargs or {}))

    model = ours(released, 96, 100)  # 512 - 96 steps of padding: 13, 12, 11, 10 patches over 4 roll-out steps
    windows, other = windows_to_forecast(96), windows_to_forecast(96) * 0.5 + 1
    uncached = model(windows).detach()  # grad enabled: the prefix runs every step, as before
    counts = []
    with torch.no_grad():
        for batch in (windows, other, windows):
            Ops.count = 0
            with Ops():
                got = model(batch)
            counts.append(Ops.count)
    assert sorted(model._prefix_cache) == [10, 11, 12, 13]
    assert torch.equal(got, uncached)
    assert counts[1] == counts[2] < 0.5 * counts[0], counts
    with torch.no_grad():
        model.tirex.blocks[0].slstm_layer.slstm_cell._recurrent_kernel_.mul_(1.05)
        changed = model(windows)
        fresh = TiRex.Model(configs(released, 96, 100)).eval()
        fresh.load_state_dict(model.state_dict())
        assert not torch.equal(changed, got)
        assert torch.equal(changed, fresh(windows))
        model.train()  # training's float32 recurrence: its own states, not evaluation's kept ones
        trained = model(windows)
    assert torch.equal(trained, model(windows).detach())


def test_an_eval_forecast_runs_on_the_meta_device():
    """Shapes only (the device the host-sync recorder runs on, which has no autocast state): the kept padding
    states are keyed without asking it."""
    with torch.device("meta"):
        model = TiRex.Model(configs(None, 96, 40)).eval()
    with torch.no_grad():
        assert model(torch.zeros(2, 96, 3, device="meta")).shape == (2, 40, 3, 9)


def test_the_recurrence_off_cuda_is_the_packages(released):
    """GraphedRecurrence, the cells' recurrence, is the package's slstm_forward itself on a CPU (no graph kept)."""
    from tirex.models.slstm.cell import sLSTMCellTorch

    generator = torch.Generator().manual_seed(3)
    x, states = torch.randn(7, 3, 4 * 24, generator=generator), torch.randn(4, 3, 24, generator=generator)
    kernel, bias = torch.randn(2, 12, 48, generator=generator) * 0.2, torch.randn(96, generator=generator) * 0.1
    graphed = TiRex.GraphedRecurrence()
    with torch.no_grad():
        got, want = graphed(x, states, kernel, bias), sLSTMCellTorch.slstm_forward(x, states, kernel, bias)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and not graphed.graphs
    model = ours(released, 96, 24)
    assert {type(b.slstm_layer.slstm_cell._impl_forward_torch) for b in model.tirex.blocks} == {TiRex.GraphedRecurrence}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_on_cuda_the_graphed_recurrence_forecasts_as_the_eager_one(released):
    """On a GPU: the eval forecast through the captured graphs (twice: captured, then replayed with other
    windows' inputs) is the eager recurrence's bit for bit."""
    from tirex.models.slstm.cell import sLSTMCellTorch

    model = ours(released, 96, 100).cuda()
    eager = ours(released, 96, 100).cuda()
    for block in eager.tirex.blocks:
        block.slstm_layer.slstm_cell._impl_forward_torch = sLSTMCellTorch.slstm_forward
    with torch.no_grad():
        for windows in (windows_to_forecast(96), windows_to_forecast(96) * 0.5 + 1):
            assert torch.equal(model(windows.cuda()), eager(windows.cuda()))
    assert model.tirex.blocks[0].slstm_layer.slstm_cell._impl_forward_torch.graphs


def test_the_reference_check_sees_a_changed_weight(released, tmp_path, monkeypatch):
    """The agreement is not vacuous: one recurrent kernel changed in the package's copy changes its forecast."""
    def edit(state):
        key = "block_stack.blocks.1.slstm_layer.slstm_cell._recurrent_kernel_"
        state[key] = state[key] * 1.05

    changed = write_tirex(tmp_path / "NX-AI" / "TiRex", edit=edit)
    windows = windows_to_forecast(96)
    with torch.no_grad():
        got = ours(released, 96, 24)(windows)
    want = packages_forecast(changed, windows, 24, monkeypatch)
    assert (got - want).abs().max() > 1e-4 * want.abs().max()


def test_an_export_is_read_by_the_package_and_forecasts_as_ours(released, tmp_path, monkeypatch):
    """Changed weights exported to the release's layout (DIR/model.ckpt): tirex.load_model reads them and forecasts
    what ours does, and ours reads them back alike."""
    model = ours(released, 96, 48)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    torch.save(model.state_dict(), tmp_path / "checkpoint.pth")
    exported = tmp_path / "exported" / "NX-AI" / "TiRex"
    export(str(tmp_path / "checkpoint.pth"), str(exported), "tirex")
    windows = windows_to_forecast(96)
    with torch.no_grad():
        got = model(windows)
    want = packages_forecast(exported, windows, 48, monkeypatch)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.equal(ours(exported, 96, 48)(windows), got)


def test_the_model_is_built_at_the_folders_sizes_and_without_one_at_configs(released):
    model = TiRex.Model(configs(released, 96, 24))
    assert (len(model.tirex.blocks), model.tirex.blocks[0].config.embedding_dim,
            model.tirex.blocks[0].config.num_heads, model.tirex.config.input_ff_dim,
            model.tirex.config.train_ctx_len) == (2, 24, 2, 40, 512)
    scratch = TiRex.Model(configs(None, 96, 24))
    assert (len(scratch.tirex.blocks), scratch.tirex.blocks[0].config.embedding_dim,
            scratch.tirex.blocks[0].config.num_heads, scratch.tirex.config.input_ff_dim,
            scratch.tirex.config.train_ctx_len) == (1, 16, 2, 32, 2048)
    assert all(torch.isfinite(p).all() for p in scratch.parameters())  # the package's torch.empty ones drawn
    with pytest.raises(ValueError, match="at most 512 steps of context"):
        TiRex.Model(configs(released, 513, 24))
    with pytest.raises(ValueError, match="--pred_len 513"):
        TiRex.Model(configs(released, 96, 513))
    TiRex.Model(configs(released, 512, 512))  # the longest of each it takes
    with pytest.raises(UserError, match="read 512 steps of context .* and this model 2048"):
        scratch.load_state_dict(TiRex.Model(configs(released, 96, 24, d_model=24, e_layers=2, d_ff=40)).state_dict())


def test_the_released_size_is_35m_parameters():
    """Without a folder and at the released sizes (--d_model 512 --n_heads 4 --e_layers 12 --d_ff 2048) the model
    is TiRex's 35,291,200 parameters: the architecture the release's hyper_parameters describe."""
    model = TiRex.Model(configs(None, 96, 24, d_model=512, n_heads=4, e_layers=12, d_ff=2048))
    assert sum(p.numel() for p in model.parameters()) == 35_291_200


def test_the_input_gate_bias_is_a_direction_the_forecast_does_not_depend_on(released):
    """Why TiRex.py sets that bias's gradient to 0: shifting it moves the sLSTM's stabilizer alike, and the
    forecast (float32, as in training) stays what it was; the forget gate's bias is no such direction."""
    model = ours(released, 96, 48).train()
    windows = windows_to_forecast(96)
    with torch.no_grad():
        before = model(windows)
        bias = model.tirex.blocks[0].slstm_layer.slstm_cell._bias_.view(2, 4, -1)  # heads, gates (i, f, z, o)
        bias[:, 0] += 0.7
        shifted = model(windows)
        bias[:, 1] += 0.7
        moved = model(windows)
    assert (shifted - before).abs().max() <= 1e-5 * before.abs().max()
    assert (moved - before).abs().max() > 1e-3 * before.abs().max()


def test_a_model_ckpt_beside_a_model_config_yaml_is_another_layout_not_this_release(tmp_path):
    """A model.ckpt with a model-config.yaml beside it is the successor's older layout (its signature says so), not
    this release's Lightning checkpoint: one line naming it, before the file is read."""
    from models.foundation.tirex import adapter

    folder = tmp_path / "release"
    folder.mkdir()
    torch.save({"stack.0.time_mixer.norm_lstm.weight": torch.ones(4)}, folder / "model.ckpt")
    (folder / "model-config.yaml").write_text("num_blocks: 12\n")
    with pytest.raises(UserError, match=r"older layout \(model-config.yaml \+ model.ckpt; .*cannot read it"):
        adapter.released_file(str(folder))

