"""Sundial against its reference code, through a committed fixture the reference wrote (tests/fixture/
beside this file, `python -m models.foundation.sundial.crosscheck --write-fixture` in the reference's environment): a tiny release
folder (config.json + model.safetensors from SundialForPrediction.save_pretrained, random weights) and the
reference's outputs on fixed inputs with the noise it was given. Ours loads the folder through its adapter and,
given the same noise, computes the same decoder states, flow velocities, generate() samples (a context of partial
tokens, rolled out twice) and flow-matching loss; an export of ours writes the release's config.json and reads
back. What every release shares (zero-shot and fine-tuning on several processes, the export's layout, the bad
inputs) is tests/test_foundation.py's contract."""
import json
import math
from argparse import Namespace
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("safetensors")
from safetensors.torch import load_file  # noqa: E402

from layers import noise  # noqa: E402
from models.foundation.sundial import Sundial  # noqa: E402
from exp.export import export, load_weights  # noqa: E402
from utils.errors import UserError  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixture"
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


@pytest.mark.parametrize("count", [5, 6, 20])
def test_the_lower_median_is_torch_medians_values(count):
    """The rollout's median from a sort (torch.median(dim) has no deterministic CUDA kernel): torch.median's values,
    the lower middle of an even count, ties and NaN (a slice holding one gives NaN) included, along each dim."""
    generator = torch.Generator().manual_seed(count)
    x = torch.randn(4, count, 7, generator=generator)
    x[0] = x[0].round()  # ties
    x[1, :, :3] = 2.0
    x[2, 1, 4] = float("nan")
    x[3, :, 5] = float("nan")
    for dim in range(3):
        want = x.median(dim=dim).values
        got = Sundial.lower_median(x, dim)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num()), dim


class Ops(TorchDispatchMode):
    """The aten ops run."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket)
        return func(*args, **(kwargs or {}))


def test_the_rollout_runs_no_median_with_indices(reference):
    """30 steps rolled out over three output tokens of 12: the samples' median read from a sort, not median(dim),
    which raises under --deterministic on CUDA; the samples are generate's as before (the check above)."""
    model = ours(30, 30)
    randn, rand = given([reference[f"sampler_noise_{i}"] for i in range(3)])
    with randn, rand, torch.no_grad(), Ops() as ops:
        model.samples(reference["context"])
    assert torch.ops.aten.sort in ops.ops and torch.ops.aten.median not in ops.ops


def meta_draws():
    """layers.noise's draws as plain torch.randn / rand on the draw's device (the meta device has no generator to
    key): what the recorder needs to run Sundial's sampler and loss."""
    plain = lambda sampler: (lambda rows, *shape, device=None, dtype=torch.float32:  # noqa: E731
                             sampler(rows, *shape, device=device, dtype=dtype))
    return (mock.patch.object(noise, "randn", plain(torch.randn)), mock.patch.object(noise, "rand", plain(torch.rand)),
            mock.patch.object(noise, "keyed", lambda: True))


def test_an_eval_batch_and_a_training_step_copy_nothing_to_the_device():
    """On the meta device under utils.host_syncs' recorder, a rolled-out forecast (3 sampling steps per output
    token) and a training step: the time embedding's frequencies and the quantile levels are buffers moved with the
    model, not built on the host and copied per step or batch; no host read either."""
    from utils.host_syncs import record_host_syncs, summary, to_meta

    model = to_meta(ours(30, 30))
    x, future = to_meta(torch.randn(3, 30, 2)), to_meta(torch.randn(3, 30, 2))
    randn, rand, keyed = meta_draws()
    with randn, rand, keyed, record_host_syncs() as recorder:
        with torch.no_grad():
            model.eval()(x)
        model.train()(x, target=future).mean().backward()
    assert recorder.syncs == [], summary(recorder)
    assert "frequencies" not in model.flow.state_dict() and "levels" not in model.state_dict()  # the layout as it was


def test_the_time_embedding_in_another_dtype_is_computed_in_it():
    """The frequencies buffer is float32's; a flow network cast to float64 (its buffer cast too, rounded float32
    values) computes them in float64 for a float64 time, as the reference does."""
    flow = ours(30, 30).flow.double()
    t = torch.tensor([0.0, 250.0, 999.0], dtype=torch.float64)
    half = Sundial.FREQUENCY_DIM // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(0, half, dtype=torch.float64) / half)
    angles = t[:, None] * freqs[None]
    with torch.no_grad():
        want = flow.time_embed.mlp(torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1))
        assert torch.equal(flow.time(t), want)


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


def test_an_export_writes_the_releases_config_and_reads_back(tmp_path):
    """Changed weights exported to the release's layout: the fixture's tensor names and shapes and its config.json
    (the transformers version aside), and ours reads the same weights back."""
    model = ours(96, 30)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    torch.save(model.state_dict(), tmp_path / "checkpoint.pth")
    exported = tmp_path / "exported"
    export(str(tmp_path / "checkpoint.pth"), str(exported), "sundial")
    released = load_file(str(FIXTURE / "model.safetensors"))
    written = load_file(str(exported / "model.safetensors"))
    assert set(written) == set(released) and all(written[k].shape == released[k].shape for k in released)
    config, theirs = (json.loads((folder / "config.json").read_text()) for folder in (exported, FIXTURE))
    assert {k: config[k] for k in theirs if k != "transformers_version"} == \
        {k: v for k, v in theirs.items() if k != "transformers_version"}
    back, tuned = ours(96, 30, folder=exported).state_dict(), model.state_dict()
    assert all(torch.equal(back[k], tuned[k]) for k in tuned)


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


# ------------------------------------------------------------ its release given to OpenLTM's model (tests/test_openltm_checkpoints.py)
def test_run_py_refuses_sundials_release_for_timerxl_naming_model_sundial(tmp_path):
    """thuml/sundial-base-128m's weights are --model Sundial's (this folder's adapter.py): given to TimerXL they are named
    and refused in one line that says which model reads them."""
    from helpers import assert_one_error_line, run_cli
    from test_openltm_checkpoints import RUN, _hf_decoder
    from utils.checkpoint import save_atomic

    state = {**_hf_decoder("hidden_layer.weight", {"gate_proj": (16, 8)}),
             "flow_loss.net.input_proj.weight": torch.zeros(8, 8)}
    save_atomic(state, tmp_path / "sundial.pth")
    proc = run_cli(tmp_path, *RUN, "--train_epochs", 1, "--adaptation", "--pretrain_model_path",
                   tmp_path / "sundial.pth")
    assert_one_error_line(proc, "cannot fine-tune from --pretrain_model_path: checkpoint ")
    assert "holds Sundial's released checkpoint (thuml/sundial-base-128m" in proc.stderr
    assert "load it with --model Sundial, not TimerXL" in proc.stderr
    assert not (tmp_path / "results" / "results.jsonl").exists()
