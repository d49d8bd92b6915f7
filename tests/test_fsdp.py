"""--fsdp: FSDP2 shards a copy of the model between the ranks (utils.ddp.wrap_fsdp), and the same global batch
trains the same weights as DDP on 1, 2 and 3 processes; evaluation, checkpoints and resume read the plain module,
in DDP's format, so a run may change its distribution mode on resume; what does not compose is refused."""
import pytest
import torch

from helpers import assert_ok, assert_one_error_line, records, run_cli

SMALL = ["--synthetic_rows", 688, "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--train_epochs", 2,
         "--patience", 10, "--learning_rate", 0.005, "--clip_grad", 1.0]
MODELS = {"DLinear": ["--model", "DLinear"],
          # dropout keyed by the sample, two attention blocks (each sharded apart)
          "TimerXL": ["--model", "TimerXL", "--input_token_len", 24, "--output_token_len", 24, "--d_model", 16,
                      "--d_ff", 32, "--n_heads", 2, "--e_layers", 2, "--use_norm", 1, "--dropout", 0.1]}
METRICS = ("mse", "mae", "vali_loss")


def _train(folder, *args, nproc=None):
    proc = run_cli(folder, *SMALL, *args, nproc=nproc, timeout=300)
    assert_ok(proc)
    return records(folder)[-1]


def _weights(folder):
    (path,) = folder.rglob("checkpoint.pth")
    return torch.load(path, map_location="cpu", weights_only=True)


def _assert_same(got, want, what, rel=1e-6):
    for epoch, (a, b) in enumerate(zip(got["history"], want["history"]), 1):
        for key in ("train_loss", "vali_loss"):
            assert a[key] == pytest.approx(b[key], rel=rel, abs=0), f"{what}: epoch {epoch} {key}"
    for key in METRICS:
        assert got[key] == pytest.approx(want[key], rel=rel, abs=0), f"{what}: {key}"


@pytest.mark.parametrize("model", MODELS)
def test_fsdp_trains_the_weights_ddp_trains_on_1_2_and_3_processes(tmp_path, model):
    """Global batch 24: 24 x 1, 12 x 2 and 8 x 3 under --fsdp (one process in a process group of its own: sharded
    nothing, through FSDP2 still) against one plain process; with --clip_grad, the norm of the sharded gradients.
    410 training windows: each epoch ends on a chunk of 2, where rank 0 of 3 has none and runs a stand-in pass."""
    reference = _train(tmp_path / "ddp1", *MODELS[model], "--batch_size", 24)
    want = _weights(tmp_path / "ddp1")
    for nproc, batch in ((1, 24), (2, 12), (3, 8)):
        folder = tmp_path / f"fsdp{nproc}"
        got = _train(folder, *MODELS[model], "--batch_size", batch, "--fsdp", nproc=nproc)
        assert got["world_size"] == nproc and got["train_windows"] % 24 == 2
        _assert_same(got, reference, f"--fsdp on {nproc or 1} vs DDP on 1")
        weights = _weights(folder)
        assert weights.keys() == want.keys()  # the plain module's names: no FSDP prefix
        for name, tensor in want.items():
            if name.endswith("key_projection.bias"):
                continue  # its true gradient is zero (softmax ignores a shift of every key): Adam steps on rounding
            torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=f"{nproc}: {name}")


def _without_timings(record):
    return [{k: v for k, v in h.items() if k != "seconds"} for h in record["history"]]


def test_fsdp_accumulates_and_resumes_on_another_world_size_and_mode(tmp_path):
    """DLinear, --global_batch_size 24 in 2 accumulation steps: --fsdp trains the same on 2 processes (6 x 2 x 2)
    and on 3 (4 x 3 x 2), where each epoch ends on a short chunk of 5 windows in which the ranks run 1, 2 and 2
    forward passes (the weights stay gathered through the step). Preempted mid-epoch on 2, it resumes bit for bit
    under --fsdp on 2, and to rounding under DDP and under --fsdp on 3 processes (each then takes 4 windows of a
    micro-batch, not 6: the run's identity is the global batch): last.pth holds the plain module's weights and
    the full Adam state in DDP's format."""
    argv = [*MODELS["DLinear"], "--synthetic_rows", 692, "--global_batch_size", 24,
            "--accumulation_steps", 2, "--save_steps", 5, "--train_epochs", 3]
    straight = _train(tmp_path / "straight", *argv, "--fsdp", nproc=2)
    assert straight["train_windows"] % 24 == 5
    reference_3 = _train(tmp_path / "straight3", *argv, "--fsdp", nproc=3)
    _assert_same(reference_3, straight, "--fsdp on 3 vs 2")
    for name, nproc, mode, exact in (("same", 2, ["--fsdp"], True), ("ddp", 2, [], False),
                                     ("three", 3, ["--fsdp"], False)):
        broken = tmp_path / name
        killed = run_cli(broken, *SMALL, *argv, "--fsdp", nproc=2, preempt_at_step=13)
        assert killed.returncode != 0 and (broken / "checkpoints").exists()
        proc = run_cli(broken, *SMALL, *argv, *mode, "--resume", nproc=nproc, timeout=300)
        assert_ok(proc)
        assert "resumed from" in proc.stdout and "at step 10 (in epoch" in proc.stdout, proc.stdout
        resumed = records(broken)[-1]
        (last,) = broken.rglob("last.pth")  # under --fsdp: each rank's shards beside it, the last save's only
        saved = torch.load(last, map_location="cpu", weights_only=True)
        shards = list((last.parent / "last.shards").iterdir()) if (last.parent / "last.shards").exists() else []
        assert (saved["model"] is None) == bool(mode) and (len(shards) == 1) == bool(mode), (saved["shards"], shards)
        if exact:
            assert _without_timings(resumed) == _without_timings(straight)
            assert all(resumed[key] == straight[key] for key in METRICS)
        else:
            _assert_same(resumed, straight, f"resumed on {nproc} processes with {mode or 'DDP'}")
            want, got = _weights(tmp_path / "straight"), _weights(broken)
            for key, tensor in want.items():
                torch.testing.assert_close(got[key], tensor, rtol=0, atol=1e-6, msg=f"{name}: {key}")


@pytest.mark.parametrize("flags, named", [(["--zero"], "--zero"), (["--compile"], "--compile"),
                                          (["--lora_rank", 4], "--lora_rank")])
@pytest.mark.parametrize("nproc", [None, 2])
def test_fsdp_refuses_what_does_not_compose(tmp_path, flags, named, nproc):
    proc = run_cli(tmp_path, *SMALL, *MODELS["DLinear"], "--fsdp", *flags, nproc=nproc)
    assert_one_error_line(proc, f"--fsdp cannot be combined with {named}")
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "results").exists()


def test_fsdp_mixed_precision_computes_in_bf16_and_keeps_float32_weights(tmp_path):
    """--fsdp_mixed_precision bf16: the gathered weights and the computation in bfloat16 (training losses move off the
    float32 run's, by bf16's rounding only), the shards, Adam and the gradient reduction in float32; what is
    evaluated and saved is the float32 plain module."""
    argv = [*MODELS["TimerXL"], "--batch_size", 12, "--fsdp"]
    fp32 = _train(tmp_path / "fp32", *argv, nproc=2)
    bf16 = _train(tmp_path / "bf16", *argv, "--fsdp_mixed_precision", "bf16", nproc=2)
    for got, want in zip(bf16["history"], fp32["history"]):
        assert got["train_loss"] != want["train_loss"]
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=2e-2)
    assert all(t.dtype == torch.float32 for t in _weights(tmp_path / "bf16").values() if t.is_floating_point())


@pytest.mark.parametrize("flags", [[], ["--fsdp"]])
def test_fsdp_mixed_precision_needs_fsdp_in_a_process_group(tmp_path, flags):
    proc = run_cli(tmp_path, *SMALL, *MODELS["DLinear"], *flags, "--fsdp_mixed_precision", "bf16")
    assert_one_error_line(proc, "--fsdp_mixed_precision bf16 is FSDP2's, which runs in a process group")
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "results").exists()


def test_fsdp_refuses_to_resume_a_ddp_state_of_another_model(tmp_path):
    """--fsdp --resume of a DDP run's last.pth of another model: one line on every rank naming the model, that
    last.pth untouched, no file written."""
    assert_ok(run_cli(tmp_path / "ddp", *SMALL, *MODELS["DLinear"], "--train_epochs", 1, nproc=2))
    (last,) = (tmp_path / "ddp").rglob("last.pth")
    before = last.read_bytes()
    proc = run_cli(tmp_path / "fsdp", *SMALL, *MODELS["TimerXL"], "--fsdp", "--resume", last, nproc=2)
    assert_one_error_line(proc, "it is another run's training state: model (saved 'DLinear', now 'TimerXL')")
    assert last.read_bytes() == before
    assert not [p for p in (tmp_path / "fsdp").rglob("*") if p.is_file()]


def test_fsdp_fine_tunes_from_pre_trained_weights_as_ddp_does(tmp_path):
    """--adaptation loads the pre-trained weights into the plain module before the optimizer is made; the shards
    take them from it (planted: not copied -> the fine-tune starts from the random initialisation and differs)."""
    assert_ok(run_cli(tmp_path / "pre", *SMALL, *MODELS["TimerXL"], "--train_epochs", 1, "--seed", 7))
    (weights,) = (tmp_path / "pre").rglob("checkpoint.pth")
    tune = [*MODELS["TimerXL"], "--train_epochs", 1, "--adaptation", "--pretrain_model_path", weights]
    reference = _train(tmp_path / "ddp1", *tune, "--batch_size", 24)
    _assert_same(_train(tmp_path / "fsdp2", *tune, "--batch_size", 12, "--fsdp", nproc=2), reference,
                 "--adaptation under --fsdp on 2 vs DDP on 1")


# parameters whose true gradient is zero, which Adam moves by +-lr on rounding noise: a key's bias (softmax ignores a
# shift of every key), the affine of the last block's BatchNorm (the encoder's closing BatchNorm removes any shift and
# scale of it), and so that closing BatchNorm's running statistics
ZERO_GRADIENT = ("attention.key.bias", "layers.1.norm2.weight", "layers.1.norm2.bias", "encoder.norm.norm.running_")


def test_fsdp_trains_patchtst_with_global_batch_norm_as_one_process_does(tmp_path):
    """PatchTST's BatchNorm under --sync_bn normalises with the global batch (GlobalBatchNorm on the CPU) inside
    FSDP2's sharded blocks: 1 plain process, --fsdp on 2 and 3 (global batch 24, 17 whole steps), the same training
    losses and weights to 1e-6 but ZERO_GRADIENT's (measured 1e-3), evaluation to 1e-4 as under DDP
    (test_world_size_invariance: the running means those moves shift)."""
    argv = ["--model", "PatchTST", "--d_model", 16, "--d_ff", 32, "--n_heads", 2, "--e_layers", 2, "--dropout", 0.1,
            "--train_epochs", 1, "--sync_bn", "--synthetic_rows", 685]
    reference = _train(tmp_path / "one", *argv, "--batch_size", 24)
    assert reference["train_windows"] == 17 * 24
    want = _weights(tmp_path / "one")
    for nproc, batch in ((2, 12), (3, 8)):
        folder = tmp_path / f"fsdp{nproc}"
        got = _train(folder, *argv, "--batch_size", batch, "--fsdp", nproc=nproc)
        assert got["history"][0]["train_loss"] == pytest.approx(reference["history"][0]["train_loss"], rel=1e-6)
        for key in METRICS:
            assert got[key] == pytest.approx(reference[key], rel=1e-4), f"{nproc}: {key}"
        weights = _weights(folder)
        for name, tensor in want.items():
            if not any(part in name for part in ZERO_GRADIENT):
                torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=f"{nproc}: {name}")


def _fsdp_rows():
    from test_foundation import RELEASES

    return [name for name, row in RELEASES.items() if "fsdp" in row.checks]


@pytest.mark.parametrize("name", _fsdp_rows())
def test_fsdp_fine_tunes_a_release_as_one_process_does(tmp_path, name):
    """The release's fixture folder, each repeated block sharded apart, fine-tuned with --adaptation: --fsdp on 2
    and 3 processes ends with the weights one plain process trains (1e-6), which moved. A release whose loss is
    each micro-batch's (a mixture of experts' balancing loss: its 1-process row takes the processes' micro-batches)
    takes micro-batches of 2 windows in every run. Rate 1e-4: Adam's first steps move a weight by about the rate
    whatever its gradient, so a gradient near Adam's epsilon turns rounding into differences that scale with the
    rate (1.2e-6 at 1e-3, one weight of one expert of the Time-MoE fixture on 3)."""
    from test_foundation import RELEASES, TUNE, needs, released_folder, run_args, write_etth1_shaped

    row = needs(RELEASES[name])
    folder = released_folder(row, tmp_path / "release")
    argv = [*run_args(row, write_etth1_shaped(tmp_path / "etth1"), folder), *TUNE, *row.tune,
            "--global_batch_size", 12, "--learning_rate", 1e-4]
    # 12 = 1 x 6 = 2 x 3 = 3 x 2 micro-batches of 2 windows, or one batch a step
    micro = "--accumulation_steps" in row.one_process
    runs = {}
    for nproc, steps in ((None, 6), (2, 3), (3, 2)):
        extra = (("--fsdp",) if nproc else ()) + (("--accumulation_steps", steps) if micro else ())
        out = tmp_path / f"nproc{nproc or 1}"
        assert_ok(run_cli(out, *argv, *extra, nproc=nproc, timeout=300))
        runs[nproc] = _weights(out)
    one = runs.pop(None)
    initial = _weights_of_folder(row, folder)
    assert max(float((one[k].double() - initial[k].double()).abs().max()) for k in one) > 1e-4, "nothing trained"
    for nproc, got in runs.items():
        assert got.keys() == one.keys()
        for key in one:
            assert torch.allclose(got[key].double(), one[key].double(), rtol=0, atol=1e-6), f"{nproc}: {key}"


def _weights_of_folder(row, folder):
    from test_foundation import ours

    return ours(row, folder, row.run[1], row.run[3]).state_dict()


def _release_names():
    from test_foundation import RELEASES

    return list(RELEASES)


@pytest.mark.parametrize("name", _release_names())
def test_every_release_fine_tunes_under_fsdp_or_is_refused_in_one_line(tmp_path, name):
    """Under --fsdp each repeated block gathers its weights as it is called: a release that runs its blocks through
    their parts (its own roll-out of the package's layers) would compute with shards, and is refused in one line,
    nothing written (on every rank: the probe that finds it is raise_on_every_rank's, as test_fsdp's 2-process
    refusals); every other release takes a step (one process in a group of its own, sharded through FSDP2 still)."""
    from test_foundation import RELEASES, TUNE, needs, released_folder, run_args, write_etth1_shaped

    row = needs(RELEASES[name])
    folder = released_folder(row, tmp_path / "release")
    argv = [*run_args(row, write_etth1_shaped(tmp_path / "etth1"), folder), *TUNE, "--train_steps", 1, "--fsdp"]
    proc = run_cli(tmp_path / "run", *argv, nproc=1, timeout=300)  # one process: FSDP2 in a group of its own
    line = "runs its repeated blocks through their parts instead of calling them"
    if proc.returncode == 0:
        assert line not in proc.stdout + proc.stderr
        return
    assert_one_error_line(proc, f"--fsdp: model {name} {line}")
    assert not [p for p in (tmp_path / "run").rglob("*") if p.is_file() and p.suffix in (".pth", ".json", ".csv")]


def test_an_fsdp_training_state_is_evaluated_whole_and_its_missing_shards_are_one_line(tmp_path):
    """last.pth of an --fsdp run names its shards (torch.distributed.checkpoint, beside it): --checkpoint last.pth
    reads them whole on one process and scores the weights an --fsdp evaluation of the same file scores; without
    them, --resume and --checkpoint say so in one line, nothing written."""
    argv = [*MODELS["TimerXL"], "--batch_size", 12, "--train_epochs", 1]
    assert_ok(run_cli(tmp_path / "run", *SMALL, *argv, "--fsdp", nproc=2, timeout=300))
    (last,) = (tmp_path / "run").rglob("last.pth")
    scores = []
    for nproc, mode in ((None, ()), (2, ("--fsdp",))):
        out = tmp_path / f"eval{nproc or 1}"
        assert_ok(run_cli(out, *SMALL, *argv, *mode, "--is_training", 0, "--checkpoint", last, nproc=nproc))
        scores.append(records(out)[-1]["mse"])
    assert scores[0] == pytest.approx(scores[1], rel=1e-6)
    import shutil

    shutil.rmtree(last.parent / "last.shards")
    for flags in (("--is_training", 0, "--checkpoint", last), ("--resume",)):
        out = tmp_path / "run" if flags == ("--resume",) else tmp_path / "gone"
        proc = run_cli(out, *SMALL, *argv, "--fsdp", *flags, nproc=2)
        assert_one_error_line(proc, "which is missing or incomplete")


def test_fsdp_evaluates_sampled_forecasts_as_one_process_does(tmp_path):
    """Evaluation of the sharded module: Student-t samples drawn per window, evaluation batches of 7 over 3 ranks (the
    ranks run different numbers of batches, the short ones paired with unscored forwards): MSE, WQL, MASE and the
    validation loss of one plain process to 1e-6 (measured 3e-9)."""
    argv = [*MODELS["TimerXL"], "--train_epochs", 1, "--loss", "studentt", "--num_samples", 20,
            "--global_batch_size", 24, "--eval_batch_size", 7]
    one = _train(tmp_path / "one", *argv)
    three = _train(tmp_path / "three", *argv, "--fsdp", nproc=3)
    for key in ("mse", "wql", "mase", "vali_loss"):
        assert three[key] == pytest.approx(one[key], rel=1e-6, abs=0), key
