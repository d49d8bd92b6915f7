"""End to end: one checkpoint, evaluated with --is_training 0 under 1, 2 and 3 processes,
reports the same validation loss and test metrics (relative difference below 1e-6) and the
same per-window errors, window by window, in test order."""
import numpy as np
import pandas as pd
import pytest

from helpers import ETTH1, ETTH1_ARGS, SMALL_TIMERXL, assert_ok, make_args, make_experiment, records, run_cli

CASES = {
    "DLinear-ETTh1": ["--model", "DLinear", *ETTH1_ARGS, "--learning_rate", 0.005],
    "DLinear-synthetic": ["--model", "DLinear", "--features", "MS"],
    "TimerXL-synthetic": [*SMALL_TIMERXL, "--input_token_len", 24, "--output_token_len", 48, "--test_pred_len", 60],
    # TimesNet trains on its batch's periods (batch_dependent); on white noise the top_k periods differ
    # from batch to batch, so with --times_eval_periods batch this test fails (1, 2 and 3 processes
    # disagree). In evaluation it takes each window's own periods: exact at an evaluation batch of 64.
    "TimesNet-noise-window-periods": ["--model", "TimesNet", "--data", "custom", "--data_path", "noise.csv",
                                      "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--d_model", 8,
                                      "--d_ff", 8, "--e_layers", 1, "--top_k", 5, "--num_kernels", 2,
                                      "--eval_batch_size", 64],
}


@pytest.fixture(scope="module", params=list(CASES))
def trained(request, tmp_path_factory):
    if "ETTh1" in request.param and not ETTH1.exists():
        pytest.skip("ETTh1 not present")
    tmp = tmp_path_factory.mktemp(request.param)
    argv = CASES[request.param]
    if "noise.csv" in argv:
        argv = [*argv, "--root_path", write_noise(tmp)]
    assert_ok(run_cli(tmp, *argv, "--train_epochs", 1))
    record = records(tmp)[-1]
    return tmp, argv, record


def test_checkpoint_evaluates_identically_on_1_2_3_processes(trained):
    tmp, argv, train_record = trained
    checkpoint = tmp / "checkpoints" / train_record["setting"] / "checkpoint.pth"
    assert checkpoint.exists()
    evaluations, window_errors = [], []
    for nproc in (1, 2, 3):
        proc = run_cli(tmp, *argv, "--is_training", 0, "--checkpoint", checkpoint, "--ddp", nproc=nproc)
        assert_ok(proc)
        evaluations.append(records(tmp)[-1])
        assert evaluations[-1]["world_size"] == nproc
        window_errors.append(read_window_errors(tmp, evaluations[-1]))
    # the training run's own final test (same weights, 1 process) agrees too
    evaluations.append(train_record)
    reference = evaluations[0]
    for other in evaluations[1:]:
        for key in ("vali_loss", "mse", "mae", "rmse", "mape", "mspe"):
            assert other[key] == pytest.approx(reference[key], rel=1e-6), (key, other["world_size"])
        assert other["test_windows"] == reference["test_windows"]
    assert f"{reference['mse']:.6g}" == f"{evaluations[2]['mse']:.6g}"

    # Each window once, in test order, with the same errors whichever rank scored it; their
    # mean is the reported metric (every window has the same number of elements).
    single = window_errors[0]
    assert single.shape == (reference["test_windows"], 3)
    first, last = errors_computed_here(argv, checkpoint, [0, reference["test_windows"] - 1])
    np.testing.assert_allclose(single[[0, -1], 1:], [first, last], rtol=1e-5)  # rows in test order
    for other in window_errors[1:]:
        np.testing.assert_allclose(other, single, rtol=1e-6, atol=0)
    assert single[:, 1].mean() == pytest.approx(reference["mse"], rel=1e-6)
    assert single[:, 2].mean() == pytest.approx(reference["mae"], rel=1e-6)


def errors_computed_here(argv, checkpoint, windows):
    """(mse, mae) of test windows, each scored alone by the checkpoint's model in this process."""
    import torch

    from data_provider.data_factory import data_provider
    from exp.forward import forward
    from utils.checkpoint import load_weights

    exp = make_experiment(make_args(*argv, "--is_training", 0))
    load_weights(exp.raw_model, checkpoint)
    dataset, _ = data_provider(exp.args, "test")
    errors = []
    with torch.no_grad():
        for window in windows:
            pred, true = forward(exp.raw_model.eval(), dataset.__getitems__([window]), exp.args, "test", exp.device)
            errors.append([((pred - true) ** 2).mean().item(), (pred - true).abs().mean().item()])
    return errors


def write_noise(folder, rows=1200, channels=3):
    """Hourly white noise: no period stands out, so TimesNet's batch-mean spectrum picks different
    periods for different batches."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(rows, channels)), columns=[f"x{i}" for i in range(channels - 1)] + ["OT"])
    frame.insert(0, "date", pd.date_range("2020-01-01", periods=rows, freq="h"))
    frame.to_csv(folder / "noise.csv", index=False)
    return folder


def read_window_errors(tmp, record):
    path = tmp / "results" / record["setting"] / "window_errors.csv"
    assert path.read_text().splitlines()[0] == "window,mse,mae"
    return np.loadtxt(path, delimiter=",", skiprows=1)
