"""The processes of a run: every rank evaluates one model and reads one data set; workers die with
their launcher; a user error is not retried; a stopped or killed run leaves nothing behind."""
import pytest
import torch

from helpers import make_args, make_experiment, run_on_ranks

# A PatchTST small enough for CPU tests: its BatchNorm keeps running statistics per rank.
SMALL_PATCHTST = ["--model", "PatchTST", "--d_model", 16, "--d_ff", 32, "--e_layers", 1, "--n_heads", 2,
                  "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--synthetic_rows", 1200,
                  "--batch_size", 16, "--train_epochs", 1]


def output_args(folder):
    return ["--checkpoints", folder / "checkpoints", "--results_dir", folder / "results"]


def _train_patchtst(rank, world, folder):
    """One epoch of PatchTST on this rank; (history, checkpoint, whether the ranks' BatchNorm
    statistics differed before the evaluation's broadcast)."""
    from exp.settings import setting_name
    from utils import distributed

    args = make_args(*SMALL_PATCHTST, "--ddp", *output_args(folder))
    exp = make_experiment(args)
    differed = []
    broadcast = distributed.broadcast_buffers

    def watched(module):
        stats = torch.cat([b.reshape(-1) for b in module.buffers() if b.is_floating_point()])
        differed.append(any(not torch.equal(s, stats) for s in distributed.gather_objects(stats)))
        return broadcast(module)

    distributed.broadcast_buffers = watched
    training = exp.train(setting_name(args, 0))
    return training["history"], training["checkpoint"], differed


@pytest.mark.parametrize("world", [2, 3])
def test_batchnorm_ranks_validate_the_model_rank_0_saves(tmp_path, world):
    """The epoch's validation loss is the saved checkpoint's, evaluated alone on one process."""
    from data_provider.data_factory import data_provider
    from utils.checkpoint import load_weights

    history, checkpoint, differed = run_on_ranks(_train_patchtst, world, tmp_path, timeout=300)[0]
    assert differed == [True]  # each rank's last step left its own statistics: the case that matters
    args = make_args(*SMALL_PATCHTST, *output_args(tmp_path))
    exp = make_experiment(args)
    load_weights(exp.raw_model, checkpoint)
    alone = exp.vali(data_provider(args, "val")[1])
    assert history[0]["vali_loss"] == pytest.approx(alone, rel=1e-7, abs=0)
