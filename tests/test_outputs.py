"""The daily loop around a run: pictures, real forecasts past the data, metrics on the
original scale (exact under DDP), and TSLib's own command lines (results tables: test_benchmarks.py)."""
import shlex
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from data_provider.synthetic import make_synthetic
from data_provider.timefeatures import future_dates
from exp.outputs import predict
from helpers import assert_ok, make_args, make_experiment, records, run_cli, write_etth1_shaped

PNG = b"\x89PNG\r\n\x1a\n"


def test_future_dates_continue_at_freq():
    assert list(future_dates("2018-06-26 19:45", "15min", 2)) == [pd.Timestamp("2018-06-26 20:00"),
                                                                   pd.Timestamp("2018-06-26 20:15")]
    assert list(future_dates("2020-01-31", "m", 3)) == list(pd.to_datetime(["2020-02-29", "2020-03-31", "2020-04-30"]))
    assert list(future_dates("2020-01-03", "b", 1)) == [pd.Timestamp("2020-01-06")]  # Friday -> Monday


OFFSET = 1000.0


@pytest.fixture(scope="module")
def offset_run(tmp_path_factory):
    """One short S run on a CSV far from zero, with pictures, --inverse and --do_predict."""
    tmp = tmp_path_factory.mktemp("offset")
    frame = make_synthetic(rows=1200, channels=3, seed=7)
    frame[["x0", "x1", "OT"]] = frame[["x0", "x1", "OT"]] * 5 + OFFSET
    frame.to_csv(tmp / "offset.csv", index=False)
    argv = ["--data", "custom", "--root_path", tmp, "--data_path", "offset.csv", "--features", "S",
            "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--train_epochs", 2, "--num_threads", 1,
            "--learning_rate", 0.01, "--inverse"]
    proc = run_cli(tmp, *argv, "--do_predict", plots=True)
    assert_ok(proc)
    return tmp, frame, argv, proc, records(tmp)[-1]


def test_do_predict_continues_the_dates_on_the_original_scale(offset_run):
    tmp, frame, _, _, record = offset_run
    forecast = pd.read_csv(tmp / "results" / record["setting"] / "forecast.csv", parse_dates=["date"])
    assert list(forecast.columns) == ["date", "OT"] and len(forecast) == 24
    last = frame["date"].iloc[-1]
    assert list(forecast["date"]) == [last + pd.Timedelta(hours=k) for k in range(1, 25)]
    level, spread = frame["OT"].iloc[-200:].mean(), frame["OT"].iloc[-200:].std()
    assert abs(forecast["OT"].mean() - level) < 2 * spread, (forecast["OT"].mean(), level)  # not ~0: un-scaled


def test_inverse_metrics_are_the_scaled_ones_times_the_scale(offset_run):
    _, frame, _, proc, record = offset_run
    train = frame["OT"].iloc[: int(len(frame) * 0.7)]
    scale = train.std(ddof=0)  # StandardScaler's scale_
    assert record["mse_orig"] == pytest.approx(record["mse"] * scale ** 2, rel=1e-4)
    assert record["mae_orig"] == pytest.approx(record["mae"] * scale, rel=1e-4)
    assert f"original scale: mse {record['mse_orig']:.6g}" in proc.stdout


def test_pictures_after_a_run_and_none_with_no_plots(offset_run):
    tmp, _, argv, _, record = offset_run
    folder = tmp / "results" / record["setting"]
    for name in ("forecast.png", "training_curves.png"):
        assert (folder / name).read_bytes()[:8] == PNG
    # The same checkpoint tested on 2 processes: --inverse metrics equal the 1-process ones exactly.
    ddp = tmp / "ddp"
    checkpoint = tmp / "checkpoints" / record["setting"] / "checkpoint.pth"
    proc = run_cli(ddp, *argv, "--is_training", 0, "--checkpoint", checkpoint, nproc=2)
    assert_ok(proc)
    again = records(ddp)[-1]
    assert again["world_size"] == 2
    for key in ("mse", "mae", "mse_orig", "mae_orig", "rmse_orig", "mape_orig"):
        assert again[key] == pytest.approx(record[key], rel=1e-9, abs=0), key
    assert not list((ddp / "results").rglob("*.png"))


def test_do_predict_on_undated_data_counts_steps_and_inverts_the_scaler(tmp_path):
    values = make_synthetic(rows=900, channels=3, seed=3).drop(columns=["date"]) * [2.0, 3.0, 4.0] + [10, -20, 30]
    values.to_csv(tmp_path / "plain.csv", index=False)

    args = make_args("--data", "custom", "--root_path", tmp_path, "--data_path", "plain.csv", "--seq_len", 48,
                     "--label_len", 24, "--pred_len", 12, "--num_threads", 1, "--results_dir", tmp_path / "results",
                     "--no_plots")
    exp = make_experiment(args)
    written = predict(exp, "undated")
    forecast = pd.read_csv(tmp_path / "results" / "undated" / "forecast.csv")
    assert list(forecast.columns) == ["step", "x0", "x1", "OT"] and list(forecast["step"]) == list(range(1, 13))
    np.testing.assert_allclose(forecast[["x0", "x1", "OT"]].to_numpy(), written[["x0", "x1", "OT"]].to_numpy(), rtol=1e-7)
    # the same forecast by hand: the model on the last 48 scaled rows, then the scaler's inverse
    from data_provider.data_factory import prepared_data

    data = prepared_data(args)
    x = torch.from_numpy(data.values[-48:])[None]
    dec = torch.cat([x[:, -24:], torch.zeros(1, 12, 3)], dim=1)
    with torch.no_grad():
        scaled = exp.raw_model.eval()(x, torch.zeros(1, 48, 0), dec, torch.zeros(1, 36, 0))[0, -12:].numpy()
    np.testing.assert_allclose(forecast[["x0", "x1", "OT"]].to_numpy(), data.scaler.inverse_transform(scaled),
                               rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------ TSLib's scripts
# The first run of thuml/Time-Series-Library scripts/long_term_forecast/ETT_script/DLinear_ETTh1.sh, verbatim.
TSLIB_DLINEAR_ETTH1 = r"""python -u run.py \
  --task_name long_term_forecast \
  --is_training 1 \
  --root_path ./dataset/ETT-small/ \
  --data_path ETTh1.csv \
  --model_id ETTh1_96_96 \
  --model $model_name \
  --data ETTh1 \
  --features M \
  --seq_len 96 \
  --label_len 48 \
  --pred_len 96 \
  --e_layers 2 \
  --d_layers 1 \
  --factor 3 \
  --enc_in 7 \
  --dec_in 7 \
  --c_out 7 \
  --des 'Exp' \
  --itr 1"""
# Arguments of TSLib's run.py for other tasks and models, which its scripts pass freely.
TSLIB_FOREIGN = ["--use_multi_gpu", "--devices", "0,1", "--p_hidden_dims", "128", "128", "--distil",
                 "--mask_rate", "0.25", "--seasonal_patterns", "Monthly"]


def test_tslib_command_line_runs_unchanged_but_for_the_data_path(tmp_path):
    write_etth1_shaped(tmp_path / "ETT-small")
    command = TSLIB_DLINEAR_ETTH1.replace("$model_name", "DLinear").replace("./dataset/ETT-small/", f"{tmp_path}/ETT-small/")
    argv = shlex.split(command.replace("\\\n", " "))[3:]  # after `python -u run.py`
    proc = run_cli(tmp_path, *argv, "--train_epochs", 1, *TSLIB_FOREIGN, "--num_threads", 1)
    assert_ok(proc)
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: ignoring arguments run.py does not use: " + " ".join(TSLIB_FOREIGN)]
    record = records(tmp_path)[-1]
    assert (record["model"], record["data"], record["pred_len"], record["args"]["enc_in"]) == ("DLinear", "ETTh1", 96, 7)
    assert record["setting"].startswith("long_term_forecast_ETTh1_96_96_DLinear_ETTh1_ftM_sl96_ll48_pl96")


def test_our_own_arguments_keep_their_checks_and_typos_get_a_hint():
    from utils.arguments import build_parser, describe_ignored, parse_args

    with pytest.raises(SystemExit):
        build_parser().parse_known_args(["--seq_len", "abc"])
    args = parse_args(["--use_gpu", "--lerning_rate", "0.1", "--seg_len", "24"])  # TSLib's bare --use_gpu too
    assert args.use_gpu is True and args.learning_rate == 1e-4
    assert describe_ignored(args.ignored_args) == "--lerning_rate 0.1 --seg_len 24 (--lerning_rate: did you mean --learning_rate?)"
    assert parse_args(["--no_use_gpu"]).use_gpu is False


def test_tslib_crosscheck_imports_the_checkout_then_gives_our_packages_back(tmp_path):
    """TSLib's packages are called models/ and layers/ like ours: the cross-check imports its
    TimesNet from the checkout, refuses a folder our package would shadow (it would compare our
    model with itself), and leaves our own modules in place afterwards."""
    from benchmarks.tslib_crosscheck import tslib_timesnet
    from utils.errors import UserError
    import models.TimesNet as ours

    checkout = tmp_path / "Time-Series-Library"
    (checkout / "models").mkdir(parents=True)
    (checkout / "models" / "TimesNet.py").write_text("WHOSE = 'theirs'\n")
    with pytest.raises(UserError, match="__init__.py"):  # a namespace folder loses to our package
        tslib_timesnet(checkout)
    (checkout / "models" / "__init__.py").write_text("")
    assert tslib_timesnet(checkout).WHOSE == "theirs"
    import models.TimesNet
    assert models.TimesNet is ours and sys.modules["models.TimesNet"] is ours
    with pytest.raises(UserError, match="no models/TimesNet.py"):
        tslib_timesnet(tmp_path)


def test_tslib_crosscheck_reads_the_checkouts_padding_and_refuses_another(tmp_path):
    """TSLib pads a period grid with zeros since fd74cbc and with the series' last steps before it: the
    cross-check reads which one a checkout does instead of trusting --padding."""
    from benchmarks.tslib_crosscheck import checkout_padding, main, tslib_timesnet
    from utils.errors import UserError

    block = """import torch
from torch import nn
class TimesBlock(nn.Module):
    def __init__(self, configs):
        super().__init__()
        self.length = configs.seq_len + configs.pred_len
        self.conv = nn.Identity()
    def forward(self, x):
        missing = -self.length % 3
        extra = torch.zeros_like(x[:, :missing]) if PADDING == "zeros" else x[:, self.length - missing:]
        return self.conv(torch.cat([x, extra], 1).reshape(len(x), -1, 3, x.shape[2]).permute(0, 3, 1, 2))
"""
    for padding in ("zeros", "tail"):
        (tmp_path / padding / "models").mkdir(parents=True)
        (tmp_path / padding / "models" / "__init__.py").write_text("")
        (tmp_path / padding / "models" / "TimesNet.py").write_text(f"PADDING = {padding!r}\n" + block)
        assert checkout_padding(tslib_timesnet(tmp_path / padding)) == padding
    with pytest.raises(UserError, match="pads period grids with tail, not zeros: pass --padding tail"):
        main(["--tslib", str(tmp_path / "tail")])  # zeros by default
    with pytest.raises(UserError, match="with zeros, not tail"):
        main(["--tslib", str(tmp_path / "zeros"), "--padding", "tail"])
