"""LoRA through peft (exp.lora, --lora_rank): adapters on a zoo model's and a release's attention and MLP projections,
the base weights frozen, the adapters' dropout keyed by the sample, so the same global batch trains the same
adapters on 1, 2 and 3 processes; --lora_targets that match nothing is one line; a checkpoint holds its base
weights' hash, and a resume or an evaluation on other base weights is refused on every rank, nothing written."""
import shutil

import pytest
import torch

from helpers import assert_ok, assert_one_error_line, make_args, records, run_cli

pytest.importorskip("peft", reason="peft (the lora extra) is not installed")

TINY = ("--d_model", 16, "--n_heads", 2, "--d_ff", 16, "--e_layers", 1, "--seq_len", 48, "--pred_len", 24,
        "--synthetic_rows", 400)
TRAIN = ("--train_steps", 3, "--global_batch_size", 12, "--learning_rate", 1e-2, "--test_every_epoch", "false")


def _built(*argv):
    from exp.settings import build_model, resolve_args

    args = make_args(*map(str, argv))
    resolve_args(args, 1)
    return args, build_model(args)


def test_default_targets_are_the_projections_and_only_adapters_train():
    from exp.lora import apply_lora

    args, model = _built("--model", "PatchTST", *TINY, "--lora_rank", 4)
    wrapped = apply_lora(model, args)
    trainable = [name for name, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    adapted = {n.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for n in trainable}
    assert {"query", "key", "value", "out", "linear1", "linear2"} <= adapted and "linear" not in adapted
    # a model of linear maps only (DLinear) adapts every nn.Linear
    args, model = _built("--model", "DLinear", *TINY, "--lora_rank", 2)
    adapted = {n.split(".lora_")[0] for n, p in apply_lora(model, args).named_parameters() if p.requires_grad}
    assert adapted == {"Linear_Seasonal", "Linear_Trend"}


def test_targets_that_match_no_module_are_one_line(tmp_path):
    proc = run_cli(tmp_path, "--model", "PatchTST", *TINY, *TRAIN, "--lora_rank", 4, "--lora_targets", "attn*", "q")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--lora_targets attn* q matches no nn.Linear module" in lines[0], proc.stderr
    assert "query" in lines[0]  # names to choose from
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").rglob("*.pth"))


def test_lora_options_without_a_rank_are_one_line(tmp_path):
    proc = run_cli(tmp_path, "--model", "DLinear", *TINY, *TRAIN, "--lora_dropout", 0.1)
    assert proc.returncode == 2 and "--lora_dropout without --lora_rank" in proc.stderr, proc.stderr


def _adapters_on(tmp_path, argv, extra=()):
    """Each world size's checkpoint.pth after training `argv` on 1, 2 and 3 processes, and 1's record."""
    states, first = [], None
    for nproc in (None, 2, 3):
        out = tmp_path / f"nproc{nproc or 1}"
        assert_ok(run_cli(out, *argv, *(("--ddp",) if nproc else extra), nproc=nproc))
        record = records(out)[-1]
        first = first or record
        states.append(torch.load(out / "checkpoints" / record["setting"] / "checkpoint.pth", weights_only=True))
    return states, first


def _assert_same_adapters(states, record, initial=None):
    one = states[0]
    adapters = [k for k in one if ".lora_A." in k or ".lora_B." in k]
    assert adapters and all(set(s) == set(one) for s in states)
    assert max(float(one[k].abs().max()) for k in adapters if ".lora_B." in k) > 1e-6, "the adapters did not train"
    for state in states[1:]:
        for key in one:
            assert torch.allclose(state[key].double(), one[key].double(), rtol=0, atol=1e-6), key
    if initial is not None:  # the base weights did not move
        for key, value in initial.items():
            module, _, leaf = key.rpartition(".")
            assert torch.equal(one[key] if key in one else one[f"{module}.base_layer.{leaf}"], value), key
    keyed = {n: ok for n, ok in record["dropout_keyed"].items() if ".lora_dropout." in n}
    assert keyed and all(keyed.values()), record["dropout_keyed"]


def test_the_same_global_batch_trains_the_same_adapters_on_1_2_3_processes(tmp_path):
    # TimerXL: batch-first layers (a token-major model such as iTransformer feeds its projections [N, B, d],
    # whose adapter dropout cannot follow the sample: the run says so); PatchTST's BatchNorm would differ anyway
    argv = ("--model", "TimerXL", *TINY, "--input_token_len", 24, "--output_token_len", 24, *TRAIN, "--lora_rank", 4,
            "--lora_dropout", 0.3, "--dropout", 0.1)
    states, record = _adapters_on(tmp_path, argv)
    _assert_same_adapters(states, record)
    # --is_training 0 evaluates the checkpoint under the same --lora_* arguments: the training run's scores
    checkpoint = tmp_path / "nproc1" / "checkpoints" / record["setting"] / "checkpoint.pth"
    assert_ok(run_cli(tmp_path / "eval", *argv, "--is_training", 0, "--checkpoint", checkpoint))
    assert records(tmp_path / "eval")[-1]["mse"] == pytest.approx(record["mse"], rel=1e-9)


def _chronos_rows():
    from test_foundation import RELEASES

    return [name for name, row in RELEASES.items() if row.folder.startswith("chronos")]


@pytest.mark.parametrize("name", _chronos_rows())
def test_a_release_trains_the_same_adapters_on_1_2_3_processes(name, tmp_path):
    from test_foundation import RELEASES, needs, ours, released_folder, run_args, write_etth1_shaped

    row = needs(RELEASES[name])
    folder = released_folder(row, tmp_path / "release")
    # 1e-3 as the release's fine-tuning test: Adam's first steps move a weight by about the rate whatever the size
    # of its gradient, a near-zero gradient's rounding residue too
    argv = (*run_args(row, write_etth1_shaped(tmp_path / "etth1"), folder), "--adaptation", "--train_steps", 2,
            "--global_batch_size", 12, "--learning_rate", 1e-3, "--test_every_epoch", "false", "--lora_rank", 4,
            "--lora_dropout", 0.2)
    states, record = _adapters_on(tmp_path, argv)
    initial = ours(row, folder, row.run[1], row.run[3]).state_dict()
    _assert_same_adapters(states, record, initial)


def _files(folder):
    return {path: path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_checkpoint_on_other_base_weights_is_refused_on_every_rank(tmp_path):
    from exp.settings import build_model

    model = ("--model", "TimerXL", *TINY, "--input_token_len", 24, "--output_token_len", 24)
    bases = []
    for seed in (1, 2):  # two pre-trained bases of the same shape
        torch.manual_seed(seed)
        bases.append(tmp_path / f"base{seed}.pth")
        torch.save(_built(*model)[1].state_dict(), bases[-1])
    base = tmp_path / "base.pth"
    shutil.copy(bases[0], base)
    argv = (*model, "--lora_rank", 4, "--adaptation", "--pretrain_model_path", base, "--global_batch_size", 12,
            "--test_every_epoch", "false")
    out = tmp_path / "run"
    assert_ok(run_cli(out, *argv, "--train_steps", 2, "--ddp", nproc=2))  # resumed on 2: the same batch plan
    checkpoint = out / "checkpoints" / records(out)[-1]["setting"] / "checkpoint.pth"
    shutil.copy(bases[1], base)  # the same path, other weights: the run's arguments alone cannot tell
    before = _files(out)
    message = "the checkpoint's LoRA adapters were trained on other base weights"
    assert_one_error_line(run_cli(out, *argv, "--train_steps", 4, "--resume", "--ddp", nproc=2), message)
    for nproc in (None, 2):
        ddp = ("--ddp",) if nproc else ()
        assert_one_error_line(run_cli(out, *argv, "--is_training", 0, "--checkpoint", checkpoint, *ddp,
                                      nproc=nproc), message)
    assert _files(out) == before
    shutil.copy(bases[0], base)  # its own base back: it resumes
    assert_ok(run_cli(out, *argv, "--train_steps", 4, "--resume", "--ddp", nproc=2))
