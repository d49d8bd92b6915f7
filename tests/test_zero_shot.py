"""Zero-shot evaluation (issue 23, item 6): `--is_training 0 --pretrain_model_path FILE` evaluates pre-trained
weights on another data set without training (OpenLTM's test-only flow, TSLib's zero_shot_forecast), rolled
out to any --test_pred_len, and exactly: 1 and 2 processes report the same metrics. What this codebase does
not do is refused in one line (TSLib's other tasks: the bad-input catalogue, tests/bad_inputs.py)."""
import numpy as np
import pandas as pd
import pytest
import torch

from exp.settings import build_model, resolve_args
from helpers import SMALL_TIMERXL, assert_ok, make_args, records, run_cli
from utils.errors import UserError

TOKENS = ["--seq_len", 48, "--input_token_len", 24, "--output_token_len", 24, "--num_threads", 1]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A TimerXL pre-trained a few steps on a univariate corpus (two series of one file): its checkpoint."""
    folder = tmp_path_factory.mktemp("corpus")
    steps = np.arange(2000)
    pd.DataFrame({"a": np.sin(steps / 9.0), "b": np.cos(steps / 5.0)}).to_csv(folder / "series.csv", index=False)
    assert_ok(run_cli(folder, *SMALL_TIMERXL, *TOKENS, "--data", "univariate", "--root_path", folder,
                      "--data_path", "*.csv", "--features", "S", "--train_steps", 6, "--model_id", "pretrain"))
    return folder / "checkpoints" / records(folder)[-1]["setting"] / "checkpoint.pth"


@pytest.mark.parametrize("horizon", [24, 60])
def test_zero_shot_is_exact_on_1_and_2_processes_at_every_horizon(tmp_path, pretrained, horizon):
    """Seven channels of the built-in data the model never saw, rolled out to `horizon` steps."""
    argv = [*SMALL_TIMERXL, *TOKENS, "--data", "synthetic", "--synthetic_rows", 1500, "--is_training", 0,
            "--test_pred_len", horizon]
    outcomes = []
    for nproc in (None, 2):
        ddp = ["--ddp"] if nproc else []  # under torchrun's variables (run_cli's nproc), as torchrun starts them
        proc = run_cli(tmp_path, *argv, "--pretrain_model_path", pretrained, *ddp, nproc=nproc)
        assert_ok(proc)
        assert f"zero-shot: evaluating pre-trained weights {pretrained} on --data synthetic, untrained" in proc.stdout
        outcomes.append(records(tmp_path)[-1])
    one, two = outcomes
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["args"]["test_pred_len"] == horizon and one["args"]["enc_in"] == 7 and "history" not in one
    assert one["test_windows"] == two["test_windows"] == 300 + 48 - (48 + horizon) + 1
    for key in ("vali_loss", "mse", "mae", "rmse", "mape", "mspe"):
        assert two[key] == pytest.approx(one[key], rel=1e-6), key
    # the pre-trained weights are what was scored: the same file as a --checkpoint scores the same, and
    # the untrained model (the initial weights, which a missed load would leave) scores otherwise
    assert_ok(run_cli(tmp_path, *argv, "--checkpoint", pretrained))
    assert records(tmp_path)[-1]["mse"] == pytest.approx(one["mse"], rel=1e-6)
    initial = tmp_path / "initial.pth"
    torch.manual_seed(0)  # the same initial weights whichever tests ran before in this worker
    torch.save(build_model(resolve_args(make_args(*argv), 1)).state_dict(), initial)
    assert_ok(run_cli(tmp_path, *argv, "--checkpoint", initial))
    # beyond float noise (a missed load scores the same weights twice): random weights had come within 7e-4
    assert records(tmp_path)[-1]["mse"] != pytest.approx(one["mse"], rel=1e-6)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").rglob("*.pth"))


def test_tslibs_zero_shot_task_name_runs_the_same_evaluation(tmp_path, pretrained):
    argv = [*SMALL_TIMERXL, *TOKENS, "--synthetic_rows", 1500, "--is_training", 0, "--pretrain_model_path", pretrained]
    assert_ok(run_cli(tmp_path, *argv))
    assert_ok(run_cli(tmp_path, *argv, "--task_name", "zero_shot_forecast"))
    plain, task = records(tmp_path)
    assert task["setting"].startswith("zero_shot_forecast_") and task["mse"] == pytest.approx(plain["mse"], rel=1e-6)


@pytest.mark.parametrize("task", ["long_term_forecast", "forecast"])
def test_forecasting_task_names_are_accepted(task):
    from exp.settings import check_task

    check_task(make_args("--task_name", task))


@pytest.mark.parametrize("task", ["imputation", "anomaly_detection", "classification", "short_term_forecast"])
def test_tslibs_other_tasks_are_refused_with_what_this_codebase_does(task):
    from exp.settings import resolve_args

    with pytest.raises(UserError) as refused:
        resolve_args(make_args("--task_name", task, "--data", "custom", "--data_path", "never_read.csv"), 1)
    if task == "short_term_forecast":  # done here for M4 only (docs/benchmarks.md#m4)
        assert str(refused.value).startswith("--task_name short_term_forecast forecasts M4 as TSLib does: add --data m4")
        return
    assert str(refused.value).startswith(
        f"--task_name {task} is TSLib's {task.replace('_', ' ')} task, which this codebase does not do: it does "
        "long-term forecasting (--task_name long_term_forecast, OpenLTM's forecast, or zero_shot_forecast) and M4's "
        "short-term forecasting only")


@pytest.mark.parametrize("argv, message", [
    (["--task_name", "zero_shot_forecast"], "--task_name zero_shot_forecast evaluates pre-trained weights without "
                                            "training: add --is_training 0 --pretrain_model_path FILE"),
    (["--is_training", 0, "--pretrain_model_path", "a.pth", "--checkpoint", "b.pth"],
     "--is_training 0 evaluates one set of weights, but --pretrain_model_path a.pth and --checkpoint b.pth each"),
    (["--task_name", "forecasting"], "unknown --task_name 'forecasting'"),
    (["--test_pred_len", 192], "--test_pred_len 192: DLinear forecasts --pred_len (96) steps in one pass"),
])
def test_evaluation_arguments_that_contradict_each_other_are_refused(argv, message):
    from exp.settings import resolve_args

    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_args(make_args("--synthetic_rows", 1500, *argv), 1)


def test_do_predict_rolls_a_token_model_out_to_the_test_horizon(tmp_path):
    """--do_predict with a token model forecasts --test_pred_len rows (48) past the data, from the last
    test_seq_len rows: not the training window's output_token_len (24)."""
    from exp.outputs import predict
    from helpers import make_experiment

    args = make_args(*SMALL_TIMERXL, *TOKENS, "--synthetic_rows", 1500, "--test_pred_len", 48,
                     "--results_dir", tmp_path, "--no_plots")
    frame = predict(make_experiment(args), "tokens")
    written = pd.read_csv(tmp_path / "tokens" / "forecast.csv")
    assert len(written) == len(frame) == 48 and written.shape[1] == 1 + 7  # the date, seven channels
    assert np.isfinite(written.iloc[:, 1:].to_numpy()).all()


def test_a_batchnorm_checkpoint_evaluates_the_same_on_2_processes(tmp_path):
    """--checkpoint is read on rank 0 and sent to every rank whole, buffers included: PatchTST's BatchNorm
    running statistics are part of the model, and a rank left with its initial ones scores other numbers."""
    patchtst = ["--model", "PatchTST", "--d_model", 16, "--d_ff", 32, "--e_layers", 1, "--n_heads", 2,
                "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--synthetic_rows", 1200, "--num_threads", 1]
    assert_ok(run_cli(tmp_path / "train", *patchtst, "--train_steps", 5))
    checkpoint = tmp_path / "train" / "checkpoints" / records(tmp_path / "train")[-1]["setting"] / "checkpoint.pth"
    state = torch.load(checkpoint, weights_only=True)
    assert any(k.endswith("running_var") and not torch.allclose(v, torch.ones_like(v)) for k, v in state.items())
    outcomes = []
    for nproc in (None, 2):
        ddp = ["--ddp"] if nproc else []
        assert_ok(run_cli(tmp_path, *patchtst, "--is_training", 0, "--checkpoint", checkpoint, *ddp, nproc=nproc))
        outcomes.append(records(tmp_path)[-1])
    one, two = outcomes
    assert (one["world_size"], two["world_size"]) == (1, 2)
    for key in ("vali_loss", "mse", "mae"):
        assert two[key] == pytest.approx(one[key], rel=1e-7, abs=0), key


# ------------------------------------------------------------ a release's zero-shot run is its package's forecast
def packaged():
    """{--model: its package} of the releases that tests/test_foundation.py's table builds with their package."""
    from test_foundation import RELEASES

    return {name: row.package.split(".")[0] for name, row in RELEASES.items() if row.package}


PACKAGES = packaged()
RELEASE_SHAPE = ["--seq_len", 48, "--label_len", 0, "--pred_len", 16, "--num_threads", 1]


def demand(folder, rows=400):
    """Three non-negative channels that often sit at 0 (demand-like): a rule against negative forecasts acts on
    them, and a random release's forecast of them crosses its quantiles."""
    rng = np.random.default_rng(0)
    steps = np.arange(rows)
    values = {name: np.maximum(0.0, amp * np.sin(2 * np.pi * steps / period) + rng.normal(0, amp / 2, rows))
              for name, amp, period in (("a", 3.0, 24), ("b", 1.0, 12), ("OT", 5.0, 24))}
    frame = pd.DataFrame({"date": pd.date_range("2020-01-01", periods=rows, freq="h"), **values})
    frame.to_csv(folder / "demand.csv", index=False)
    return frame


def write_release(model, folder):
    """`model`'s release folder as the foundation contract writes it (tests/test_foundation.py's table)."""
    from test_foundation import RELEASES, released_folder

    return released_folder(RELEASES[model], folder)


def own_tests(model):
    """`model`'s own test module, beside its release: its zero_shot_quantiles is the package's forecast."""
    from test_foundation import RELEASES, own_tests

    return own_tests(RELEASES[model])


def packages_quantiles(model, release, windows, pred_len, monkeypatch):
    """The package's own pipeline on every channel of raw `windows` [B, L, C]: [B, pred_len, C, levels]."""
    return own_tests(model).zero_shot_quantiles(release, windows, pred_len, monkeypatch)


@pytest.mark.parametrize("model", list(PACKAGES))
def test_a_releases_zero_shot_scores_and_forecasts_are_its_packages_on_the_raw_series(tmp_path, model, monkeypatch):
    """run.py --is_training 0 with the release's folder, on non-negative data z-scored by --scale (the default),
    against the package's own pipeline on the same raw windows: every test metric equal to float rounding, the
    quantiles kept as the package forecasts them (not re-sorted: they cross here), the count of elements whose
    quantiles cross in metrics.json, and --do_predict's forecast.csv the package's forecast of the file's last
    rows. TimesFM 2.5's non-negativity rule only acts on the series as given."""
    pytest.importorskip(PACKAGES[model])
    from sklearn.preprocessing import StandardScaler

    from utils.metrics import ProbabilisticSums

    frame = demand(tmp_path)
    release = write_release(model, tmp_path)
    assert_ok(run_cli(tmp_path, "--model", model, "--is_training", 0, "--pretrain_model_path", release, "--data",
                      "custom", "--root_path", tmp_path, "--data_path", "demand.csv", *RELEASE_SHAPE, "--do_predict"))
    record = records(tmp_path)[-1]
    levels = record["args"]["native_quantiles"]
    seq_len, pred_len = 48, 16
    raw = frame[["a", "b", "OT"]].to_numpy()
    train, test_end = int(len(raw) * 0.7), len(raw)
    start = test_end - int(len(raw) * 0.2) - seq_len
    count = test_end - start - seq_len - pred_len + 1
    assert record["test_windows"] == count
    windows = torch.tensor(np.stack([raw[start + i:start + i + seq_len] for i in range(count)]), dtype=torch.float32)
    truth = np.stack([raw[start + i + seq_len:start + i + seq_len + pred_len] for i in range(count)])
    with torch.no_grad():
        theirs = packages_quantiles(model, release, windows, pred_len, monkeypatch).double()  # [N, P, C, L], raw
    scaler = StandardScaler().fit(raw[:train])
    mean, std = torch.tensor(scaler.mean_), torch.tensor(scaler.scale_)
    scaled = ((theirs - mean[:, None]) / std[:, None]).float().double()  # float32, as a model's output: a 0 its z-score
    true = torch.tensor(scaler.transform(truth.reshape(-1, 3)).reshape(truth.shape)).float().double()
    median = scaled[..., levels.index(0.5)]
    sums = ProbabilisticSums(levels)
    sums.update(scaled, true)
    expected = {"mse": float(((median - true) ** 2).mean()), "mae": float((median - true).abs().mean()),
                **{k: v for k, v in sums.metrics().items() if k in ("wql", "coverage_80", "smape")}}
    assert {k: record[k] for k in expected} == pytest.approx(expected, rel=2e-5), (model, expected)
    crossed = int((theirs[..., 1:] < theirs[..., :-1]).any(-1).sum())
    assert record["quantile_order"] == "as forecast"
    assert abs(record["quantiles_crossed"] - crossed) <= max(2, crossed // 1000), (record["quantiles_crossed"], crossed)
    if getattr(own_tests(model), "QUANTILES_SORTED_NON_NEGATIVE", False):  # the package sorts, and keeps >= 0
        assert crossed == 0 and float(theirs.min()) == 0.0
    else:
        assert crossed > count * pred_len  # crossing quantiles: a re-sorted forecast would score otherwise
    # --do_predict: the forecast of the file's last seq_len rows, on the original scale, every level as forecast
    forecast = pd.read_csv(tmp_path / "results" / record["setting"] / "forecast.csv")
    last = torch.tensor(raw[None, -seq_len:], dtype=torch.float32)
    with torch.no_grad():
        want = packages_quantiles(model, release, last, pred_len, monkeypatch)[0].double().numpy()  # [P, C, L]
    got = np.stack([forecast[[f"{c}_q{q:g}" for q in levels]].to_numpy() for c in ("a", "b", "OT")], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_release_on_data_scaled_series_by_series_is_refused_in_one_line_unless_unscaled(tmp_path):
    """--data univariate z-scores each series with its own training part: no one scaler to undo, so released
    weights would forecast z-scores; refused before anything is built, and --scale false runs."""
    steps = np.arange(600)
    pd.DataFrame({"a": np.abs(np.sin(steps / 9.0)), "b": np.abs(np.cos(steps / 5.0))}).to_csv(tmp_path / "s.csv",
                                                                                             index=False)
    from test_foundation import RELEASES

    model = next(name for name, row in RELEASES.items() if not row.package)  # any release: the first native one
    (tmp_path / "release").mkdir()
    argv = ["--model", model, "--is_training", 0, "--pretrain_model_path", tmp_path / "release", "--data",
            "univariate", "--root_path", tmp_path, "--data_path", "*.csv", "--features", "S", "--seq_len", 96,
            "--label_len", 0, "--pred_len", 24]
    with pytest.raises(UserError, match=f"--model {model} forecasts each series as given .* --data univariate "
                                        "z-scores every series with its own training part.*add --scale false"):
        resolve_args(make_args(*argv), 1)
    assert resolve_args(make_args(*argv, "--scale", "false"), 1).scale is False
