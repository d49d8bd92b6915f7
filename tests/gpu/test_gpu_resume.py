"""Nothing lost on GPUs either: a run continued with --resume, and a DDP job whose SIGKILLed worker torchrun
restarts, end bit for bit where the uninterrupted run does (--deterministic)."""
import pytest
import torch

from gpu_helpers import (assert_same_run, checkpoint_state, injected, launch, metrics_json, model_args,
                         run_gpu)
from helpers import assert_ok

# Rank 1 of the first attempt (not the restarted one) kills itself at its second training step after the
# first validation, i.e. in epoch 2: by then rank 0 has passed the all-reduce of epoch 2's first step, so
# last.pth of epoch 1 is complete. No chance to clean up, as in a preemption or an OOM kill.
KILL = '''
import os, signal, sys, time
if os.environ.get("RANK") == "1" and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    sys.path.insert(0, os.environ["TSL_REPO"])
    import exp.forward
    forward = exp.forward.forward
    seen = {"val": False, "train_after_val": 0}
    def killed_in_epoch_2(model, batch, args, stage, device):
        if stage == "val":
            seen["val"] = True
        elif stage == "train" and seen["val"]:
            seen["train_after_val"] += 1
            if seen["train_after_val"] == 2:
                with open(os.environ["TSL_KILL_STAMP"], "w") as f:
                    f.write(str(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
        return forward(model, batch, args, stage, device)
    exp.forward.forward = killed_in_epoch_2  # before exp.exp_forecast imports it
'''


def _assert_same_weights(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("model", ["TimerXL", "PatchTST"])
def test_resumed_run_ends_bit_exactly_where_the_uninterrupted_run_does(tmp_path, model):
    """On 1 GPU with --deterministic, 1 epoch then --resume --train_epochs 3 gives exactly (==) the losses,
    metrics and best weights of an uninterrupted 3-epoch run. With dropout 0.1: its masks are keyed by the
    seed, the epoch and each window's position in the epoch's order (layers.dropout), not drawn from the CUDA
    generator, so what the resume must restore for them is last.pth's epoch (and the order it gives); the
    generators' states are restored too (for model files that draw from them), and are checked to be saved."""
    argv = [*model_args(model), "--lradj", "constant", "--deterministic", "--dropout", 0.1]  # constant: no
    # schedule reads train_epochs
    assert_ok(run_gpu(tmp_path / "straight", *argv, "--train_epochs", 3))
    assert_ok(run_gpu(tmp_path / "split", *argv, "--train_epochs", 1))
    last = next((tmp_path / "split" / "checkpoints").rglob("last.pth"))
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert saved["epoch"] == 1 and len(saved["rng"]) == 1 and "cuda" in saved["rng"][0], (saved["epoch"], saved["rng"])
    proc = run_gpu(tmp_path / "split", *argv, "--train_epochs", 3, "--resume")
    assert_ok(proc)
    assert "resumed from" in proc.stdout and "after epoch 1" in proc.stdout, proc.stdout[-3000:]
    reference, resumed = metrics_json(tmp_path / "straight"), metrics_json(tmp_path / "split")
    assert [h["epoch"] for h in resumed["history"]] == [1, 2, 3]
    assert_same_run(resumed, reference, exact=True)
    setting = reference["setting"]
    _assert_same_weights(checkpoint_state(tmp_path / "split", setting), checkpoint_state(tmp_path / "straight", setting))


@pytest.mark.gpus(2)
def test_sigkilled_gpu_worker_is_restarted_and_resumes_bit_exactly(tmp_path):
    """Under utils.launch --max_restarts 1 on 2 GPUs, a worker SIGKILLed in epoch 2 is restarted, resumes from
    last.pth after epoch 1 and ends exactly (==, --deterministic) where the uninterrupted 2-GPU run does."""
    argv = [*model_args("TimerXL"), "--train_epochs", 3, "--deterministic"]
    straight = launch(tmp_path / "straight", *argv, nproc=2, max_restarts=1)
    assert_ok(straight)
    reference = metrics_json(tmp_path / "straight")
    assert reference["world_size"] == 2

    stamp = tmp_path / "killed_at"
    proc = launch(tmp_path / "killed", *argv, nproc=2, max_restarts=1,
                  extra_env=injected(tmp_path / "inject", KILL, TSL_KILL_STAMP=stamp))
    assert_ok(proc)
    assert stamp.is_file(), "the injected kill never fired"
    output = proc.stdout + proc.stderr
    assert "resumed from" in output and "after epoch 1" in output, output[-3000:]
    result = metrics_json(tmp_path / "killed")
    assert result["world_size"] == 2
    assert_same_run(result, reference, exact=True)
    setting = reference["setting"]
    _assert_same_weights(checkpoint_state(tmp_path / "killed", setting),
                         checkpoint_state(tmp_path / "straight", setting))
