"""Step-based training: --train_steps ends a run after N optimizer steps, --eval_steps validates
between epoch ends, --save_steps writes last.pth mid-epoch and a run preempted there resumes to the
uninterrupted run's numbers bit for bit, --log_steps writes the global train loss to the log,
steps.csv and TensorBoard; a training state that cannot be written stops every rank with one line."""
import csv
import sys

import pytest

from helpers import SMALL_TIMERXL, assert_ok, records, run_cli, run_on_ranks

# TimerXL with dropout: a resume that restored no generator would draw other masks. 1500 rows give 931
# training windows: 30 steps per epoch at a global batch of 32 (1 x 32, or 2 processes x 8 x 2 accumulation).
TIMERXL = [*SMALL_TIMERXL, "--synthetic_rows", 1500, "--input_token_len", 24, "--output_token_len", 24,
           "--dropout", 0.1, "--lradj", "TST", "--learning_rate", 0.003, "--clip_grad", 0.5, "--warmup_steps", 4]
STEPS = ["--train_steps", 40, "--eval_steps", 12, "--log_steps", 4]


def _steps_csv(folder):
    with open(next((folder / "results").glob("*/steps.csv")), newline="") as f:
        return [{k: v for k, v in row.items() if k != "samples_per_s"} for row in csv.DictReader(f)]


def _without_timings(record):
    return [{k: v for k, v in h.items() if k != "seconds"} for h in record["history"]]


@pytest.mark.parametrize("nproc, extra, preempt_at, saved", [
    (None, [], 19, 15),  # killed as step 19 starts: last.pth holds step 15, mid-epoch 1
    (2, ["--batch_size", 8, "--accumulation_steps", 2], 36, 35),  # step 35, mid-epoch 2
])
def test_a_run_preempted_mid_epoch_resumes_bit_for_bit(tmp_path, nproc, extra, preempt_at, saved):
    argv = [*TIMERXL, *STEPS, *extra, "--save_steps", 5]
    assert_ok(run_cli(tmp_path / "straight", *argv, nproc=nproc))
    reference = records(tmp_path / "straight")[-1]

    broken = tmp_path / "broken"
    killed = run_cli(broken, *argv, nproc=nproc, preempt_at_step=preempt_at)
    assert killed.returncode != 0 and not (broken / "results" / "results.jsonl").exists()
    proc = run_cli(broken, *argv, "--resume", nproc=nproc)
    assert_ok(proc)
    assert "resumed from" in proc.stdout and f"at step {saved} (in epoch" in proc.stdout, proc.stdout
    resumed = records(broken)[-1]
    assert _without_timings(resumed) == _without_timings(reference)  # every loss, exactly
    for key in ("mse", "mae", "rmse", "mape", "mspe", "vali_loss", "stopped_step"):
        assert resumed[key] == reference[key], key
    assert _steps_csv(broken) == _steps_csv(tmp_path / "straight")  # the log records rewritten from the save
    setting = reference["setting"]
    assert ((broken / "checkpoints" / setting / "checkpoint.pth").read_bytes()
            == (tmp_path / "straight" / "checkpoints" / setting / "checkpoint.pth").read_bytes())


def test_train_steps_and_eval_steps_set_the_run_and_its_evaluations(tmp_path):
    assert_ok(run_cli(tmp_path, *TIMERXL, *STEPS))
    record = records(tmp_path)[-1]
    history = record["history"]
    # 30 steps per epoch: evaluations at 12, 24 (epoch 1), 36 (epoch 2) and after the last step, 40
    assert [(h["step"], h["epoch"], h.get("partial_epoch", False)) for h in history] == [
        (12, 1, True), (24, 1, True), (36, 2, True), (40, 2, True)]
    assert record["stopped_step"] == 40 and record["stopped_epoch"] == 2
    assert all(h["grad_norm"] > 0 for h in history)  # --clip_grad logs the norm before clipping
    rows = _steps_csv(tmp_path)
    assert [int(r["step"]) for r in rows] == list(range(4, 41, 4))
    assert [int(r["epoch"]) for r in rows] == [1] * 7 + [2] * 3
    # a log record and an evaluation over the same 4 steps (37..40) hold the same global mean
    assert float(rows[-1]["train_loss"]) == pytest.approx(history[-1]["train_loss"], rel=1e-12)
    assert float(rows[-1]["lr"]) == history[-1]["lr"]


def test_an_epoch_based_run_evaluates_at_epoch_ends_and_records_the_step(tmp_path):
    assert_ok(run_cli(tmp_path, *TIMERXL, "--train_epochs", 2))
    history = records(tmp_path)[-1]["history"]
    assert [(h["epoch"], h["step"]) for h in history] == [(1, 30), (2, 60)]
    assert not any("partial_epoch" in h for h in history)
    assert not list((tmp_path / "results").glob("*/steps.csv"))  # no --log_steps, no per-step records


def test_the_global_log_record_is_the_same_on_any_number_of_processes(tmp_path):
    """A log record is the global mean of its steps' losses: at learning rate 0 (fixed weights) and the
    same global batch (1 x 16, 2 x 8), each step takes the same 16 positions of the epoch's order, so
    each record holds the same number on 1 and 2 processes (a rank-0-only mean would not)."""
    argv = ["--synthetic_rows", 1500, "--train_steps", 3, "--log_steps", 1, "--learning_rate", 0]
    assert_ok(run_cli(tmp_path / "one", *argv, "--batch_size", 16))
    assert_ok(run_cli(tmp_path / "two", *argv, "--batch_size", 8, nproc=2))
    one, two = _steps_csv(tmp_path / "one"), _steps_csv(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two] == ["1", "2", "3"]
    for a, b in zip(one, two):
        assert float(a["train_loss"]) == pytest.approx(float(b["train_loss"]), rel=1e-6)


def test_tensorboard_gets_the_step_and_evaluation_scalars(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    assert_ok(run_cli(tmp_path, *TIMERXL, *STEPS, "--tensorboard"))
    folder = next((tmp_path / "results").glob("*/tensorboard"))
    events = event_accumulator.EventAccumulator(str(folder))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"train/loss", "train/lr", "train/grad_norm", "train/samples_per_s", "val/loss", "test/loss"} <= set(scalars)
    assert [e.step for e in events.Scalars("train/loss")] == list(range(4, 41, 4))
    assert [e.step for e in events.Scalars("val/loss")] == [12, 24, 36, 40]
    history = records(tmp_path)[-1]["history"]
    assert [e.value for e in events.Scalars("val/loss")] == pytest.approx([h["vali_loss"] for h in history], rel=1e-6)


def test_without_tensorboard_the_flag_says_how_to_get_it(monkeypatch):
    from exp.steps import tensorboard_problem

    assert tensorboard_problem() is None or "pip install tensorboard" in tensorboard_problem()
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now raises ImportError
    problem = tensorboard_problem()
    assert "--tensorboard needs the tensorboard package: pip install tensorboard" in problem
    assert "steps.csv" in problem and "\n" not in problem


def test_a_training_state_that_cannot_be_written_stops_every_rank_with_one_line(tmp_path):
    """Rank 0 cannot replace last.pth (a folder stands there): both ranks stop at the first save with
    the same line instead of rank 1 training on alone into the next all-reduce; nothing half-written."""
    argv = ["--synthetic_rows", 1500, "--train_steps", 20, "--save_steps", 3]
    assert_ok(run_cli(tmp_path / "probe", *argv, "--train_steps", 1))
    setting = records(tmp_path / "probe")[-1]["setting"]
    blocker = tmp_path / "checkpoints" / setting / "last.pth"
    blocker.mkdir(parents=True)
    proc = run_cli(tmp_path, *argv, nproc=2, timeout=120)
    assert proc.returncode == 2, proc.stderr
    line = f"cannot write the training state {blocker}"
    assert proc.stderr.count(line) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert blocker.is_dir() and not any(blocker.iterdir())
    assert not [p for p in blocker.parent.iterdir() if p.name.startswith(".tmp_")]  # no temp file left
    assert not (tmp_path / "results" / "results.jsonl").exists()


@pytest.mark.parametrize("epoch, end_of_epoch, whole", [(5, False, 4), (5, True, 5), (1, False, 0)])
def test_a_training_state_records_the_last_whole_epoch(tmp_path, epoch, end_of_epoch, whole):
    """last.pth's `epoch` is the last epoch trained to its end (a resume on another number of processes
    re-seeds from it); a save in the middle of epoch 5 has finished epoch 4, and says where it stands."""
    import torch

    from data_provider.data_factory import prepared_data
    from helpers import make_args, make_experiment
    from utils.checkpoint import TrainingState, save_training_state
    from utils.tools import EarlyStopping

    exp = make_experiment(make_args("--synthetic_rows", 1500))
    path = tmp_path / "last.pth"
    save_training_state(path, TrainingState(exp.raw_model, exp.make_optimizer(), EarlyStopping(3), epoch=epoch, step=40,
                                            windows=64, end_of_epoch=end_of_epoch), exp.args,
                        prepared_data(exp.args).content_hash())
    state = torch.load(path, weights_only=False)
    assert state["epoch"] == whole and state["position"]["epoch"] == epoch


def test_a_resume_on_as_many_processes_restores_each_ranks_running_sums(tmp_path, monkeypatch):
    """A mid-epoch resume on the world size that saved the state gives each rank back its training-loss
    sums since the last record (the next record then matches the uninterrupted run's). The sizes are
    compared by value: CPython shares one object per int up to 256 only, so an identity check would
    drop the sums on a 300-process run without a word. Emulated: 300 processes, this one rank 0."""
    import torch

    from data_provider.data_factory import prepared_data
    from exp.settings import setting_name
    from exp.steps import RunningLoss
    from helpers import make_args, make_experiment
    from utils import checkpoint, distributed
    from utils.tools import EarlyStopping

    monkeypatch.setattr(distributed, "world_size", lambda: int("300"))
    path = tmp_path / "last.pth"
    exp = make_experiment(make_args("--synthetic_rows", 1500, "--resume", str(path)))
    saved = RunningLoss("cpu")
    saved.add(torch.tensor(12.5, dtype=torch.float64), 50, 5, grad_norm=torch.tensor(3.0, dtype=torch.float64))
    checkpoint.save_training_state(path, checkpoint.TrainingState(
        exp.raw_model, exp.make_optimizer(), EarlyStopping(3), running={"train": saved}, epoch=2, step=40, windows=600,
        end_of_epoch=False), exp.args, prepared_data(exp.args).content_hash())
    assert torch.load(path, weights_only=True)["world_size"] == 300
    restored = RunningLoss("cpu")
    start = checkpoint.TrainingState(exp.raw_model, exp.make_optimizer(), EarlyStopping(3), running={"train": restored})
    checkpoint.resume(exp.args, setting_name(exp.args, 0), start, prepared_data(exp.args).content_hash())
    assert (start.epoch, start.windows) == (2, 600)
    assert restored.state_dict() == saved.state_dict()


def test_a_step_based_run_stops_early_at_the_evaluation_step_and_says_so(tmp_path):
    """Early stopping counts evaluations, not epochs, under --eval_steps: at learning rate 0 the validation
    loss never improves after the first evaluation, so patience 1 stops at the second (step 24)."""
    proc = run_cli(tmp_path, *TIMERXL, *STEPS, "--learning_rate", 0, "--patience", 1)
    assert_ok(proc)
    record = records(tmp_path)[-1]
    assert record["stopped_step"] == 24 and [h["step"] for h in record["history"]] == [12, 24]
    assert "early stopping after step 24" in proc.stdout


def test_a_resume_keeps_the_log_record_of_its_save_step(tmp_path):
    """steps.csv is cut back to the saved step inclusive: saving and logging every 4 steps, a run killed
    as step 10 starts resumes from step 8, whose row (written before the save) must stay."""
    argv = ["--synthetic_rows", 1500, "--train_steps", 12, "--save_steps", 4, "--log_steps", 4]
    assert_ok(run_cli(tmp_path / "straight", *argv))
    killed = run_cli(tmp_path, *argv, preempt_at_step=10)
    assert killed.returncode != 0
    assert [r["step"] for r in _steps_csv(tmp_path)] == ["4", "8"]
    proc = run_cli(tmp_path, *argv, "--resume")
    assert_ok(proc)
    assert "at step 8 (in epoch" in proc.stdout, proc.stdout
    assert [r["step"] for r in _steps_csv(tmp_path)] == ["4", "8", "12"]
    assert _steps_csv(tmp_path) == _steps_csv(tmp_path / "straight")


def test_tst_spans_the_train_steps_as_torchs_one_cycle_does(tmp_path):
    """--lradj TST over a --train_steps run is torch's OneCycleLR over those steps (pct_start 0.2): the
    warm-up peaks at step 8 of 40 and the last step takes the floor, base / 25 / 1e4."""
    import torch

    base, steps = 0.01, 40
    assert_ok(run_cli(tmp_path, "--synthetic_rows", 1500, "--train_steps", steps, "--log_steps", 1,
                      "--lradj", "TST", "--learning_rate", base))
    logged = [float(r["lr"]) for r in _steps_csv(tmp_path)]
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=base, total_steps=steps, pct_start=0.2,
                                                    cycle_momentum=False)
    expected = []
    for _ in range(steps):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        one_cycle.step()
    assert logged == pytest.approx(expected, rel=1e-9)
    assert max(logged) == pytest.approx(base, rel=1e-12) and logged.index(max(logged)) == 7  # step 8
    assert logged[-1] == pytest.approx(base / 25 / 1e4, rel=1e-9)


def _global_record_of_uneven_parts(rank, world):
    """Rank r's part of one step: 1 element of loss 100, 99 elements of loss 1, nothing (an empty part)."""
    import torch

    from exp.steps import RunningLoss

    part = {0: (100.0, 1), 1: (99.0, 99), 2: (0.0, 0)}[rank]
    running = RunningLoss("cpu")
    running.add(torch.tensor(part[0], dtype=torch.float64), part[1], samples=part[1])
    return running.global_record()[0]


def test_the_logged_train_loss_weighs_every_element_not_every_rank():
    """A step whose global batch splits unevenly (parts of 1, 99 and 0 elements, very different losses):
    the record is the mean over the 100 elements, 1.99, on every rank; a mean of the ranks' means says
    33.7 (50.5 leaving the empty part out, nan dividing by its 0)."""
    assert run_on_ranks(_global_record_of_uneven_parts, 3) == [pytest.approx(1.99, rel=1e-12)] * 3
