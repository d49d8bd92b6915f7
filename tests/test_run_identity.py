"""A run's identity (issue 19, defects 1, 2 and 11's first part): a training state continues only the run
that wrote it (--resume names every argument that differs; an elastic restart never continues an earlier
launch's last.pth), two seeds never share a setting, and two runs never write one setting at once."""
import os
import time

import pytest
import torch

from helpers import (SMALL_TIMERXL as TIMERXL, Streamed, assert_ok, free_port, kill_a_worker_before, make_args,
                     output_args as _outputs, records, run_cli, run_on_ranks, subprocess_env)

SMALL_TIMERXL = [*TIMERXL, "--input_token_len", 24, "--output_token_len", 24]
DLINEAR = ["--synthetic_rows", 1500, "--num_threads", 1]


def _error_lines(proc):
    return [line for line in proc.stderr.splitlines() if line.startswith("error: ")]


def _refused(proc, started, limit=30):
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(_error_lines(proc)) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert time.time() - started < limit, f"{time.time() - started:.0f} s"
    return _error_lines(proc)[0]


def test_every_excluded_argument_exists_in_its_group():
    from utils.arguments import group_names
    from utils.checkpoint import IDENTITY_ARGS, NOT_IDENTITY

    for group, names in NOT_IDENTITY.items():
        assert set(names) <= set(group_names(group)), group
    for name in ("seed", "learning_rate", "lradj", "lr_scaling", "batch_size", "accumulation_steps", "train_epochs",
                 "patience", "loss", "weight_decay", "subset_rand_ratio", "use_amp", "data", "data_path", "d_model"):
        assert name in IDENTITY_ARGS, name


# ---------------------------------------------------------------- --resume
def test_resume_refuses_another_seed_or_learning_rate_in_one_line(tmp_path):
    assert_ok(run_cli(tmp_path, *DLINEAR, "--train_epochs", 1))
    last = tmp_path / "checkpoints" / records(tmp_path)[-1]["setting"] / "last.pth"
    before = last.read_bytes()
    started = time.time()
    proc = run_cli(tmp_path, *DLINEAR, "--train_epochs", 2, "--resume", last, "--seed", 2022,
                   "--learning_rate", 1e-3)
    line = _refused(proc, started)
    assert line.startswith(f"error: cannot resume from {last}: it is another run's training state: ")
    assert "seed (saved 2021, now 2022)" in line and "learning_rate (saved 0.0001, now 0.001)" in line
    assert "data_content_hash (saved '" in line  # the built-in series follows --seed: other data
    # the same setting's --resume with another learning rate alone
    started = time.time()
    proc = run_cli(tmp_path, *DLINEAR, "--train_epochs", 2, "--resume", "--learning_rate", 1e-3)
    assert "learning_rate (saved 0.0001, now 0.001). Use the same arguments" in _refused(proc, started)
    assert last.read_bytes() == before
    assert len(records(tmp_path)) == 1


def test_a_longer_run_may_continue_a_shorter_one_unless_the_schedule_reads_the_length(tmp_path):
    assert_ok(run_cli(tmp_path, *DLINEAR, "--train_epochs", 1, "--lradj", "cosine"))
    started = time.time()
    proc = run_cli(tmp_path, *DLINEAR, "--train_epochs", 2, "--lradj", "cosine", "--resume")
    assert "train_epochs (saved 1, now 2)" in _refused(proc, started)


def test_resume_refuses_another_validation_subset(tmp_path):
    """--val_windows picks the windows early stopping reads: a run that validated on 40 continues only on 40."""
    assert_ok(run_cli(tmp_path, *DLINEAR, "--train_epochs", 1, "--val_windows", 40))
    started = time.time()
    proc = run_cli(tmp_path, *DLINEAR, "--train_epochs", 1, "--resume")
    assert "val_windows (saved 40, now 0)" in _refused(proc, started)


def test_resume_of_a_training_state_of_a_newer_torch_says_so_and_keeps_it(tmp_path):
    """A last.pth whose format version is past this torch's: one line saying a newer PyTorch wrote it (it was
    'truncated or corrupt ...; delete it to start over': advice that loses a good run)."""
    from test_openltm_checkpoints import with_format_version

    assert_ok(run_cli(tmp_path, *DLINEAR, "--train_epochs", 1))
    last = tmp_path / "checkpoints" / records(tmp_path)[-1]["setting"] / "last.pth"
    before = with_format_version(last, 11).read_bytes()
    started = time.time()
    line = _refused(run_cli(tmp_path, *DLINEAR, "--train_epochs", 2, "--resume"), started)
    assert line.startswith(f"error: cannot read training state {last}: it was written by a newer PyTorch (file format "
                           f"version 11; torch {torch.__version__} here reads up to version "), line
    assert line.endswith("upgrade PyTorch here (pip install -U torch) to resume it, or resume where it was written")
    assert "delete" not in line and "corrupt" not in line
    assert last.read_bytes() == before and len(records(tmp_path)) == 1


# ---------------------------------------------------------------- elastic restarts
def test_restart_of_a_fresh_run_never_continues_an_older_runs_state(tmp_path):
    """An older run (lr 1e-4) left last.pth in the folder; a fresh run (lr 1e-3) of the same setting
    loses a worker in epoch 1, before it saved anything: its restart starts from epoch 1."""
    argv = [*SMALL_TIMERXL, "--synthetic_rows", 12000, "--seed", 7, "--train_epochs", 2, "--no_plots"]
    env = dict(subprocess_env(), MODEL="TimerXL", MAX_RESTARTS="1", NPROC_PER_NODE="2")
    older_states = {}

    def start(attempt):  # each attempt in a folder of its own, the older run's last.pth in it
        # the older run: 2 workers forked warm, with the run id ddp_forecast.sh's launches share (--rdzv_id
        # tsl-ddp), so only the launch's agent tells the two runs apart
        assert_ok(run_cli(tmp_path / str(attempt), *argv, "--ddp", "--train_epochs", 1, "--learning_rate", 1e-4,
                          nproc=2, extra_env=dict(TORCHELASTIC_RUN_ID="tsl-ddp")))
        older_states[attempt] = last_of(attempt).read_bytes()
        outputs = [*map(str, argv), *map(str, _outputs(tmp_path / str(attempt)))]
        return Streamed(["bash", "scripts/ddp_forecast.sh", *outputs, "--learning_rate", "1e-3"],
                        env=dict(env, MASTER_PORT=str(free_port())))

    def last_of(attempt):
        return tmp_path / str(attempt) / "checkpoints" / records(tmp_path / str(attempt))[-1]["setting"] / "last.pth"

    # killed at a progress line of epoch 1 (a quarter in), while last.pth is still the older run's
    fresh, attempt = kill_a_worker_before(start, "  epoch 1: ",
                                          lambda attempt: last_of(attempt).read_bytes() == older_states[attempt])
    folder, last = tmp_path / str(attempt), last_of(attempt)
    code, output = fresh.finish()
    assert code == 0, output[-3000:]
    assert "elastic restart: " in output and "starting from epoch 1" in output
    assert "resumed from" not in output
    record = records(folder)[-1]
    assert record["args"]["learning_rate"] == 1e-3 and record["seed"] == 7
    assert [h["epoch"] for h in record["history"]] == [1, 2]
    assert record["history"][0]["lr"] == pytest.approx(1e-3)  # its own epoch 1, not the older run's 1e-4
    state = torch.load(last, weights_only=True)
    assert state["identity"]["learning_rate"] == 1e-3 and state["epoch"] == 2


# ---------------------------------------------------------------- seeds and settings
def test_two_seeds_get_two_settings(tmp_path):
    from exp.settings import setting_name

    args = make_args()
    args.autoregressive = False
    first = setting_name(args, 0)
    args.seed = 2022
    assert setting_name(args, 0) != first and first.endswith("_exp_seed2021_0")
    for seed in (1, 2):
        assert_ok(run_cli(tmp_path, *DLINEAR, "--train_epochs", 1, "--seed", seed))
    one, two = records(tmp_path)
    assert one["setting"] != two["setting"]
    for record in (one, two):
        assert (tmp_path / "checkpoints" / record["setting"] / "checkpoint.pth").is_file()
        metrics = (tmp_path / "results" / record["setting"] / "metrics.json").read_text()
        assert f'"seed": {record["seed"]}' in metrics


def test_a_second_run_on_a_locked_setting_refuses_naming_the_first(tmp_path):
    from exp.settings import setting_name
    from utils.checkpoint import setting_lock

    args = make_args(*DLINEAR, *_outputs(tmp_path))
    args.autoregressive = False
    setting = setting_name(args, 0)
    with setting_lock(args, setting):  # this process is "the first run"
        holder = (tmp_path / "checkpoints" / setting / ".lock").read_text()
        assert holder.startswith(f"pid {os.getpid()} on ")
        started = time.time()
        proc = run_cli(tmp_path, *DLINEAR, "--train_epochs", 1, "--ddp", nproc=2)
        line = _refused(proc, started, limit=60)
        assert f"setting {setting} is in use by another run ({holder.strip()})" in line
        assert sorted(p.name for p in (tmp_path / "checkpoints" / setting).iterdir()) == [".lock"]
    assert not (tmp_path / "checkpoints" / setting).exists()  # the lock leaves nothing behind
    assert not (tmp_path / "results" / "results.jsonl").exists()


def test_a_dead_runs_lock_file_does_not_block(tmp_path):
    args = make_args(*DLINEAR, *_outputs(tmp_path))
    args.autoregressive = False
    from exp.settings import setting_name

    folder = tmp_path / "checkpoints" / setting_name(args, 0)
    folder.mkdir(parents=True)
    (folder / ".lock").write_text("pid 999999 on nowhere, started long ago\n")  # its process is gone
    assert_ok(run_cli(tmp_path, *DLINEAR, "--train_epochs", 1))
    assert not (folder / ".lock").exists() and (folder / "checkpoint.pth").is_file()


def _sha256(path):
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_weights_a_run_is_training_are_not_evaluated_and_every_record_names_its_weights(tmp_path):
    """--is_training 0 of a setting another run is training: one line naming that run, on every rank, nothing
    written (it scored whatever checkpoint.pth held at that moment and overwrote the setting's metrics.json). A
    copy named with --checkpoint is evaluated meanwhile. Every record names the weights it scored: the file's
    sha256 and, where last.pth beside it records them as its best, the epoch and step that saved them."""
    import shutil

    from utils.checkpoint import setting_lock

    # evaluations every 4 steps at a constant rate: the best (step 16 of 27) is not the last
    assert_ok(run_cli(tmp_path, *DLINEAR, "--train_epochs", 1, "--eval_steps", 4, "--learning_rate", 0.01,
                      "--lradj", "constant"))
    trained = records(tmp_path)[-1]
    folder = tmp_path / "checkpoints" / trained["setting"]
    best, lowest = None, float("inf")
    for evaluation in trained["history"]:  # the last new best: what checkpoint.pth holds
        if evaluation["vali_loss"] < lowest:
            best, lowest = evaluation, evaluation["vali_loss"]
    assert best["step"] < trained["history"][-1]["step"]
    weights = str(folder / "checkpoint.pth")
    assert trained["weights"] == {"path": weights, "file": weights, "sha256": _sha256(folder / "checkpoint.pth"),
                                  "epoch": best["epoch"], "step": best["step"]}
    metrics_json = (tmp_path / "results" / trained["setting"] / "metrics.json").read_bytes()
    args = make_args(*DLINEAR, *_outputs(tmp_path))
    with setting_lock(args, trained["setting"]):  # this process is the run training the setting again
        holder = (folder / ".lock").read_text().strip()
        started = time.time()
        line = _refused(run_cli(tmp_path, *DLINEAR, "--is_training", 0, "--ddp", nproc=2), started, limit=60)
        assert line == (f"error: cannot evaluate {weights}: a run is still training in {folder} ({holder}) and replaces "
                        "these weights as it goes; wait for it to end, or evaluate a copy of them with --checkpoint PATH")
        assert (tmp_path / "results" / trained["setting"] / "metrics.json").read_bytes() == metrics_json
        assert len(records(tmp_path)) == 1
        copy = tmp_path / "copy.pth"
        shutil.copyfile(folder / "checkpoint.pth", copy)
        assert_ok(run_cli(tmp_path, *DLINEAR, "--is_training", 0, "--checkpoint", copy))
    assert_ok(run_cli(tmp_path, *DLINEAR, "--is_training", 0))  # the run has ended: its own weights
    of_copy, of_setting = records(tmp_path)[1:]
    assert of_copy["weights"] == {**trained["weights"], "path": str(copy), "file": str(copy), "epoch": None,
                                  "step": None}  # the same bytes; nothing beside the copy says when they were saved
    assert of_setting["weights"] == trained["weights"] and of_setting["mse"] == trained["mse"]


def _save_after_the_folder_is_removed(rank, world, folder, second_run):
    """A run's rank 0 saves the best weights, its setting folder is removed (`rm -rf` of --checkpoints)
    and, with `second_run`, a second run of the setting takes it (its lock, its checkpoint.pth); then
    the first run saves again. (What every rank raised or None, what the folder holds after the first
    run left it.)"""
    import argparse
    import fcntl
    import shutil

    from utils import distributed
    from utils.checkpoint import save_best, setting_lock
    from utils.errors import UserError

    args = argparse.Namespace(checkpoints=str(folder / "checkpoints"), is_training=1)
    setting = folder / "checkpoints" / "s"
    model, stopped, other = torch.nn.Linear(3, 3), None, None
    with setting_lock(args, "s"):
        save_best(model, setting / "checkpoint.pth")
        if rank == 0:
            shutil.rmtree(folder / "checkpoints")
            if second_run:
                setting.mkdir(parents=True)
                other = os.open(setting / ".lock", os.O_RDWR | os.O_CREAT)
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.write(other, b"the second run")
                (setting / "checkpoint.pth").write_bytes(b"the second run's weights")
        distributed.barrier()
        try:
            save_best(model, setting / "checkpoint.pth")
        except UserError as error:
            stopped = str(error)
    left = sorted((p.name, p.read_bytes()) for p in setting.iterdir()) if setting.exists() else None
    if other is not None:
        os.close(other)
    return stopped, left


@pytest.mark.parametrize("second_run", [False, True])
def test_a_run_whose_setting_folder_was_removed_stops_at_its_next_save(tmp_path, second_run):
    """The lock lives in the setting's folder: once that is removed the first run's save must not re-make
    the folder, nor write beside (or over) a second run that took the setting, nor remove its lock on
    the way out. Every rank stops with the same line."""
    results = run_on_ranks(_save_after_the_folder_is_removed, 2, tmp_path, second_run)
    setting = tmp_path / "checkpoints" / "s"
    line = (f"the folder of setting s, {setting}, was removed or replaced while this run trained (its lock file "
            f"{setting / '.lock'} is gone or another run's): this run stops rather than write into another run's "
            "files; start it again (with --resume if last.pth is still there)")
    assert [stopped for stopped, _ in results] == [line, line]
    if second_run:
        assert results[0][1] == [(".lock", b"the second run"), ("checkpoint.pth", b"the second run's weights")]
    else:
        assert results[0][1] is None  # not re-made


def test_an_argument_added_since_a_state_was_saved_counts_as_its_default():
    """A last.pth from before an argument existed resumes when the argument is at its default (the
    behaviour the code had before), and is refused naming it, saved as the default, when it is not."""
    from utils.checkpoint import identity_differences

    saved = {"model": "DLinear", "moving_avg": 25}  # written before --seg_len existed
    assert identity_differences(saved, {"model": "DLinear", "moving_avg": 25, "seg_len": 96}) == []
    assert identity_differences(saved, {"model": "DLinear", "moving_avg": 25, "seg_len": 12}) == [
        "seg_len (saved 96, now 12)"]
    assert identity_differences(saved, {"model": "DLinear", "moving_avg": 13}) == ["moving_avg (saved 25, now 13)"]
