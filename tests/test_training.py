"""DDP training behaviour: agreed early stopping, checkpoints, recorded results."""
import json

import pytest
import torch

from helpers import assert_ok, make_args, records, run_cli


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
    assert set(first["history"][0]) == {"epoch", "train_loss", "vali_loss", "test_loss", "lr", "seconds"}
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
