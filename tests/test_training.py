"""DDP training behaviour: agreed early stopping, checkpoints, recorded results."""
import json

import pytest
import torch

from helpers import assert_ok, make_args, make_experiment, records, run_cli, run_on_ranks


@pytest.mark.parametrize("nproc", [2, 3])
def test_forced_early_stop_ends_every_rank_at_the_same_epoch(tmp_path, nproc):
    # lr 0: the validation loss never improves after epoch 1, so patience 1 stops at epoch 2.
    proc = run_cli(tmp_path, "--learning_rate", 0, "--patience", 1, "--train_epochs", 6, "--ddp",
                   nproc=nproc, timeout=120)
    assert_ok(proc)
    record = records(tmp_path)[-1]
    assert record["stopped_epoch"] == 2 and len(record["history"]) == 2
    assert "early stopping after epoch 2" in proc.stdout
    assert proc.stdout.count("early stopping") == 1  # only rank 0 prints


def test_ddp_checkpoint_loads_strictly_into_a_bare_cpu_model(tmp_path):
    assert_ok(run_cli(tmp_path, "--model", "DLinear", "--individual", "--train_epochs", 1, "--ddp", nproc=2))
    record = records(tmp_path)[-1]
    path = tmp_path / "checkpoints" / record["setting"] / "checkpoint.pth"
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state)
    from models.DLinear import Model

    args = make_args("--individual")
    args.enc_in = 7
    Model(args).load_state_dict(state, strict=True)
    assert not list(path.parent.glob(".tmp_*"))  # the atomic write left no temp file
    from exp.settings import load_trained_model  # the same model, rebuilt from the run's metrics.json alone

    model = load_trained_model(tmp_path / "results" / record["setting"] / "metrics.json")
    assert not model.training and all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_results_record_everything_needed(tmp_path):
    assert_ok(run_cli(tmp_path, "--train_epochs", 2, "--itr", 2, "--lradj", "cosine"))
    first, second = records(tmp_path)
    assert first["seed"] == 2021 and second["seed"] == 2022 and first["setting"].endswith("_0")
    for key in ("mse", "mae", "rmse", "mape", "mspe", "stopped_epoch", "world_size", "args", "history"):
        assert key in first
    assert [h["epoch"] for h in first["history"]] == [1, 2]
    assert set(first["history"][0]) == {"epoch", "step", "train_loss", "vali_loss", "test_loss", "lr", "seconds"}
    assert first["history"][1]["lr"] == pytest.approx(0.5e-4)  # cosine over 2 epochs
    on_disk = json.loads((tmp_path / "results" / first["setting"] / "metrics.json").read_text())
    assert on_disk["mse"] == first["mse"] and on_disk["args"]["model"] == "DLinear"


@pytest.mark.parametrize("lradj, expected", [
    ("type1", [1e-3, 1e-3, 5e-4, 2.5e-4]),
    ("constant", [1e-3] * 4),
    ("cosine", [1e-3, 8.535533905932737e-4, 5e-4, 1.4644660940672628e-4]),
])
def test_learning_rate_schedules(lradj, expected):
    from utils.tools import learning_rate_for_epoch

    args = make_args("--lradj", lradj, "--learning_rate", 1e-3, "--train_epochs", 4)
    assert [learning_rate_for_epoch(args, e) for e in (1, 2, 3, 4)] == pytest.approx(expected)


# DLinear at a learning rate this high overshoots: validation is best at epoch 1 and worse after it
OVERSHOOT = ["--synthetic_rows", 1500, "--learning_rate", 0.05, "--lradj", "constant"]


def test_the_final_test_scores_the_best_epoch_not_the_last(tmp_path):
    assert_ok(run_cli(tmp_path, *OVERSHOOT, "--train_epochs", 3, "--patience", 5))
    record = records(tmp_path)[-1]
    vali = [epoch["vali_loss"] for epoch in record["history"]]
    best = vali.index(min(vali))
    assert best < len(vali) - 1, f"the test needs a last epoch worse than the best: {vali}"
    # the test ran on the best epoch's weights: its validation and test losses are that epoch's
    assert record["vali_loss"] == pytest.approx(vali[best], rel=1e-12)
    assert record["mse"] == pytest.approx(record["history"][best]["test_loss"], rel=1e-12)


def _train_order(rank, world, tmp, argv):
    """Every training batch's window starts, epoch by epoch, as the training loop draws them."""
    from exp.exp_forecast import Exp_Forecast

    args = make_args(*argv, "--checkpoints", tmp / "ck", "--results_dir", tmp / "res", "--no_plots")
    exp = make_experiment(args)
    seen, train_step = [], Exp_Forecast.train_step

    def spy(self, micro_batches, optimizer):
        seen.extend(batch[0][:, 0, 0].tolist() for batch in micro_batches)  # x's first value names the window
        return train_step(self, micro_batches, optimizer)

    Exp_Forecast.train_step = spy
    try:
        exp.train("order")
    finally:
        Exp_Forecast.train_step = train_step
    return seen


@pytest.mark.parametrize("world", [1, 2])
def test_every_epoch_draws_a_new_order_of_the_same_windows(tmp_path, world):
    argv = ["--synthetic_rows", 1500, "--train_epochs", 2, "--batch_size", 64, *(["--ddp"] if world > 1 else [])]
    epochs = [[], []]  # every rank's windows, epoch by epoch
    for rank, batches in enumerate(run_on_ranks(_train_order, world, tmp_path / str(world), argv)):
        half = len(batches) // 2
        assert batches[:half] != batches[half:], f"rank {rank}: epoch 2 repeated epoch 1's order"
        for epoch, part in zip(epochs, (batches[:half], batches[half:])):
            epoch.extend(v for batch in part for v in batch)
    # together the ranks see every window each epoch exactly once: nothing padded, nothing left out
    assert len(epochs[0]) == len(set(epochs[0])) == len(set(epochs[1])) == len(epochs[1])
    assert set(epochs[0]) == set(epochs[1])


def _stop_alone(rank, world, tmp):
    """Rank 1 alone decides to stop after epoch 1 (as a rank holding another loss would)."""
    from utils import tools

    args = make_args("--synthetic_rows", 1500, "--train_epochs", 3, "--patience", 10, "--ddp",
                     "--checkpoints", tmp / "ck", "--results_dir", tmp / "res", "--no_plots")
    exp = make_experiment(args)
    if rank == 1:
        tools.EarlyStopping.should_stop = property(lambda self: True)
    return len(exp.train("alone")["history"])


def test_a_rank_that_decides_to_stop_alone_stops_every_rank():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:  # no hang: each rank trains exactly one epoch
        assert run_on_ranks(_stop_alone, 2, Path(tmp), timeout=90) == [1, 1]


def test_an_epochs_train_loss_is_the_mean_over_every_training_element(tmp_path):
    from data_provider.data_factory import data_provider

    # learning rate 0 and no dropout (DLinear): the weights never move, so the epoch's train loss is
    # the model's MSE over the whole training split, which evaluation computes independently
    args = make_args("--synthetic_rows", 1500, "--learning_rate", 0, "--train_epochs", 1, "--no_plots",
                     "--checkpoints", tmp_path / "ck", "--results_dir", tmp_path / "res")
    exp = make_experiment(args)
    result = exp.train("lr0")
    _, train_loader = data_provider(exp.args, "train")
    assert result["history"][0]["train_loss"] == pytest.approx(exp.vali(train_loader, "train"), rel=1e-6)


def test_load_trained_model_names_a_missing_or_unreadable_metrics_file(tmp_path):
    from exp.settings import load_trained_model
    from utils.errors import UserError

    (tmp_path / "cut.json").write_text('{"args": ')
    for path in (tmp_path / "none.json", tmp_path / "cut.json"):
        with pytest.raises(UserError, match="cannot read the run's arguments from .*; pass the metrics.json"):
            load_trained_model(path)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_a_non_finite_validation_loss_stops_the_run_saying_why(fp16):
    """NaN weights (a diverged run), and under fp16 AMP the likelier cause, its overflow, named."""
    from data_provider.data_factory import data_provider
    from utils.errors import UserError

    exp = make_experiment(make_args("--synthetic_rows", 1500))
    exp.args = exp.args.replace(use_amp=fp16, amp_dtype="fp16" if fp16 else "bf16")  # the message reads them
    with torch.no_grad():
        next(exp.raw_model.parameters()).fill_(float("nan"))
    loaders = [data_provider(exp.args, flag)[1] for flag in ("val", "test")]
    expected = "the fp16 forward overflowed .* use --amp_dtype bf16" if fp16 else "training diverged; lower --learning_rate"
    with pytest.raises(UserError, match=f"validation loss is nan after epoch 3: {expected}"):
        exp._epoch_losses("epoch 3", *loaders)


def test_the_evaluation_line_marks_a_new_best_and_counts_patience_otherwise():
    from exp.exp_forecast import evaluation_line
    from exp.steps import StepPlan
    from helpers import make_args
    from utils.tools import EarlyStopping

    args = make_args("--patience", 3)
    record = {"epoch": 2, "step": 20, "train_loss": 1.0, "vali_loss": 0.5, "test_loss": 0.6, "lr": 1e-4, "seconds": 1.0}
    stopper = EarlyStopping(3)
    stopper.counter = 1
    plan = StepPlan(args, steps_per_epoch=10)
    assert "*best*" in evaluation_line(args, record, 10.0, stopper, True, plan)
    line = evaluation_line(args, record, 10.0, stopper, False, plan)
    assert "*best*" not in line and "(no improvement 1/3)" in line and line.startswith("epoch 2/10: train 1.000000")


def test_without_the_test_every_epoch_training_is_the_same_and_the_test_is_scored_once(tmp_path):
    """--test_every_epoch false: the same trajectory (every train / validation loss, the final metrics to the
    last digit), no test loss in the history, the epoch line or the picture, and the test split scored once,
    at the end."""
    argv = ["--train_epochs", 3, "--synthetic_rows", 1500, "--lradj", "type1", "--dropout", 0.1, "--model",
            "PatchTST", "--d_model", 16, "--d_ff", 32, "--n_heads", 2, "--e_layers", 1]
    assert_ok(run_cli(tmp_path / "every", *argv))
    skipped = run_cli(tmp_path / "end", *argv, "--test_every_epoch", "false", plots=True)
    assert_ok(skipped)
    every, end = records(tmp_path / "every")[-1], records(tmp_path / "end")[-1]
    for key in ("train_loss", "vali_loss", "lr"):
        assert [h[key] for h in end["history"]] == [h[key] for h in every["history"]], key
    assert all(h["test_loss"] is None for h in end["history"]) and every["history"][0]["test_loss"] > 0
    for key in ("mse", "mae", "vali_loss"):
        assert end[key] == every[key], key
    epoch_lines = [line for line in skipped.stdout.splitlines() if "epoch 2/3: train" in line]
    assert epoch_lines and " vali " in epoch_lines[0] and " test " not in epoch_lines[0]
    assert (tmp_path / "end" / "results" / end["setting"] / "training_curves.png").is_file()


@pytest.mark.parametrize("loss, metric", [("MSE", "mse"), ("MAE", "mae")])
def test_the_validation_loss_is_the_training_losss_metric(loss, metric):
    """Early stopping compares the metric training minimises: MAE for --loss MAE, not the MSE."""
    from data_provider.data_factory import data_provider

    exp = make_experiment(make_args("--synthetic_rows", 1500, "--loss", loss))
    _, loader = data_provider(exp.args, "val")
    metrics = exp.evaluate(loader, "val").metrics()
    assert exp.vali(loader) == metrics[metric] and metrics["mse"] != metrics["mae"]


def test_early_stopping_counts_evaluations_since_the_last_improvement():
    """Patience 2: an improvement resets the count, so improve, worse, improve, worse, worse stops at the
    fifth evaluation (two in a row without a new best), not the fourth (three without one in all)."""
    from utils.tools import EarlyStopping

    stopper = EarlyStopping(2)
    seen = []
    for loss in (1.0, 1.5, 0.8, 0.9, 0.95):
        seen.append((stopper.step(loss), stopper.counter, stopper.should_stop))
    assert seen == [(True, 0, False), (False, 1, False), (True, 0, False), (False, 1, False), (False, 2, True)]
    assert stopper.best_loss == 0.8
