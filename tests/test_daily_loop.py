"""The daily loop around a run: results tables, pictures, real forecasts past the data,
metrics on the original scale (exact under DDP), and TSLib's own command lines."""
import json
import shlex
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from data_provider.synthetic import make_synthetic
from data_provider.timefeatures import future_dates
from helpers import assert_ok, make_args, records, run_cli, write_etth1_shaped
from benchmarks.drop_last_effect import main as drop_last_main
from utils.report import main as report_main

PNG = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ results table
REFERENCE = """# targets

## A. Unified protocol: input length 96

ETTh1

| model | 96 | 192 |
|---|---|---|
| DLinear | 0.386 / 0.400 | 0.437 / 0.432 |

Exchange (70/10/20 split)

| model | 96 | 192 |
|---|---|---|
| DLinear | 0.088 / 0.218 | 0.176 / 0.315 |

## B. Other settings

| model (setting) | 96 | source |
|---|---|---|
| DLinear (input 336) | 0.375 / 0.399 | paper |

## C. Timer-XL protocol: input 672, rolled out

| model | 96 | 192 |
|---|---|---|
| Timer-XL | 0.364 / 0.397 | 0.405 / 0.424 |
"""


def _record(model, data, pred_len, seed, mse, mae, **args):
    args = {"features": "M", "seq_len": 96, "data_path": "ETTh1.csv", "learning_rate": 0.0001, "batch_size": 32,
            "lradj": "type1", "des": "Exp", **args}
    return {"setting": f"{model}_{pred_len}", "model": model, "data": data, "pred_len": pred_len, "seed": seed,
            "mse": mse, "mae": mae, "world_size": 1, "args": args}


def test_report_means_over_seeds_beside_published_figures(tmp_path, capsys):
    lines = [
        _record("DLinear", "ETTh1", 96, 1, 0.50, 0.50),  # replaced by the rerun of seed 1 below
        _record("DLinear", "ETTh1", 96, 2, 0.39, 0.41, embed="timeF"),  # run.py's default --embed: the Exp row
        _record("DLinear", "ETTh1", 96, 1, 0.38, 0.40),
        _record("DLinear", "ETTh1", 192, 1, 0.44, 0.43),
        _record("DLinear", "ETTh1", 96, 1, 0.45, 0.46, learning_rate=0.005),  # another lr: a row of its own
        _record("DLinear", "ETTh1", 96, 1, 0.47, 0.48, batch_size=16, lradj="TST"),  # another recipe: the same
        _record("DLinear", "ETTh1", 96, 1, 0.42, 0.43, des="no_marks"),  # a variant tagged with --des: the same
        _record("DLinear", "ETTh1", 96, 1, 0.43, 0.44, eval_batch_size=1),  # scored in batches of 1: the same
        _record("DLinear", "ETTh1", 96, 1, 0.44, 0.45, train_drop_last=True),  # other training steps: the same
        _record("DLinear", "ETTh1", 96, 1, 0.46, 0.47, embed="none"),  # no calendar inputs: the same
        _record("DLinear", "ETTh1", 96, 1, 0.30, 0.35, features="S"),  # S: no published figure
        _record("DLinear", "custom", 96, 1, 0.09, 0.21, data_path="exchange_rate.txt.gz"),
        # token model: trained on 96, rolled out to test_pred_len 192 from test_seq_len 672 (table C)
        _record("TimerXL", "ETTh1", 96, 1, 0.41, 0.43, seq_len=672, autoregressive=True, test_seq_len=672,
                test_pred_len=192),
    ]
    nested = tmp_path / "runs" / "day1"
    nested.mkdir(parents=True)
    (nested / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    reference = tmp_path / "targets.md"
    reference.write_text(REFERENCE)

    argv = [str(tmp_path / "runs"), "--reference", str(reference)]
    assert report_main(argv + ["--format", "csv", "--out", str(tmp_path / "t.csv"), "--plot", str(tmp_path / "mse.png")]) == 0
    table = pd.read_csv(tmp_path / "t.csv")  # blank cells (no std, no published figure) read as NaN
    rows = {(r.data, r.features, r.input, r.model, r.horizon): r for r in table.itertuples()
            if (r.lr, r.batch, r.lradj, r.des) == (0.0001, 32, "type1", "Exp")}
    assert len(rows) == 5 and len(table) == 11
    other_lr = table[table.lr == 0.005]
    assert len(other_lr) == 1 and other_lr.mse.item() == pytest.approx(0.45) and other_lr.seeds.item() == 1
    other_recipe = table[table.lradj == "TST"]
    assert len(other_recipe) == 1 and other_recipe.batch.item() == 16 and other_recipe.mse.item() == pytest.approx(0.47)
    assert table[table.des == "no_marks"].mse.item() == pytest.approx(0.42)
    assert table[table.des == "Exp, eval batch 1"].mse.item() == pytest.approx(0.43)
    assert table[table.des == "Exp, train drop_last"].mse.item() == pytest.approx(0.44)
    assert table[table.des == "Exp, embed none"].mse.item() == pytest.approx(0.46)
    dl96 = rows[("ETTh1", "M", 96, "DLinear", 96)]
    assert dl96.seeds == 2 and dl96.mse == pytest.approx(0.385) and dl96.mae == pytest.approx(0.405)
    assert dl96.mse_std == pytest.approx(np.std([0.38, 0.39], ddof=1))
    assert (dl96.reference_protocol, dl96.reference_mse, dl96.reference_mae) == ("A", 0.386, 0.400)
    assert dl96.mse_vs_reference_pct == pytest.approx(100 * (0.385 - 0.386) / 0.386)
    single = rows[("ETTh1", "M", 96, "DLinear", 192)]
    assert single.seeds == 1 and np.isnan(single.mse_std) and single.reference_mse == 0.437
    assert rows[("exchange_rate", "M", 96, "DLinear", 96)].reference_mse == 0.088  # 'Exchange' caption
    assert np.isnan(rows[("ETTh1", "S", 96, "DLinear", 96)].reference_mse)
    timer = rows[("ETTh1", "M", 672, "TimerXL", 192)]
    assert (timer.reference_protocol, timer.reference_mse) == ("C", 0.405)
    assert (tmp_path / "mse.png").read_bytes()[:8] == PNG

    capsys.readouterr()
    assert report_main(argv) == 0
    markdown = capsys.readouterr().out
    assert "| ETTh1 | M | 96 | DLinear | 96 | 0.0001 | 32 | type1 | Exp | 0.3850 ± 0.0071 | 0.4050 ± 0.0071 | 2 | 0.386 / 0.400 (A) | -0.3% |" in markdown
    assert "1 record(s) replaced by a later run of the same seed" in markdown
    assert report_main([str(tmp_path / "nothing_here")]) == 2


def test_drop_last_effect_scores_the_windows_such_a_loader_keeps(tmp_path, capsys):
    # 10 windows with MSE 0..9: a drop_last loader of batch 4 scores windows 0-7 only.
    run = tmp_path / "results" / "setting"
    run.mkdir(parents=True)
    errors = np.column_stack([np.arange(10), np.arange(10.0), np.arange(10.0) / 10])
    np.savetxt(run / "window_errors.csv", errors, fmt="%g", delimiter=",", header="window,mse,mae", comments="")
    (run / "metrics.json").write_text(json.dumps(_record("TimeMixer", "ETTh1", 96, 2021, 4.5, 0.45)))
    drop_last_main([str(tmp_path / "results"), "--batch_size", "4", "10"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == ("| TimeMixer ETTh1 96 seed 2021 | 10 | 4.5000 | 0.4500 | 4 | 8 | 3.5000 | 0.3500 "
                        "| 8.5000 | -22.2% |")
    assert lines[3].startswith("| TimeMixer ETTh1 96 seed 2021 | 10 | 4.5000 | 0.4500 | 10 | 10 | 4.5000 | 0.4500 | nan |")

    # a variant's label names its --des and an explicit evaluation batch
    variant = tmp_path / "variant" / "setting"
    variant.mkdir(parents=True)
    np.savetxt(variant / "window_errors.csv", errors, fmt="%g", delimiter=",", header="window,mse,mae", comments="")
    (variant / "metrics.json").write_text(json.dumps(
        _record("TimeMixer", "ETTh1", 96, 2021, 4.5, 0.45, des="tiled_marks", eval_batch_size=128)))
    drop_last_main([str(tmp_path / "variant"), "--batch_size", "4"])
    assert capsys.readouterr().out.splitlines()[2].startswith(
        "| TimeMixer ETTh1 96 seed 2021 (tiled_marks, eval batch 128) | 10 |")

    (run / "window_errors.csv").write_text("mse\n1\n")
    with pytest.raises(SystemExit, match="not a window_errors.csv from run.py"):
        drop_last_main([str(run / "window_errors.csv"), "--batch_size", "4"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="holds no window_errors.csv"):
        drop_last_main([str(tmp_path / "empty"), "--batch_size", "4"])
    with pytest.raises(SystemExit, match="not found; give window_errors.csv files"):
        drop_last_main([str(tmp_path / "missing"), "--batch_size", "4"])


# ------------------------------------------------------------------ forecasts past the data, original scale
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
    from exp.exp_forecast import Exp_Forecast

    args = make_args("--data", "custom", "--root_path", tmp_path, "--data_path", "plain.csv", "--seq_len", 48,
                     "--label_len", 24, "--pred_len", 12, "--num_threads", 1, "--results_dir", tmp_path / "results",
                     "--no_plots")
    exp = Exp_Forecast(args)
    written = exp.predict("undated")
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


def test_tf32_emulation_rounds_operands_and_incoming_gradients():
    """benchmarks/tf32: a convolution's operands are rounded to TF32 (10 mantissa bits, ties away
    from zero) and so is the gradient it receives, so its input and weight gradients are TF32
    products too; the rounding is visible against plain fp32."""
    import importlib.util
    from pathlib import Path
    from torch.nn import functional as F

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "tf32" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("tf32_emulation", path)
    tf32 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tf32)  # under its own name: nothing in torch is patched
    assert F.conv2d.__name__ == "conv2d"

    values = torch.tensor([1 + 2**-11, 1 + 2**-12, -(1 + 2**-11), 1 + 3 * 2**-11, 0.0])
    assert tf32.to_tf32(values).tolist() == [1 + 2**-10, 1.0, -(1 + 2**-10), 1 + 2**-9, 0.0]

    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 6, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    out = tf32.in_tf32(F.conv2d)(x, w, None, padding=1)
    x_tf32, w_tf32 = (tf32.to_tf32(t.detach()).requires_grad_() for t in (x, w))
    expected = F.conv2d(x_tf32, w_tf32, None, padding=1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert not torch.equal(out, F.conv2d(x, w, None, padding=1))
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(tf32.to_tf32(grad))
    torch.testing.assert_close(x.grad, x_tf32.grad, rtol=0, atol=0)
    torch.testing.assert_close(w.grad, w_tf32.grad, rtol=0, atol=0)


def test_reproduce_shows_the_pythonpath_its_runs_saw(monkeypatch):
    """A folder on PYTHONPATH changes what every run computes (benchmarks/tf32), so reproduce.py's
    table shows it before the command."""
    from benchmarks.reproduce import shown_command

    monkeypatch.setattr(sys, "argv", ["benchmarks/reproduce.py", "--models", "TimesNet", "--extra", "--des tf32"])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert shown_command() == "benchmarks/reproduce.py --models TimesNet --extra '--des tf32'"
    monkeypatch.setenv("PYTHONPATH", "benchmarks/tf32")
    assert shown_command() == "PYTHONPATH=benchmarks/tf32 benchmarks/reproduce.py --models TimesNet --extra '--des tf32'"


def test_report_into_replaces_the_table_and_keeps_the_prose(tmp_path, capsys):
    """--into rewrites a results document's table and the notes under it, and nothing else;
    run twice it changes nothing; a document without exactly one table is refused."""
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(_record("DLinear", "ETTh1", 96, seed, mse, 0.4)) + "\n"
                                                    for seed, mse in ((1, 0.38), (2, 0.39))))
    reference = tmp_path / "targets.md"
    reference.write_text(REFERENCE)
    doc = tmp_path / "summary.md"
    before, after = "# Summary\n\nProse before the table.\n\n", "\n\n- a note after the table\n"
    doc.write_text(before + "| data | features | input | model | stale |\n|---|\n| stale row |\n\n"
                   "MSE / MAE: mean of old runs\nPublished: somewhere\n3 record(s) replaced by a later run of the same seed."
                   + after)
    argv = [str(tmp_path / "results.jsonl"), "--reference", str(reference), "--into", str(doc)]
    assert report_main(argv) == 0
    text = doc.read_text()
    assert text.startswith(before + "| data | features | input | model | horizon |") and text.endswith(after)
    assert "stale" not in text and "old runs" not in text and "record(s) replaced" not in text
    assert "| ETTh1 | M | 96 | DLinear | 96 | 0.0001 | 32 | type1 | Exp | 0.3850 ± 0.0071 |" in text
    assert report_main(argv) == 0 and doc.read_text() == text

    doc.write_text("# no table here\n")
    assert report_main(argv) == 2
    assert "holds 0 results tables" in capsys.readouterr().err
    assert report_main(argv[:-1] + [str(tmp_path / "missing.md")]) == 2
    assert "missing.md not found" in capsys.readouterr().err


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
