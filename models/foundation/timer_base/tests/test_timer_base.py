"""TimerBase (Timer as released on Hugging Face, thuml/timer-base-84m) against the release's own code. The committed
fixture tests/fixture/ (beside this file) is a release folder at a tiny size (tokens of 8 steps, hidden 16, 2
layers of 2 heads; random weights) written by the reference's save_pretrained (sktime.libs.timer under
transformers 4.40.1), with the reference's generate forecasts and training losses on fixed windows
(reference.safetensors); `python -m models.foundation.timer_base.crosscheck --write-fixture` rewrites it. An export of ours
writes the release's config.json. What every release shares (zero-shot and fine-tuning on several processes, the
export's layout, the bad inputs) is tests/test_foundation.py's contract."""
import json
from argparse import Namespace
from pathlib import Path

import pytest
import torch

safetensors = pytest.importorskip("safetensors.torch")

from models.foundation.timer_base import TimerBase  # noqa: E402
from exp.export import export, load_weights  # noqa: E402
from utils.errors import UserError  # noqa: E402
from models.foundation.timer_base.adapter import RELEASED  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixture"
REFERENCE = safetensors.load_file(str(FIXTURE / "reference.safetensors"))


def configs(folder, seq_len, pred_len, **sizes):
    return Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=None if folder is None else str(folder),
                     **{"d_model": 16, "n_heads": 2, "e_layers": 1, "d_ff": 32, "dropout": 0.0,
                        "input_token_len": 8, "output_token_len": 8, **sizes})


def ours(seq_len, pred_len, folder=FIXTURE):
    return load_weights(TimerBase.Model(configs(folder, seq_len, pred_len)), str(folder)).eval()


def relative(got, want):
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("seq_len, pred_len", [(40, 8), (45, 20), (16, 24)],
                         ids=["one-token", "uneven-context-rolled-out", "short-context-rolled-out"])
def test_forecasts_equal_the_references_generate(seq_len, pred_len):
    """generate(context, max_new_tokens=pred_len) of the release's code, its cache on: 45 steps lose their oldest 5
    (5 whole tokens of 8); 20 steps are 8 + 8 + 4, each fed-back token normalised by its own statistics."""
    with torch.no_grad():
        got = ours(seq_len, pred_len)(REFERENCE[f"windows_{seq_len}"])
    want = REFERENCE[f"forecast_{seq_len}_{pred_len}"]
    assert got.shape == want.shape == (3, pred_len, 2)
    assert relative(got, want) <= 1e-5


def test_the_training_objective_is_the_references_next_token_mse():
    """Each series' loss (40 + 16 steps, 6 tokens scored) is the reference's forward(input_ids, labels).loss of that
    series normalised by its context's statistics; the [B] window losses are the means over channels."""
    model = ours(40, 16)
    windows, future = REFERENCE["windows_40"], REFERENCE["future_16"]
    with torch.no_grad():
        per_series = model.loss(windows.transpose(1, 2).reshape(6, -1), future.transpose(1, 2).reshape(6, -1))
        per_window = model(windows, target=future)
    assert relative(per_series, REFERENCE["loss_40_16"]) <= 1e-5
    assert torch.allclose(per_window, per_series.view(3, 2).mean(1), rtol=1e-6, atol=0)


def test_a_future_of_part_of_a_token_is_scored_on_the_steps_it_has():
    """pred_len 4 with tokens of 8: the last context token's label is the future's 4 steps, not dropped (a future of
    whole tokens reduces to the reference's loss, above); with a longer future it is a prefix of that label."""
    model = ours(40, 4)
    windows = REFERENCE["windows_40"][:1, :, :1]
    future = REFERENCE["future_16"][:1, :, :1]
    with torch.no_grad():
        short = model(windows, target=future[:, :4])
        future_changed = future.clone()
        future_changed[:, :4] += 1.0
        moved = model(windows, target=future_changed[:, :4])
    assert torch.isfinite(short).all() and float(moved - short) > 0.01


def test_the_head_is_picked_as_the_release_picks_it():
    """With output_token_lens [8, 16, 32]: the longest not past the steps still wanted, the first otherwise."""
    model = TimerBase.Model(configs(None, 32, 8))
    model.horizons = [8, 16, 32]
    assert [model.head_for(r) for r in (4, 8, 15, 16, 31, 32, 100)] == [0, 0, 0, 1, 1, 2, 2]


def test_the_feed_forward_gives_each_row_the_same_value_in_any_batch():
    """ATen's F.silu computes the elements left over after its vectors by another formula, so which elements those
    are (the batch's size decides) changes their last bit; TimerBase.silu leaves none over (one thread: MKL's GEMM
    sums alike from 4 rows on)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(4)
        ffn = TimerBase.FeedForward(16, 24)
        x = torch.randn(64, 16, generator=generator) * 4
        with torch.no_grad():
            whole = ffn(x)
            assert all(torch.equal(ffn(x[:rows]), whole[:rows]) for rows in range(4, 64))
    finally:
        torch.set_num_threads(threads)
    assert torch.allclose(TimerBase.silu(x), torch.nn.functional.silu(x), rtol=1e-6, atol=1e-7)
    wide = TimerBase.FeedForward(16, 64)  # d_ff a multiple of 32: forecasting takes the in-place path, same values
    with torch.no_grad():
        in_place = wide(x)
    assert torch.equal(in_place, wide(x).detach())


def test_off_the_cpu_silu_is_one_call_a_layer():
    """The SiLU blocks are for the CPU: on another device (meta here, standing in for a GPU: its device type is
    not "cpu") an eval forecast calls F.silu once a layer and forecasts the values of the CPU's form (the meta run
    gives shapes only, so the values are compared on the CPU with the device check seeing another device)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Silu(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Silu.calls += func.overloadpacket.__name__ in ("silu", "silu_")
            return func(*args, **(kwargs or {}))

    sizes = {"d_model": 64, "n_heads": 2, "e_layers": 3, "d_ff": 64}
    with torch.device("meta"):
        model = TimerBase.Model(configs(None, 40, 16, **sizes)).eval()
    with torch.no_grad(), Silu():
        model(torch.zeros(20, 40, 7, device="meta"))  # 140 series, rolled out in two steps
    assert Silu.calls == 3 * 2
    cpu = TimerBase.Model(configs(None, 40, 16, **sizes)).eval()
    windows = torch.randn(20, 40, 7, generator=torch.Generator().manual_seed(6))
    with torch.no_grad(), Silu():
        Silu.calls = 0
        kept = cpu(windows)  # the CPU's blocks: several calls a layer
        assert Silu.calls > 3 * 2

        class Elsewhere(torch.Tensor):
            @property
            def device(self):
                return torch.device("meta")

        for layer in cpu.layers:  # the plain form on the CPU's numbers
            forward = layer.ffn.forward
            layer.ffn.forward = lambda x, forward=forward: forward(x.as_subclass(Elsewhere)).as_subclass(torch.Tensor)
        Silu.calls = 0
        plain = cpu(windows)
        assert Silu.calls == 3 * 2
    assert torch.allclose(plain, kept, rtol=1e-5, atol=1e-6)


def test_a_fed_back_token_attends_alike_in_any_batch():
    """The roll-out's one-token query against the cache: the same for a series in a batch of 4 or of 20 (on 2 threads
    PyTorch's CPU scaled_dot_product_attention sums it in a batch-dependent order, 1e-7 apart)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        attention = TimerBase.Attention(1024, 8, 0.0).eval()
        generator = torch.Generator().manual_seed(5)
        token, keys, values = (torch.randn(*shape, generator=generator)
                               for shape in ((20, 1, 1024), (20, 8, 7, 128), (20, 8, 7, 128)))
        with torch.no_grad():
            whole = attention(token, (keys, values))[0]
            parts = torch.cat([attention(token[i:i + 4], (keys[i:i + 4], values[i:i + 4]))[0] for i in range(0, 20, 4)])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(parts, whole)


def test_the_model_is_built_at_the_folders_sizes_and_without_one_at_configs():
    model = TimerBase.Model(configs(FIXTURE, 40, 8, d_model=64, n_heads=4, e_layers=3))
    assert (model.token, model.horizons, len(model.layers), model.embedding.out_features,
            model.layers[0].ffn.gate.out_features, model.layers[0].attention.n_heads) == (8, [8], 2, 16, 24, 2)
    scratch = TimerBase.Model(configs(None, 48, 24, input_token_len=12, output_token_len=24, dropout=0.1))
    assert (scratch.token, scratch.horizons, len(scratch.layers), scratch.layers[0].attention.weights_dropout.p) == (
        12, [24], 1, 0.1)
    with pytest.raises(ValueError, match="--seq_len 7 is shorter than one"):
        TimerBase.Model(configs(FIXTURE, 7, 8))
    with pytest.raises(ValueError, match=r"output_token_lens \[12\] are not whole tokens of 8 steps"):
        TimerBase.Model(configs(None, 48, 8, output_token_len=12))
    with pytest.raises(UserError, match="these TimerBase weights have 2 attention heads and this model 4"):
        TimerBase.Model(configs(None, 40, 8, n_heads=4, d_ff=24, e_layers=2)).load_state_dict(ours(40, 8).state_dict())


def test_the_released_size_is_84m_parameters():
    """At the released sizes (no folder: --d_model 1024 --n_heads 8 --e_layers 8 --d_ff 2048, tokens of 96) the
    model is thuml/timer-base-84m's 84,142,080 parameters."""
    model = TimerBase.Model(configs(None, 96, 96, d_model=1024, n_heads=8, e_layers=8, d_ff=2048,
                                    input_token_len=96, output_token_len=96))
    assert sum(p.numel() for p in model.parameters()) == 84_142_080


def test_an_export_writes_the_releases_layout_and_config(tmp_path):
    """Changed weights exported to the release's layout: the fixture's files, tensor names and shapes and its
    config.json (the released attention dropout), read back alike."""
    model = ours(44, 20)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    torch.save(model.state_dict(), tmp_path / "checkpoint.pth")
    exported = tmp_path / "exported"
    export(str(tmp_path / "checkpoint.pth"), str(exported), "timer-base")
    assert sorted(p.name for p in exported.iterdir()) == ["config.json", "model.safetensors"]
    written, released = (safetensors.load_file(str(f / "model.safetensors")) for f in (exported, FIXTURE))
    assert {k: v.shape for k, v in written.items()} == {k: v.shape for k, v in released.items()}
    config, fixture_config = (json.loads((f / "config.json").read_text()) for f in (exported, FIXTURE))
    fixture_config.pop("transformers_version")
    assert config == {**fixture_config, "attention_dropout": RELEASED["attention_dropout"]}
    back, tuned = ours(44, 20, folder=exported).state_dict(), model.state_dict()
    assert all(torch.equal(back[k], tuned[k]) for k in tuned)


# ------------------------------------------------------------ its release given to OpenLTM's model (tests/test_openltm_checkpoints.py)
def test_a_hugging_face_timer_folder_is_refused_by_timer_pointing_to_timerbase(tmp_path):
    """thuml/timer-base-84m's folder is --model TimerBase's (this folder's adapter.py); given to our Timer it is named and
    refused in one line that says which model reads it."""
    safetensors = pytest.importorskip("safetensors.torch")
    from models.Timer import Model as Timer
    from test_openltm_checkpoints import _hf_decoder, configs

    folder = tmp_path / "timer-base-84m"
    folder.mkdir()
    state = _hf_decoder("emb.weight", {"gate_proj": (16, 8), "up_proj": (16, 8), "down_proj": (8, 16)})
    safetensors.save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "model_type": "timer", "input_token_len": 4, "hidden_size": 8, "intermediate_size": 16,
        "output_token_lens": [4], "num_hidden_layers": 1, "num_attention_heads": 1, "hidden_act": "silu"}))
    from exp.adaptation import load_pretrained

    with pytest.raises(UserError) as refused:
        load_pretrained(Timer(configs()), str(folder), torch.device("cpu"))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("cannot fine-tune from --pretrain_model_path: checkpoint ")
    assert "holds Timer as released on Hugging Face (thuml/timer-base-84m" in message
    assert message.endswith("weights: load it with --model TimerBase, not Timer")
    (folder / "model.safetensors").unlink()
    with pytest.raises(UserError, match="is a folder without model.safetensors"):
        load_weights(Timer(configs()), folder)
