"""--activation_checkpointing (layers.checkpointing): each repeated block keeps only its input for backward and runs
again there, and no number changes: the recompute draws the forward's dropout masks, keyed by the sample outside
the experiment's masks_follow_samples, and its keyed attention dropout; weights after training are bit for bit
those of a run without it on one process, and under --fsdp or DDP on 2 processes those of one process without it;
every model's gradients are the same, or a model without repeated blocks is refused."""
import pytest
import torch

from helpers import assert_ok, make_args, make_experiment, records, run_cli
from models import available_models

SMALL = ["--synthetic_rows", 688, "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--train_epochs", 1,
         "--learning_rate", 0.005, "--test_every_epoch", "false"]
# dropout 0.1 in every block: keyed masks in the blocks that are recomputed
MODELS = {"PatchTST": ["--model", "PatchTST", "--d_model", 16, "--d_ff", 32, "--n_heads", 2, "--e_layers", 2,
                       "--dropout", 0.1],
          "TimerXL": ["--model", "TimerXL", "--input_token_len", 24, "--output_token_len", 24, "--d_model", 16,
                      "--d_ff", 32, "--n_heads", 2, "--e_layers", 2, "--use_norm", 1, "--dropout", 0.1]}


def _trained(folder, *argv, nproc=None):
    assert_ok(run_cli(folder, *SMALL, *argv, nproc=nproc, timeout=300))
    (path,) = folder.rglob("checkpoint.pth")
    return records(folder)[-1], torch.load(path, map_location="cpu", weights_only=True)


def _assert_equal_runs(got, want, what):
    (got_record, got_weights), (want_record, want_weights) = got, want
    assert got_weights.keys() == want_weights.keys(), what  # the plain module's names
    for name, tensor in want_weights.items():
        assert torch.equal(got_weights[name], tensor), f"{what}: {name}"
    for key in ("mse", "mae", "vali_loss"):
        assert got_record[key] == want_record[key], f"{what}: {key}"
    assert all(got_record["dropout_keyed"].values()), got_record["dropout_keyed"]


@pytest.mark.parametrize("model", MODELS)
def test_checkpointing_trains_the_same_weights_bit_for_bit(tmp_path, model):
    argv = [*MODELS[model], "--batch_size", 16]
    without = _trained(tmp_path / "without", *argv)
    _assert_equal_runs(_trained(tmp_path / "with", *argv, "--activation_checkpointing"), without, model)


def test_a_run_preempted_with_it_resumes_without_it_bit_for_bit(tmp_path):
    """It changes no number, so it is not part of the run's identity: TimerXL killed mid-epoch with it resumes
    without it and ends as the uninterrupted run without it (planted: the option in the identity -> refused)."""
    argv = [*MODELS["TimerXL"], "--batch_size", 16, "--save_steps", 5, "--train_epochs", 2]
    straight = _trained(tmp_path / "straight", *argv)
    broken = tmp_path / "broken"
    killed = run_cli(broken, *SMALL, *argv, "--activation_checkpointing", preempt_at_step=13)
    assert killed.returncode != 0 and (broken / "checkpoints").exists()
    proc = run_cli(broken, *SMALL, *argv, "--resume", timeout=300)
    assert_ok(proc)
    assert "resumed from" in proc.stdout and "at step 10 (in epoch" in proc.stdout, proc.stdout
    (path,) = broken.rglob("checkpoint.pth")
    resumed = (records(broken)[-1], torch.load(path, map_location="cpu", weights_only=True))
    _assert_equal_runs(resumed, straight, "resumed without --activation_checkpointing")


def test_under_fsdp_and_ddp_on_2_processes_it_trains_what_1_process_trains_without(tmp_path):
    """Global batch 16: 16 x 1 without checkpointing against 8 x 2 with it, under --fsdp (each block sharded and
    checkpointed) and under DDP; FSDP2 with checkpointing is FSDP2 without it, bit for bit."""
    argv = MODELS["TimerXL"]
    _, want = _trained(tmp_path / "one", *argv, "--batch_size", 16)
    fsdp = _trained(tmp_path / "fsdp", *argv, "--batch_size", 8, "--fsdp", "--activation_checkpointing", nproc=2)
    ddp = _trained(tmp_path / "ddp", *argv, "--batch_size", 8, "--activation_checkpointing", nproc=2)
    for what, (record, weights) in (("--fsdp", fsdp), ("DDP", ddp)):
        assert record["world_size"] == 2
        for name, tensor in want.items():
            if name.endswith("key_projection.bias"):
                continue  # its true gradient is zero (softmax ignores a shift of every key): Adam steps on rounding
            torch.testing.assert_close(weights[name], tensor, rtol=1e-7, atol=1e-7, msg=f"{what} on 2: {name}")
    plain_fsdp = _trained(tmp_path / "fsdp_plain", *argv, "--batch_size", 8, "--fsdp", nproc=2)
    _assert_equal_runs(fsdp, plain_fsdp, "--fsdp with and without checkpointing")


def _chronos_rows():
    from test_foundation import RELEASES

    return [name for name, row in RELEASES.items() if row.folder.startswith("chronos")]


@pytest.mark.parametrize("name", _chronos_rows())
def test_a_release_with_keyed_attention_dropout_trains_the_same_weights(tmp_path, name):
    """Chronos-Bolt's T5 blocks and Chronos-2's (their fixtures at reduced shape): keyed dropout and keyed
    attention-weight dropout in every block, recomputed in backward."""
    from test_foundation import RELEASES, needs, released_folder, run_args, write_etth1_shaped

    row = needs(RELEASES[name])
    argv = (*run_args(row, write_etth1_shaped(tmp_path / "etth1"), released_folder(row, tmp_path / "release")),
            "--adaptation", "--train_steps", 2, "--global_batch_size", 12, "--learning_rate", 1e-3)
    runs = []
    for name, extra in (("without", ()), ("with", ("--activation_checkpointing",))):
        assert_ok(run_cli(tmp_path / name, *argv, *extra, timeout=300))
        record = records(tmp_path / name)[-1]
        path = tmp_path / name / "checkpoints" / record["setting"] / "checkpoint.pth"
        runs.append((record, torch.load(path, map_location="cpu", weights_only=True)))
    assert any(".weights_dropout" in name for name in runs[0][0]["dropout_keyed"])  # keyed attention dropout ran
    _assert_equal_runs(runs[1], runs[0], name)


def _one_step(*argv):
    """One training forward and backward of TimerXL (4 blocks) on 8 windows inside masks_follow_samples, as
    train_step runs it: (each parameter's gradient, the bytes autograd keeps for backward). Kept bytes: the
    distinct storages of the tensors saved for backward (parameters aside), plus, for checkpointed blocks, the
    inputs each keeps to run again."""
    from data_provider.data_factory import data_provider
    from exp.forward import training_loss
    from layers.checkpointing import checkpointed
    from layers.dropout import mask_key, masks_follow_samples
    from utils.ddp import repeated_blocks

    exp = make_experiment(make_args(*SMALL, *MODELS["TimerXL"], "--e_layers", 4, *argv))
    model = exp.raw_model.train()
    batch = data_provider(exp.args, "train", exp.device)[0].__getitems__(torch.arange(8))
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def keep(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            kept[storage.data_ptr()] = storage.nbytes()

    def pack(tensor):
        keep(tensor)
        return tensor

    blocks = [block for block in repeated_blocks(model) if checkpointed(block)]
    def keep_inputs(block, args):
        for value in args:
            if torch.is_tensor(value):
                keep(value)

    hooks = [block.register_forward_pre_hook(keep_inputs) for block in blocks]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), \
            masks_follow_samples(mask_key(exp.args.seed, 0), 0, 8):
        loss = training_loss(model, batch, exp.args, exp.device, exp.loss)[0]
    loss.backward()  # outside the masks' context, as train_step's backward
    for hook in hooks:
        hook.remove()
    return {name: p.grad for name, p in model.named_parameters()}, sum(kept.values()), len(blocks)


def test_checkpointed_blocks_keep_fewer_activations_and_give_the_same_gradients():
    """TimerXL with 4 blocks: 0.15 of the bytes kept (measured: 76 384 of 525 056), the same gradients bit for
    bit (the recompute's masks are the forward's)."""
    grads, kept, _ = _one_step()
    grads_checkpointed, kept_checkpointed, blocks = _one_step("--activation_checkpointing")
    assert blocks == 4
    for name, grad in grads.items():
        assert torch.equal(grads_checkpointed[name], grad), name
    ratio = kept_checkpointed / kept
    print(f"kept for backward: {kept_checkpointed} of {kept} bytes ({ratio:.3f})")
    assert ratio < 0.4, f"checkpointed blocks keep {kept_checkpointed} bytes, {ratio:.2f} of {kept}"


def _contract_gradients(model, *argv):
    """Each parameter's gradient after one training forward (inside masks_follow_samples) and backward of `model`
    at the model contract's small shape, 2 layers, dropout 0.1, on 4 windows."""
    from data_provider.data_factory import data_provider
    from exp.forward import training_loss
    from layers.dropout import mask_key, masks_follow_samples
    from test_model_contract import CONTRACT_ARGS

    shape = [str(a) for a in CONTRACT_ARGS]
    for name, value in (("--dropout", "0.1"), ("--e_layers", "2")):
        shape[shape.index(name) + 1] = value
    exp = make_experiment(make_args("--model", model, *shape, *argv))
    batch = data_provider(exp.args, "train", exp.device)[0].__getitems__(torch.arange(4))
    with masks_follow_samples(mask_key(exp.args.seed, 0), 0, 4):
        loss = training_loss(exp.raw_model.train(), batch, exp.args, exp.device, exp.loss)[0]
    loss.backward()
    return {name: p.grad for name, p in exp.raw_model.named_parameters()}


@pytest.mark.parametrize("model", available_models())
def test_every_model_gets_the_same_gradients_or_is_refused(model):
    """Every model of the zoo and every release (random weights): the same gradients bit for bit with its blocks
    checkpointed, or, with no repeated block, the one-line refusal."""
    from utils.errors import UserError

    want = _contract_gradients(model)
    try:
        got = _contract_gradients(model, "--activation_checkpointing")
    except UserError as refusal:
        assert f"model {model} has none" in str(refusal)
        return
    for name, grad in want.items():
        assert (grad is None) == (got[name] is None), name
        assert grad is None or torch.equal(got[name], grad), name


def test_a_model_without_repeated_blocks_is_refused_in_one_line():
    from exp.settings import build_model, resolve_args
    from layers.checkpointing import checkpoint_blocks
    from utils.errors import UserError

    args = make_args(*SMALL, "--model", "DLinear")
    resolve_args(args, 1)
    with pytest.raises(UserError, match="model DLinear has none: drop --activation_checkpointing"):
        checkpoint_blocks(build_model(args), "DLinear")
