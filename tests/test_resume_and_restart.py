"""Nothing lost: a run killed mid-training and started again with --resume ends where an uninterrupted
run does; a resume with other model arguments is refused and one of a finished run trains no more; torchrun
restarts a SIGKILLed DDP worker, which resumes from last.pth."""
import os
import signal
import sys

import numpy as np
import pytest
import torch

from data_provider.data_factory import prepared_data
from helpers import (SMALL_TIMERXL as TIMERXL, Streamed, assert_ok, free_port, kill_a_worker_before,
                     output_args as _outputs, records, run_cli, subprocess_env)

SMALL_TIMERXL = [*TIMERXL, "--input_token_len", 24, "--output_token_len", 24]


def _losses(record):
    return [(h["epoch"], h["train_loss"], h["vali_loss"], h["test_loss"]) for h in record["history"]]


def _assert_same_run(a, b):
    assert [e for e, *_ in _losses(a)] == [e for e, *_ in _losses(b)]
    for x, y in zip(_losses(a), _losses(b)):
        assert x == pytest.approx(y, rel=1e-6)
    for key in ("mse", "mae", "rmse", "mape", "mspe", "vali_loss"):
        assert a[key] == pytest.approx(b[key], rel=1e-6), key


# ---------------------------------------------------------------- resume
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    argv = [*SMALL_TIMERXL, "--train_epochs", 4, "--lradj", "type1"]
    assert_ok(run_cli(tmp_path / "straight", *argv))
    reference = records(tmp_path / "straight")[-1]

    broken = tmp_path / "broken"
    run = Streamed([sys.executable, "run.py", *map(str, argv + _outputs(broken))])
    run.wait_for("epoch 2/")
    os.killpg(run.proc.pid, signal.SIGKILL)  # no chance to clean up, as in a preemption
    run.finish()
    assert not (broken / "results" / "results.jsonl").exists()
    proc = run_cli(broken, *argv, "--resume")
    assert_ok(proc)
    assert "resumed from" in proc.stdout
    _assert_same_run(records(broken)[-1], reference)


def test_resume_refuses_other_model_arguments(tmp_path):
    assert_ok(run_cli(tmp_path, "--train_epochs", 1))
    last = tmp_path / "checkpoints" / records(tmp_path)[-1]["setting"] / "last.pth"
    proc = run_cli(tmp_path, "--train_epochs", 2, "--resume", last, "--moving_avg", 13, "--individual",
                   "--times_padding", "tail")
    assert proc.returncode == 2
    assert "moving_avg (saved 25, now 13); individual (saved False, now True)" in proc.stderr
    assert "times_padding (saved 'zeros', now 'tail')" in proc.stderr


def test_resume_of_a_finished_run_trains_no_more(tmp_path):
    first_proc = run_cli(tmp_path, "--train_epochs", 2)
    assert_ok(first_proc)
    proc = run_cli(tmp_path, "--train_epochs", 2, "--resume")
    assert_ok(proc)
    assert "epoch " not in proc.stdout.replace("after epoch", "")
    first, second = records(tmp_path)
    _assert_same_run(first, second)
    # the optimizer state is measured once a run, from the loaded state when no epoch is left to train
    assert first_proc.stdout.count("optimizer state per rank") == proc.stdout.count("optimizer state per rank") == 1
    # measured as soon as it exists (after the first step), not when training ends
    assert first_proc.stdout.index("optimizer state per rank") < first_proc.stdout.index("epoch 1/")
    assert second["optimizer_state_bytes"] == first["optimizer_state_bytes"]


@pytest.mark.parametrize("before, after", [(1, 2), (2, 1)])
def test_resume_on_another_number_of_processes_warns_and_goes_on(tmp_path, before, after):
    argv = ["--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24]
    assert_ok(run_cli(tmp_path, *argv, "--train_epochs", 1, nproc=before if before > 1 else None))
    proc = run_cli(tmp_path, *argv, "--train_epochs", 2, "--resume", nproc=after if after > 1 else None)
    assert_ok(proc)
    assert f"resuming on {after} processes from a run on {before}: random streams are re-seeded" in proc.stdout
    resumed = records(tmp_path)[-1]
    assert [h["epoch"] for h in resumed["history"]] == [1, 2] and resumed["world_size"] == after


def test_a_run_without_resume_never_looks_for_a_training_state(tmp_path):
    """Only --resume and torchrun's restarts read last.pth; a plain run says nothing of one, the first
    time or beside an earlier run's."""
    for _ in range(2):
        proc = run_cli(tmp_path, "--train_epochs", 1, "--synthetic_rows", 1500)
        assert_ok(proc)
        assert "last.pth" not in proc.stdout and "restart" not in proc.stdout, proc.stdout
    assert [r["history"][0]["epoch"] for r in records(tmp_path)] == [1, 1]


# DLinear at a learning rate this high overshoots: validation goes up and down, and patience 2 stops the
# run early. Split it just before its last epoch, where the count of epochs without improvement is 1 and
# the best epoch lies behind: a resume that forgot either would train on or keep another checkpoint.
OVERSHOOT = ["--synthetic_rows", 1500, "--learning_rate", 0.05, "--lradj", "constant", "--patience", 2]


def test_resume_keeps_the_best_loss_and_the_patience_count(tmp_path):
    assert_ok(run_cli(tmp_path / "straight", *OVERSHOOT, "--train_epochs", 10))
    reference = records(tmp_path / "straight")[-1]
    vali, stop = [epoch["vali_loss"] for epoch in reference["history"]], reference["stopped_epoch"]
    split = stop - 1
    assert stop < 10 and vali.index(min(vali)) < split - 1, vali  # the case this test needs
    assert_ok(run_cli(tmp_path / "split", *OVERSHOOT, "--train_epochs", split))
    proc = run_cli(tmp_path / "split", *OVERSHOOT, "--train_epochs", 10, "--resume")
    assert_ok(proc)
    resumed = records(tmp_path / "split")[-1]
    assert resumed["stopped_epoch"] == stop  # the count went on
    _assert_same_run(resumed, reference)  # and no later epoch replaced the best one's weights
    setting = reference["setting"]
    assert ((tmp_path / "split" / "checkpoints" / setting / "checkpoint.pth").read_bytes()
            == (tmp_path / "straight" / "checkpoints" / setting / "checkpoint.pth").read_bytes())


def _on_meta(value):
    """`value` (a loaded state) with every tensor moved to the meta device: no host code can read it."""
    if torch.is_tensor(value):
        return value.to("meta")
    if isinstance(value, dict):
        return {k: _on_meta(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_meta(v) for v in value)
    return value


def test_resume_reads_the_training_state_onto_the_cpu(tmp_path, monkeypatch):
    """A GPU run read last.pth with map_location=its device: the NumPy generator's key came back as
    a CUDA tensor and `.numpy()` crashed every --resume and elastic restart, and every rank held the
    whole optimizer state on its GPU. The CPU stands in for that GPU here: a torch.load asked for any
    device but the CPU puts the tensors on `meta`, where the host cannot read them either."""
    from exp.settings import setting_name
    from helpers import make_args, make_experiment
    from utils import checkpoint
    from utils.tools import EarlyStopping

    argv = ["--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24, *_outputs(tmp_path)]
    assert_ok(run_cli(tmp_path, *argv[:-4], "--train_epochs", 1))
    args = make_args(*argv, "--resume")
    exp = make_experiment(args)
    saved = torch.load(checkpoint.checkpoint_path(args, setting_name(args, 0), "last.pth"), weights_only=True)
    real_load = torch.load

    def load_as_a_gpu_host_would(f, map_location=None, **options):
        state = real_load(f, map_location="cpu", **options)
        return state if map_location in (None, "cpu") or torch.device(map_location).type == "cpu" else _on_meta(state)

    monkeypatch.setattr(torch, "load", load_as_a_gpu_host_would)
    optimizer = exp.make_optimizer()
    start = checkpoint.TrainingState(exp.raw_model, optimizer, EarlyStopping(args.patience))
    checkpoint.resume(args, setting_name(args, 0), start, prepared_data(args).content_hash())
    assert (start.epoch, start.windows, start.step, len(start.history)) == (2, 0, saved["global_step"], 1)
    for name, value in exp.raw_model.state_dict().items():
        assert torch.equal(value, saved["model"][name]), name
    moments = [optimizer.state[p]["exp_avg"] for p in exp.raw_model.parameters()]
    assert [m.device.type for m in moments] == ["cpu"] * len(moments)
    assert torch.equal(moments[0], saved["optimizer"]["state"][0]["exp_avg"])
    assert torch.equal(torch.get_rng_state(), saved["rng"][0]["torch"])
    assert np.array_equal(np.random.get_state()[1], saved["rng"][0]["numpy"][1].numpy().astype(np.uint32))


def test_a_restart_on_a_node_with_fewer_gpus_restores_this_process_generator(monkeypatch):
    """last.pth kept every visible GPU's generator per rank and a resume set them all back, so a
    restart on a node with fewer GPUs raised IndexError. Emulated: CUDA "available" with 8 devices
    when saving and 1 when restoring; a process keeps and restores its own device's generator only."""
    from utils.tools import rng_state, set_rng_state

    gpus = {"count": 8, "restored": []}
    generator = torch.arange(16, dtype=torch.uint8)

    def set_all(states):
        if len(states) > gpus["count"]:
            raise IndexError("list index out of range")

    for name, fake in {"is_available": lambda: True, "is_initialized": lambda: True,
                       "device_count": lambda: gpus["count"], "get_rng_state": lambda device="cuda": generator,
                       "get_rng_state_all": lambda: [generator] * gpus["count"], "set_rng_state_all": set_all,
                       "set_rng_state": lambda state, device="cuda": gpus["restored"].append(state)}.items():
        monkeypatch.setattr(torch.cuda, name, fake)
    state = rng_state()
    gpus["count"] = 1
    set_rng_state(state)
    assert len(gpus["restored"]) == 1 and torch.equal(gpus["restored"][0], generator)


LAST_PTH_KEYS = {"model", "optimizer", "grad_scaler", "lr_schedule", "early_stopping", "epoch", "position",
                 "global_step", "stopped", "rng", "running", "model_args", "identity", "world_size", "launches",
                 "history", "best_weights", "shards"}


def test_a_training_state_is_saved_and_loaded_back_whole_under_last_pths_keys(tmp_path):
    """last.pth keeps the keys every earlier file has (so those files resume), and a TrainingState saved
    mid-epoch after an early stop comes back whole: weights, early stopping, history, where training stood
    and the running sums."""
    from exp.steps import RunningLoss
    from helpers import make_args, make_experiment
    from utils import checkpoint
    from utils.tools import EarlyStopping

    args = make_args("--synthetic_rows", 1500, *_outputs(tmp_path))
    exp = make_experiment(args)
    stopper, sums = EarlyStopping(3), RunningLoss("cpu")
    stopper.step(0.5), stopper.step(0.7)
    stopper.stopped = True
    sums.add(torch.tensor(2.5, dtype=torch.float64), 10, 4)
    history = [{"epoch": 2, "step": 30, "vali_loss": 0.7}]
    saved = checkpoint.TrainingState(exp.raw_model, exp.make_optimizer(), stopper, running={"since_log": sums},
                                     history=history, epoch=2, step=30, windows=96, end_of_epoch=False)
    path = tmp_path / "last.pth"
    checkpoint.save_training_state(path, saved, args, prepared_data(args).content_hash())
    assert set(torch.load(path, weights_only=True)) == LAST_PTH_KEYS
    with torch.no_grad():
        next(exp.raw_model.parameters()).add_(1.0)
    loaded = checkpoint.TrainingState(exp.raw_model, exp.make_optimizer(), EarlyStopping(3),
                                      running={"since_log": RunningLoss("cpu")})
    checkpoint.load_training_state(path, loaded, args, prepared_data(args).content_hash())
    assert (loaded.epoch, loaded.step, loaded.windows, loaded.history) == (2, 30, 96, history)
    assert (loaded.stopper.stopped, loaded.stopper.best_loss, loaded.stopper.counter) == (True, 0.5, 1)
    assert loaded.running["since_log"].state_dict() == sums.state_dict()
    weights = torch.load(path, weights_only=True)["model"]
    assert all(torch.equal(value, weights[name]) for name, value in exp.raw_model.state_dict().items())
    older = {key: value for key, value in torch.load(path, weights_only=True).items() if key != "best_weights"}
    torch.save(older, path)  # a last.pth from before the best weights were named in it still resumes
    checkpoint.load_training_state(path, loaded, args, prepared_data(args).content_hash())
    assert (loaded.epoch, loaded.step, loaded.history) == (2, 30, history)


def test_resume_keeps_the_fp16_loss_scale(tmp_path):
    """last.pth had no GradScaler state: a resumed or restarted fp16 run began again at a loss scale of
    2**16 and left the uninterrupted run's trajectory. (fp16 runs only on GPUs; the scaler's state is
    the same on the CPU.)"""
    from helpers import make_args, make_experiment
    from utils import checkpoint
    from utils.tools import EarlyStopping

    args = make_args("--synthetic_rows", 1500, *_outputs(tmp_path))
    exp = make_experiment(args)
    path = tmp_path / "last.pth"
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict({**scaler.state_dict(), "scale": 1024.0, "_growth_tracker": 7})  # as after some backoffs
    optimizer, stopper = exp.make_optimizer(), EarlyStopping(args.patience)

    data_hash = prepared_data(args).content_hash()

    def state(grad_scaler):  # a training state after step 10 of epoch 1
        return checkpoint.TrainingState(exp.raw_model, optimizer, stopper, grad_scaler, epoch=1, step=10)

    checkpoint.save_training_state(path, state(scaler), args, data_hash)
    resumed = torch.amp.GradScaler("cpu")
    checkpoint.load_training_state(path, state(resumed), args, data_hash)
    assert (resumed.get_scale(), resumed.state_dict()["_growth_tracker"]) == (1024.0, 7)
    without_amp = torch.amp.GradScaler("cpu", enabled=False)  # a bf16 or fp32 run saves and loads none
    checkpoint.save_training_state(path, state(without_amp), args, data_hash)
    assert torch.load(path, weights_only=True)["grad_scaler"] is None
    checkpoint.load_training_state(path, state(without_amp), args, data_hash)
    assert without_amp.get_scale() == 1.0  # a disabled scaler's scale, untouched


# ---------------------------------------------------------------- elastic restarts
def test_sigkilled_worker_is_restarted_and_resumes(tmp_path):
    argv = [*SMALL_TIMERXL, "--synthetic_rows", 12000, "--train_epochs", 3, "--no_plots"]
    # the uninterrupted reference: the same 2 workers, forked warm (the script's launch is what is tested)
    assert_ok(run_cli(tmp_path / "a", *argv, "--ddp", nproc=2, timeout=300))
    reference = records(tmp_path / "a")[-1]

    def start(attempt):
        env = dict(MODEL="TimerXL", MASTER_PORT=str(free_port()), MAX_RESTARTS="1", NPROC_PER_NODE="2")
        return Streamed(["bash", "scripts/ddp_forecast.sh", *map(str, argv + _outputs(tmp_path / f"b{attempt}"))],
                        env=dict(subprocess_env(), **env))

    def epoch_1_is_the_last_saved(attempt):
        last = next((tmp_path / f"b{attempt}" / "checkpoints").glob("*/last.pth"))
        return torch.load(last, weights_only=True)["epoch"] == 1

    # killed at a progress line of epoch 2: last.pth of epoch 1 exists, epoch 2's is not written
    run, attempt = kill_a_worker_before(start, "  epoch 2: ", epoch_1_is_the_last_saved)
    code, output = run.finish()
    assert code == 0, output[-3000:]
    assert "resumed from" in output and "after epoch 1" in output
    result = records(tmp_path / f"b{attempt}")[-1]
    assert result["world_size"] == 2
    _assert_same_run(result, reference)


def test_a_file_without_every_part_of_a_training_state_is_refused(tmp_path):
    """A torch file holding a dict that lacks parts of last.pth (here the generators) is named for what it is."""
    from utils.checkpoint import read_training_state
    from utils.errors import UserError

    path = tmp_path / "last.pth"
    torch.save({"model": {}, "optimizer": {}, "early_stopping": {}, "epoch": 1, "model_args": {}, "history": []}, path)
    with pytest.raises(UserError, match="is not a training state written by this codebase"):
        read_training_state(str(path))


@pytest.mark.parametrize("command", ["torchrun", "a) b) (c", ")"])
def test_a_launch_is_told_apart_by_its_agents_start_time_whatever_the_agents_name(command):
    """launch_id() tells a launch from a later one whose agent got the same pid by the agent's start time,
    field 22 of /proc/PID/stat; the name before it, in parentheses, may hold ") " itself."""
    from utils.checkpoint import start_time_field

    after_name = " ".join(["S", *(str(field) for field in range(4, 53))])  # fields 3 to 52
    assert start_time_field(f"4242 ({command}) {after_name}\n") == "22"
    assert start_time_field("4242 (torchrun) S 1 2\n") == start_time_field("no parentheses") == "?"
    with open("/proc/self/stat") as stat:
        assert start_time_field(stat.read()).isdigit()
