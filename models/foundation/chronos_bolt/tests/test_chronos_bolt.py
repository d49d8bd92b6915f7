"""Chronos-Bolt against chronos-forecasting: a folder the package wrote (tests/writer.py: its
ChronosBoltModelForForecasting at a reduced configuration, blocks of 16 steps so that --pred_len 24 rolls out,
random weights) forecasts what ChronosBoltPipeline.predict / predict_quantiles do on the same windows, to 1e-5
relative; an export of ours is what the pipeline loads and predicts from alike; without the package, --model
ChronosBolt is one line naming the install. What every release shares (zero-shot and fine-tuning on several
processes, the export's layout, the bad inputs) is tests/test_foundation.py's contract."""
import json

import pytest
import torch

chronos = pytest.importorskip("chronos", reason="the chronos extra (pip install -e '.[chronos]')")

from helpers import make_args  # noqa: E402
from test_foundation import checkpoints  # noqa: E402
from models.foundation.chronos_bolt import adapter as chronos_bolt  # noqa: E402
from models.foundation.chronos_bolt import ChronosBolt as chronos_bolt_model  # noqa: E402
from models.foundation.chronos_bolt.tests.writer import BLOCK, write as write_chronos_bolt  # noqa: E402
from exp.export import export, load_weights  # noqa: E402
from utils.host_syncs import record_host_syncs, summary, to_meta  # noqa: E402

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def fixture_folder(tmp_path_factory):
    return write_chronos_bolt(tmp_path_factory.mktemp("chronos-bolt") / "chronos-bolt-fixture")


def our_model(folder, seq_len, pred_len, checkpoint=None):
    from models.foundation.chronos_bolt.ChronosBolt import Model

    model = Model(make_args("--model", "ChronosBolt", "--seq_len", seq_len, "--pred_len", pred_len,
                            "--pretrain_model_path", folder))
    load_weights(model, checkpoint or folder)
    return model.eval()


def windows(seed=0, batch=6, length=70, channels=3):
    """Random walks on different levels and scales, with a flat channel (scale 0: the package's eps)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, channels, generator=generator).cumsum(1) * torch.tensor([1.0, 30.0, 0.01])
    x[1, :, 2] = 5.0
    return x + torch.tensor([0.0, 1000.0, -3.0])


def zero_shot_quantiles(release, windows, pred_len, monkeypatch):
    """The package's own forecast of every channel of raw `windows` [B, L, C]: [B, pred_len, C, levels], for the
    checks of tests/ that hold a packaged release's zero-shot runs to its package (test_zero_shot, test_gift_eval)."""
    batch, length, channels = windows.shape
    pipeline = chronos.ChronosBoltPipeline.from_pretrained(release)
    quantiles, _ = pipeline.predict_quantiles(windows.transpose(1, 2).reshape(batch * channels, length),
                                              prediction_length=pred_len, quantile_levels=pipeline.quantiles)
    return quantiles.reshape(batch, channels, pred_len, -1).transpose(1, 2)


def relative_difference(ours, reference):
    return ((ours - reference).abs() / reference.abs().clamp_min(1e-6)).max().item()


@pytest.mark.parametrize("pred_len", [10, BLOCK, 40])  # within a block, exactly one, rolled out twice
def test_forecasts_are_the_package_pipelines(fixture_folder, pred_len):
    x = windows()
    batch, length, channels = x.shape
    model = our_model(fixture_folder, length, pred_len)
    with torch.no_grad():
        ours = model(x)  # [B, pred_len, C, 9]
    assert ours.shape == (batch, pred_len, channels, 9)
    pipeline = chronos.ChronosBoltPipeline.from_pretrained(fixture_folder)
    series = x.transpose(1, 2).reshape(batch * channels, length)
    with pytest.warns(UserWarning) if pred_len > BLOCK else _nothing():
        predicted = pipeline.predict(series, prediction_length=pred_len)  # [B * C, 9, pred_len]
    assert relative_difference(ours, predicted.reshape(batch, channels, 9, pred_len).permute(0, 3, 1, 2)) <= TOLERANCE
    quantiles, median = pipeline.predict_quantiles(series, prediction_length=pred_len,
                                                   quantile_levels=list(model.quantile_levels))
    assert relative_difference(ours, quantiles.reshape(batch, channels, pred_len, 9).transpose(1, 2)) <= TOLERANCE
    assert relative_difference(ours[..., 4], median.reshape(batch, channels, pred_len).transpose(1, 2)) <= TOLERANCE


def test_a_rolled_out_context_keeps_the_last_context_length_steps(tmp_path):
    """Past chronos_config.context_length (32 here), each rolled-out block reads the last 32 steps of the context
    and the blocks so far, as the pipeline does."""
    folder = write_chronos_bolt(tmp_path / "short", seed=1, context_length=32)
    x = windows(batch=2, length=30)
    model = our_model(folder, 30, 50)  # 30 + 16 > 32 from the second block on
    with torch.no_grad():
        ours = model(x)
    pipeline = chronos.ChronosBoltPipeline.from_pretrained(folder)
    with pytest.warns(UserWarning):
        predicted = pipeline.predict(x.transpose(1, 2).reshape(6, 30), prediction_length=50)
    assert relative_difference(ours, predicted.reshape(2, 3, 9, 50).permute(0, 3, 1, 2)) <= TOLERANCE


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_window_does_not_depend_on_its_batch_mates_or_the_channel_order(fixture_folder):
    x = windows(batch=4)
    model = our_model(fixture_folder, x.shape[1], 24)
    with torch.no_grad():
        together = model(x)
        alone = torch.cat([model(x[i:i + 1]) for i in range(4)])
        reversed_channels = model(x.flip(-1)).flip(2)
    assert relative_difference(alone, together) <= TOLERANCE
    assert relative_difference(reversed_channels, together) <= TOLERANCE


def with_gaps(x):
    """Windows with unobserved (NaN) steps: a patch all NaN, a part of one, a whole channel."""
    x = x.clone()
    x[0, :20, 1], x[2, 5:40, 0], x[3, :, 2] = float("nan"), float("nan"), float("nan")
    return x


def test_the_device_forms_forecast_the_cpu_forms_bits(fixture_folder, monkeypatch):
    """Off the CPU the 9 paths of a rolled-out block are one batch and the T5 masks are built from the padding mask;
    on the CPU the paths go one after another and transformers reads whether a mask is needed. Forced on the CPU,
    the device forms give the same bits, with gaps in the windows and without, through two rolled-out blocks."""
    x = windows(batch=5)
    model = our_model(fixture_folder, x.shape[1], 2 * BLOCK + 8)
    with torch.no_grad():
        cpu = [model(x), model(with_gaps(x))]
        monkeypatch.setattr(type(model), "paths_in_one_batch", staticmethod(lambda context: True))
        monkeypatch.setattr(chronos_bolt_model, "READS_ARE_FREE", ())
        device = [model(x), model(with_gaps(x))]
    for mine, theirs in zip(device, cpu):
        assert torch.equal(mine, theirs)


def test_a_rolled_out_forecast_reads_nothing_back_off_the_cpu(fixture_folder):
    """On a device a forecast (two rolled-out blocks, gaps in the windows) neither reads a value back to the host nor
    copies one from it (counted on the meta device: utils.host_syncs), and forwards each block once."""
    x = to_meta(with_gaps(windows(batch=4)))
    model = to_meta(our_model(fixture_folder, x.shape[1], 2 * BLOCK + 8))
    calls = []
    model.bolt.register_forward_hook(lambda module, args, out: calls.append(1))
    with record_host_syncs() as rec, torch.no_grad():
        model(x)
    assert rec.syncs == [], summary(rec)
    assert len(calls) == 3


def test_an_export_is_read_by_the_package_and_predicts_as_ours(tmp_path, fixture_folder):
    """Changed weights exported to the released layout: the package's pipeline predicts from them what ours does."""
    model = our_model(fixture_folder, 64, 24)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    torch.save(model.state_dict(), tmp_path / "checkpoint.pth")
    exported = tmp_path / "exported"
    checkpoints().export(str(tmp_path / "checkpoint.pth"), str(exported), "chronos-bolt")
    written, released = (json.loads((f / "config.json").read_text()) for f in (exported, fixture_folder))
    assert {k: written[k] for k in MODEL_FIELDS} == {k: released[k] for k in MODEL_FIELDS}
    x = windows(seed=3, length=64)
    with torch.no_grad():
        forecast = model(x)
    pipeline = chronos.ChronosBoltPipeline.from_pretrained(exported)
    with pytest.warns(UserWarning):  # 24 steps > the block of 16
        predicted = pipeline.predict(x.transpose(1, 2).reshape(-1, 64), prediction_length=24)
    assert relative_difference(forecast, predicted.reshape(6, 3, 9, 24).permute(0, 3, 1, 2)) <= TOLERANCE


MODEL_FIELDS = ("architectures", "model_type", "d_model", "d_ff", "num_heads", "d_kv", "num_layers",
                "num_decoder_layers", "relative_attention_num_buckets", "relative_attention_max_distance",
                "chronos_config", "dense_act_fn", "is_gated_act", "layer_norm_epsilon", "vocab_size")


def test_export_writes_what_it_read(tmp_path, fixture_folder):
    """Released folder -> ours -> released folder: the same tensors, and the same config.json's model fields."""
    holder, source = export(fixture_folder, tmp_path / "again", to="chronos-bolt")
    assert holder is source is chronos_bolt.CHRONOS_BOLT
    from safetensors.torch import load_file

    assert {k: v.tolist() for k, v in load_file(tmp_path / "again" / "model.safetensors").items()} == {
        k: v.tolist() for k, v in load_file(fixture_folder / "model.safetensors").items()}
    written, released = (json.loads((f / "config.json").read_text()) for f in (tmp_path / "again", fixture_folder))
    assert {k: written[k] for k in MODEL_FIELDS} == {k: released[k] for k in MODEL_FIELDS}
