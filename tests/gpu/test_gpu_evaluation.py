"""Evaluation on GPUs does not depend on how many there are: one checkpoint scored on 1, 2 and every
visible GPU gives the same metrics and the same per-window errors."""
import numpy as np
import pytest
import torch

from gpu_helpers import MODEL_NAMES, METRIC_KEYS, metrics_json, model_args, run_gpu, window_errors
from helpers import assert_ok


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory):
    """checkpoint.pth of a model trained once (1 epoch, 1 GPU), shared by this module's tests."""
    cache = {}

    def checkpoint(model):
        if model not in cache:
            folder = tmp_path_factory.mktemp(f"train_{model}")
            assert_ok(run_gpu(folder, *model_args(model), "--train_epochs", 1))
            setting = metrics_json(folder)["setting"]
            cache[model] = folder / "checkpoints" / setting / "checkpoint.pth"
            assert cache[model].is_file()
        return cache[model]

    return checkpoint


def _world_sizes():
    return sorted({1, 2, torch.cuda.device_count()})


@pytest.mark.gpus(2)
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "nondeterministic"])
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_one_checkpoint_scores_the_same_on_any_number_of_gpus(tmp_path, trained_checkpoint, model, deterministic):
    """One checkpoint evaluated (--is_training 0, one window per batch) on 1, 2 and all visible GPUs gives the
    same metrics (float64 sums in another order: rel 1e-9) and the same window_errors.csv (identical with
    --deterministic; rtol 1e-6 without, for the metrics too)."""
    checkpoint = trained_checkpoint(model)
    flags = ["--deterministic"] if deterministic else []
    runs = {}
    for n in _world_sizes():
        folder = tmp_path / f"{n}_gpus"
        proc = run_gpu(folder, *model_args(model), "--is_training", 0, "--checkpoint", checkpoint,
                       "--eval_batch_size", 1, *flags, nproc=None if n == 1 else n)
        assert_ok(proc)
        record = metrics_json(folder)
        assert record["world_size"] == n
        assert record["args"]["deterministic"] is deterministic
        runs[n] = record, window_errors(folder, record["setting"])
    reference, reference_windows = runs[1]
    assert len(reference_windows) == reference["test_windows"] > 0
    for n, (record, windows) in runs.items():
        assert record["test_windows"] == reference["test_windows"], n
        for key in METRIC_KEYS:  # without --deterministic the windows' own float32 sums may round otherwise
            assert record[key] == pytest.approx(reference[key], rel=1e-9 if deterministic else 1e-6), f"{n} GPUs: {key}"
        assert windows.shape == reference_windows.shape, n
        np.testing.assert_array_equal(windows[:, 0], reference_windows[:, 0])  # every window, in test order
        if deterministic:
            np.testing.assert_array_equal(windows, reference_windows, err_msg=f"{n} GPUs")
        else:
            assert np.allclose(windows, reference_windows, rtol=1e-6), \
                f"{n} GPUs: largest gap {np.abs(windows - reference_windows).max():.3g}"
