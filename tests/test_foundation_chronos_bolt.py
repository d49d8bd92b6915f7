"""ChronosBolt (models/ChronosBolt.py) from a Chronos-Bolt folder in the released layout: the package's own
ChronosBoltModelForForecasting at a reduced configuration (d_model 16, one layer each way, blocks of 16 steps
so that --pred_len 24 rolls out), random weights, saved by the package (config.json + model.safetensors).

- our forecasts are ChronosBoltPipeline.predict's / predict_quantiles' on the same windows, to 1e-5 relative;
- zero-shot metrics on ETTh1-shaped data are identical on 1, 2 and 3 processes and at two evaluation batch sizes;
- fine-tuning on 1 and 2 processes (same global batch, the folder's dropout 0.1 keyed) gives the same weights;
- the fine-tuned checkpoint exports to the released layout, which the package loads and predicts from as we do;
- without the package, --model ChronosBolt is one line naming the install.
The folder's bad inputs (missing, partial, another model's config, too long a context) are probes of
tests/bad_inputs.py ("# issue 39: ChronosBolt").
"""
import json
import math

import pytest
import torch

chronos = pytest.importorskip("chronos", reason="the chronos extra (pip install -e '.[chronos]')")

from helpers import ETTH1_ARGS, assert_ok, make_args, records, run_cli, run_command  # noqa: E402
from utils import chronos_bolt  # noqa: E402
from utils.checkpoint import export, load_weights  # noqa: E402

BLOCK = 16  # the fixture's prediction_length: --pred_len 24 takes one rolled-out block
RUN = ["--model", "ChronosBolt", *ETTH1_ARGS, "--seq_len", 64, "--label_len", 0, "--num_threads", 1,
       "--eval_batch_size", 512]
# zero-shot over every window of ETTh1's splits at one block (a rolled-out horizon costs 9 forecasts a window
# a block: the pipeline tests above check it); fine-tuning through a rolled-out horizon, scored on subsets
ZERO_SHOT = [*RUN, "--pred_len", BLOCK, "--val_windows", 64, "--is_training", 0]  # every test window
FINE_TUNE = [*RUN, "--pred_len", 24, "--val_windows", 64, "--test_windows", 64, "--is_training", 1, "--adaptation",
             "--train_steps", 3, "--eval_steps", 3, "--global_batch_size", 8, "--subset_rand_ratio", 0.01,
             "--learning_rate", 1e-3, "--train_epochs", 1]
TOLERANCE = 1e-5


def write_fixture(folder, seed=0, **overrides):
    """A Chronos-Bolt folder as the hub has it, written by the package: its model at a reduced configuration."""
    from chronos.chronos_bolt import ChronosBoltModelForForecasting
    from transformers import T5Config

    chronos_config = dict(prediction_length=BLOCK, **overrides.pop("chronos_config", {}))
    config = chronos_bolt.released_config("tiny", d_model=16, d_ff=32, num_layers=1, num_decoder_layers=1,
                                          num_heads=2, d_kv=8, chronos_config=chronos_config, **overrides)
    torch.manual_seed(seed)
    ChronosBoltModelForForecasting(T5Config.from_dict(config)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def fixture_folder(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("chronos-bolt") / "chronos-bolt-fixture")


@pytest.fixture(scope="module")
def etth1(tmp_path_factory):
    from helpers import write_etth1_shaped

    folder = write_etth1_shaped(tmp_path_factory.mktemp("etth1"))
    return ["--root_path", folder]  # after ETTH1_ARGS: the shaped file, wherever the real one is


def our_model(folder, seq_len, pred_len, checkpoint=None):
    from models.ChronosBolt import Model

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
    folder = write_fixture(tmp_path / "short", seed=1, chronos_config=dict(context_length=32))
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


TEST_METRICS = ("mse", "mae", "rmse", "mape", "mspe", "wql", "smape", "mase", "coverage_80", "test_objective_loss",
                "test_windows")


def metrics_of(tmp_path):
    """The test metrics of the one run that wrote in `tmp_path`."""
    (record,) = records(tmp_path)
    return {k: record[k] for k in TEST_METRICS}


def test_zero_shot_metrics_identical_on_1_2_3_processes_and_two_eval_batch_sizes(tmp_path, fixture_folder, etth1):
    zero_shot = [*ZERO_SHOT, *etth1, "--pretrain_model_path", fixture_folder]
    runs = {}
    # three runs cover both: 1 process at --eval_batch_size 512, 2 at 512, 3 at 37
    for name, nproc, extra in (("1", None, []), ("2", 2, []), ("3 at batch 37", 3, ["--eval_batch_size", 37])):
        proc = run_cli(tmp_path / name.replace(" ", "_"), *zero_shot, *extra, nproc=nproc)
        assert_ok(proc)
        runs[name] = metrics_of(tmp_path / name.replace(" ", "_"))
    first = runs["1"]
    assert first["test_windows"] == 2865 and all(math.isfinite(v) for v in first.values()), first
    for name, metrics in runs.items():
        # MSE / MAE bit for bit; the probabilistic metrics' float64 sums to 1e-12 (MASE's differs by an ulp on 3)
        assert {k: metrics[k] for k in ("mse", "mae")} == {k: first[k] for k in ("mse", "mae")}, name
        assert metrics == pytest.approx(first, rel=1e-12, abs=0), f"{name}: {metrics} != {first}"




@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory, fixture_folder, etth1):
    """One fine-tuning run per world size (1 and 2), same global batch; the folders it wrote in."""
    folders = {}
    for nproc in (1, 2):
        folder = tmp_path_factory.mktemp(f"fine_tune_{nproc}")
        proc = run_cli(folder, *FINE_TUNE, *etth1, "--pretrain_model_path", fixture_folder,
                       nproc=None if nproc == 1 else nproc)
        assert_ok(proc)
        folders[nproc] = folder
    return folders


def checkpoint_of(folder):
    (path,) = (folder / "checkpoints").glob("*/checkpoint.pth")
    return path


def test_fine_tuning_gives_the_same_weights_on_1_and_2_processes(fine_tuned, fixture_folder):
    one, two = (torch.load(checkpoint_of(fine_tuned[n]), weights_only=True) for n in (1, 2))
    keyed = json.loads(next((fine_tuned[2] / "results").glob("*/metrics.json")).read_text())["dropout_keyed"]
    attention = [name for name in keyed if name.endswith("Attention.weights_dropout")]
    assert len(attention) == 3 and all(keyed.values()), keyed  # the folder's dropout 0.1, attention weights too
    start = chronos_bolt.CHRONOS_BOLT.to_ours(
        __import__("safetensors.torch", fromlist=["load_file"]).load_file(fixture_folder / "model.safetensors"), {})
    assert set(one) == set(two) == set(start)
    moved = max((one[k] - start[k]).abs().max().item() for k in one)
    assert moved > 1e-4, "fine-tuning did not change the weights"
    for key in one:
        assert torch.allclose(one[key], two[key], rtol=0, atol=1e-6), (key, (one[key] - two[key]).abs().max())


def test_the_fine_tuned_checkpoint_exports_to_the_released_layout_and_the_package_predicts_the_same(
        tmp_path, fine_tuned, fixture_folder, etth1):
    checkpoint = checkpoint_of(fine_tuned[1])
    exported = tmp_path / "exported"
    proc = run_command(["python", "-m", "utils.checkpoint", "export", "--to", "chronos-bolt", str(checkpoint),
                        str(exported)])
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in exported.iterdir()) == ["config.json", "model.safetensors"]
    written, released = (json.loads((f / "config.json").read_text()) for f in (exported, fixture_folder))
    assert {k: written[k] for k in MODEL_FIELDS} == {k: released[k] for k in MODEL_FIELDS}
    x = windows(seed=3, length=64)
    ours = our_model(fixture_folder, 64, 24, checkpoint=checkpoint)
    with torch.no_grad():
        forecast = ours(x)
    pipeline = chronos.ChronosBoltPipeline.from_pretrained(exported)
    series = x.transpose(1, 2).reshape(-1, 64)
    with pytest.warns(UserWarning):  # 24 steps > the block of 16
        predicted = pipeline.predict(series, prediction_length=24).reshape(6, 3, 9, 24).permute(0, 3, 1, 2)
    assert relative_difference(forecast, predicted) <= TOLERANCE
    # and the exported folder, evaluated zero-shot, scores what the fine-tuning run's test scored
    zero_shot = FINE_TUNE[:FINE_TUNE.index("--is_training")]  # the fine-tuning run's data, horizon and windows
    proc = run_cli(tmp_path / "zero_shot", *zero_shot, *etth1, "--is_training", 0, "--pretrain_model_path", exported)
    assert_ok(proc)
    assert metrics_of(tmp_path / "zero_shot") == metrics_of(fine_tuned[1])


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


def test_without_the_package_the_model_is_one_line(tmp_path):
    """A chronos that cannot be imported (a stand-in first on the path) gives one line naming the install."""
    fake = tmp_path / "site" / "chronos"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named chronos (stand-in)')\n")
    from helpers import REPO

    proc = run_command(["python", str(REPO / "run.py"), "--model", "ChronosBolt", "--data", "synthetic",
                        "--synthetic_rows", "400", "--seq_len", "48", "--pred_len", "24", "--label_len", "0",
                        "--checkpoints", str(tmp_path / "ck"), "--results_dir", str(tmp_path / "res")],
                       extra_env={"PYTHONPATH": f"{tmp_path / 'site'}:{REPO}"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert "needs the chronos-forecasting package" in errors[0] and "pip install -e '.[chronos]'" in errors[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "ck").exists() and not (tmp_path / "res").exists()
