"""Sundial (models/Sundial.py, native) against the reference code (issue 40), through a committed fixture the
reference wrote (tests/golden/foundation/sundial/, `python -m benchmarks.foundation.sundial --write-fixture` in
the reference's environment): a tiny-configuration release folder (config.json + model.safetensors from
SundialForPrediction.save_pretrained, random weights) and the reference's outputs on fixed inputs with the noise
it was given. Ours loads the folder through its adapter and, given the same noise, computes the same decoder
states, flow velocities, generate() samples (a context of partial tokens, rolled out twice) and flow-matching
loss. Zero-shot scores the same on 1, 2 and 3 processes and at two --eval_batch_size (the sampler's noise follows
the window); fine-tuning gives the same weights on 1 and 2 processes; the fine-tuned checkpoint exports to the
release's layout and reads back. The bad inputs are probes of tests/bad_inputs.py (# issue 40: Sundial)."""
import json
from argparse import Namespace
from pathlib import Path
from unittest import mock

import pytest
import torch

from helpers import ETTH1_ARGS, assert_ok, records, run_cli, trained_on_1_and_2_processes, write_etth1_shaped

pytest.importorskip("safetensors")
from safetensors.torch import load_file  # noqa: E402

from layers import noise  # noqa: E402
from models import Sundial  # noqa: E402
from utils.checkpoint import export, load_weights  # noqa: E402
from utils.errors import UserError  # noqa: E402

FIXTURE = Path(__file__).parent / "golden" / "foundation" / "sundial"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def reference():
    return load_file(str(FIXTURE / "reference.safetensors"))


def configs(folder, seq_len, pred_len, **sizes):
    return Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=None if folder is None else str(folder),
                     **{"d_model": 16, "n_heads": 2, "e_layers": 1, "d_ff": 32, "dropout": 0.1, "num_samples": 5,
                        **sizes})


def ours(seq_len, pred_len, folder=FIXTURE, **sizes):
    return load_weights(Sundial.Model(configs(folder, seq_len, pred_len, **sizes)), str(folder)).eval()


def given(randn=(), rand=()):
    """layers.noise returns the given draws in turn (what the reference was given, in our row order)."""
    queues = [list(randn), list(rand)]
    return (mock.patch.object(noise, "randn", lambda *a, **k: queues[0].pop(0).clone()),
            mock.patch.object(noise, "rand", lambda *a, **k: queues[1].pop(0).clone()))


def close(got, want):
    return float((got - want).abs().max()) <= TOLERANCE * float(want.abs().max())


def test_decoder_states_and_flow_velocities_equal_the_references(reference):
    model = ours(30, 30)
    with torch.no_grad():
        assert close(model.encode(reference["context"]), reference["decoder_states"])
        assert close(model.flow(reference["flow_x"], reference["flow_t"], reference["flow_z"]), reference["velocities"])


def test_samples_equal_generates_for_the_same_noise(reference):
    """30 steps of context (7 tokens of 4, the first half padding), 30 of horizon: three output tokens of 12, the
    second and third read after the samples' median is appended, as generate rolls out."""
    model = ours(30, 30)
    draws = [reference[f"sampler_noise_{i}"] for i in range(3)]
    randn, rand = given(draws)
    with randn, rand, torch.no_grad():
        samples = model.samples(reference["context"])
    assert samples.shape == (6, 5, 30)
    assert close(samples, reference["samples"])


def test_the_forecast_is_the_quantiles_of_the_samples(reference):
    """forward: [B, L, C] -> [B, pred_len, C, 9], the samples' quantiles; window b's channels are rows b*C.."""
    model = ours(30, 30)
    context = reference["context"].view(3, 2, 30).transpose(1, 2)  # 3 windows of 2 channels
    draws = [reference[f"sampler_noise_{i}"] for i in range(3)]
    randn, rand = given(draws)
    with randn, rand, torch.no_grad():
        forecast = model(context)
    want = torch.quantile(reference["samples"], torch.tensor(Sundial.QUANTILE_LEVELS), dim=1)  # [9, 6, 30]
    assert forecast.shape == (3, 30, 2, 9)
    assert close(forecast, want.view(9, 3, 2, 30).permute(1, 3, 2, 0))


def test_the_flow_matching_loss_equals_the_references(reference):
    """32 steps of context (8 whole tokens), 8 of future (the first 8 of each token's 12 target steps scored), two
    repeats of each token (diffusion_batch_mul): the mean of ours' per-series losses is the reference's loss."""
    model = ours(32, 8)
    series = reference["loss_series"]
    randn, rand = given([reference["loss_noise"]], [reference["loss_times"]])
    with randn, rand, torch.no_grad():
        losses = model.loss(series[:, :32], series[:, 32:])
    assert losses.shape == (6,)
    assert close(losses.mean(), reference["loss"][0])
    # and forward's per-window loss: the mean over the window's channels
    randn, rand = given([reference["loss_noise"]], [reference["loss_times"]])
    with randn, rand, torch.no_grad():
        per_window = model(series[:, :32].view(3, 2, 32).transpose(1, 2), target=series[:, 32:].view(3, 2, 8)
                           .transpose(1, 2))
    assert torch.allclose(per_window, losses.view(3, 2).mean(1))


def test_the_reference_check_sees_a_changed_weight(reference, tmp_path):
    """The agreement is not vacuous: the flow network's last layer scaled moves the samples past the tolerance."""
    model = ours(30, 30)
    with torch.no_grad():
        model.flow.final_layer.linear.weight.mul_(1.01)
    randn, rand = given([reference[f"sampler_noise_{i}"] for i in range(3)])
    with randn, rand, torch.no_grad():
        assert not close(model.samples(reference["context"]), reference["samples"])


EVAL = [*ETTH1_ARGS, "--model", "Sundial", "--seq_len", 96, "--label_len", 48, "--pred_len", 30,
        "--val_windows", 20, "--test_windows", 30, "--num_threads", 1, "--num_samples", 4, "--sampling_steps", 2]
SCORES = ("mse", "mae", "wql", "mase", "smape", "coverage_80", "vali_loss", "test_objective_loss")


@pytest.fixture(scope="module")
def etth1(tmp_path_factory):
    return write_etth1_shaped(tmp_path_factory.mktemp("etth1"))


def test_zero_shot_scores_the_same_on_1_2_3_processes_and_two_eval_batch_sizes(etth1, tmp_path):
    """The sampler's noise follows the window (layers.noise), so the samples are the same whatever the batch; what
    is left is the CPU's matrix products, whose last bit can depend on how many rows a batch has (the patch
    embedding's output layer: 6e-8 in a hidden state between 140 and 70 series): scores agree to 1e-7, where
    unkeyed noise moves them by percents."""
    argv = [*EVAL, "--root_path", etth1, "--is_training", 0, "--pretrain_model_path", FIXTURE]
    runs = [((), None), ((), 2), ((), 3), (("--eval_batch_size", 5), None), (("--eval_batch_size", 7), 2)]
    outcomes = []
    for extra, nproc in runs:
        proc = run_cli(tmp_path, *argv, *extra, *(["--ddp"] if nproc else []), nproc=nproc)
        assert_ok(proc)
        outcomes.append(records(tmp_path)[-1])
    first = outcomes[0]
    assert first["test_windows"] == 30 and first["wql_levels"] == [round(0.1 * k, 1) for k in range(1, 10)]
    for outcome in outcomes[1:]:
        for key in SCORES:
            if key in first:
                assert outcome[key] == pytest.approx(first[key], rel=1e-7, abs=0), key
    assert not any((tmp_path / "checkpoints").rglob("*.pth"))


TUNE = ["--adaptation", "--train_steps", 2, "--global_batch_size", 8, "--learning_rate", 1e-3,
        "--test_every_epoch", "false"]


def test_fine_tuning_gives_the_same_weights_on_1_and_2_processes_and_exports_to_the_release(etth1, tmp_path):
    """Flow matching with the released dropout (0.1 in the fixture's config.json), its noise and times through
    layers.noise: 1 x 8 and 2 x 4 windows train to the same weights. The checkpoint exports to the release's
    layout: the fixture's keys and config.json, and ours reads it back to the same weights."""
    argv = [*EVAL, "--root_path", etth1, "--pretrain_model_path", FIXTURE, *TUNE]
    (_, path, one), (_, _, two) = trained_on_1_and_2_processes(tmp_path, *argv)
    initial = ours(96, 30).state_dict()
    assert set(one) == set(initial)
    assert any(not torch.equal(one[k], initial[k]) for k in one), "fine-tuning changed nothing"
    for key in one:
        assert torch.allclose(one[key], two[key], rtol=0, atol=1e-6), key
    exported = tmp_path / "exported"
    export(str(path), str(exported), "sundial")
    released = load_file(str(FIXTURE / "model.safetensors"))
    written = load_file(str(exported / "model.safetensors"))
    assert set(written) == set(released) and all(written[k].shape == released[k].shape for k in released)
    config, theirs = (json.loads((folder / "config.json").read_text()) for folder in (exported, FIXTURE))
    assert {k: config[k] for k in theirs if k != "transformers_version"} == \
        {k: v for k, v in theirs.items() if k != "transformers_version"}
    back = ours(96, 30, folder=exported).state_dict()
    assert all(torch.equal(back[k], one[k]) for k in one)


def test_the_model_is_built_at_the_folders_sizes_and_without_one_at_configs():
    model = Sundial.Model(configs(FIXTURE, 96, 30))
    assert (len(model.layers), model.norm.normalized_shape[0], model.layers[0].heads, model.token, model.output_len,
            len(model.flow.res_blocks), model.sampling_steps, model.diffusion_batch_mul,
            model.embed_layer.dropout.p) == (2, 16, 2, 4, 12, 2, 3, 2, 0.1)
    scratch = Sundial.Model(configs(None, 96, 30, dropout=0.0, sampling_steps=7))
    assert (len(scratch.layers), scratch.norm.normalized_shape[0], scratch.layers[0].heads, scratch.token,
            scratch.output_len, len(scratch.flow.res_blocks), scratch.sampling_steps, scratch.num_samples,
            scratch.embed_layer.dropout.p) == (1, 16, 2, 16, 720, 3, 7, 5, 0.0)
    with pytest.raises(ValueError, match="--seq_len 3 is shorter than one"):
        Sundial.Model(configs(FIXTURE, 3, 30))
    Sundial.Model(configs(FIXTURE, 4, 30))  # one whole token
    with pytest.raises(UserError, match="attend with 2 heads and this model with 4"):
        Sundial.Model(configs(None, 96, 30, n_heads=4, d_model=16)).load_state_dict(
            Sundial.Model(configs(None, 96, 30)).state_dict())


def test_the_released_size_is_128m_parameters():
    """Without a folder and at the released sizes (--d_model 768 --n_heads 12 --e_layers 12 --d_ff 3072) the model
    is thuml/sundial-base-128m's 128,329,680 parameters."""
    with torch.device("meta"):
        model = Sundial.Model(configs(None, 2880, 720, d_model=768, n_heads=12, e_layers=12, d_ff=3072))
    assert sum(p.numel() for p in model.parameters()) == RELEASED_PARAMETERS


RELEASED_PARAMETERS = 128_329_680
