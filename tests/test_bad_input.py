"""The bad-input catalogue of docs/reliability.md: each bad input ends a 2-process DDP job with exit code 2,
one error line from rank 0, no traceback and nothing overwritten; a checkpoint of another model and a
corrupt training state are refused."""
import time

import numpy as np
import pandas as pd
import pytest

from helpers import SMALL_TIMERXL as TIMERXL, assert_ok, output_args as _outputs, records, run_cli

SMALL_TIMERXL = [*TIMERXL, "--input_token_len", 24, "--output_token_len", 24]


def _csv(tmp, name, frame):
    frame.to_csv(tmp / name, index=False)
    return ["--data", "custom", "--root_path", tmp, "--data_path", name]


def _dated(rows=400, **columns):
    frame = pd.DataFrame({"date": pd.date_range("2021-01-01", periods=rows, freq="h")})
    for name, values in columns.items():
        frame[name] = values
    return frame


def _empty(tmp):
    (tmp / "empty.csv").write_text("")
    return ["--data", "custom", "--root_path", tmp, "--data_path", "empty.csv"]


def _nan(tmp):
    values = np.arange(400.0)
    values[[5, 9]] = np.nan
    return _csv(tmp, "nan.csv", _dated(a=values, OT=np.ones(400)))


def _inf(tmp):
    values = np.ones(400)
    values[7] = np.inf
    return _csv(tmp, "inf.csv", _dated(a=np.ones(400), OT=values))


def _text(tmp):
    return _csv(tmp, "text.csv", _dated(a=["x"] + [1.0] * 399, OT=np.ones(400)))


def _bad_date(tmp):
    frame = _dated(a=np.ones(400), OT=np.ones(400))
    frame["date"] = frame["date"].astype(str)
    frame.loc[10, "date"] = "yesterday-ish"
    return _csv(tmp, "dates.csv", frame)


def _univariate(tmp):
    return [*_csv(tmp, "uni.csv", _dated(OT=np.sin(np.arange(400.0)))), "--features", "MS"]


def _file_in_the_way(tmp, option):
    (tmp / "a_file").write_text("not a folder")
    return [f"--{option}", tmp / "a_file" / "sub"]


CATALOGUE = {
    "missing file": (lambda t: ["--data", "custom", "--root_path", t, "--data_path", "nope.csv"],
                     "data file not found"),
    "empty file": (_empty, "empty.csv is empty"),
    "unknown target": (lambda t: ["--target", "price"], "--target 'price' is not a column of the data"),
    "non-numeric column": (_text, "column 'a' is not numeric (e.g. 'x' in row 1)"),
    "NaN values": (_nan, "NaN or infinite values in column(s) 'a' (2)"),
    "inf values": (_inf, "NaN or infinite values in column(s) 'OT' (1)"),
    "series too short": (lambda t: ["--synthetic_rows", 1000, "--pred_len", 200],
                         "the val split of synthetic has 196 rows, fewer than the 296"),
    "unparsable date": (_bad_date, "the 'date' column cannot be parsed as timestamps"),
    "batch size": (lambda t: ["--batch_size", 0], "--batch_size must be positive, got 0"),
    "no batch left to train": (lambda t: ["--train_drop_last", "--batch_size", 100000],
                               "--train_drop_last leaves no training batch: each process holds 1655 training "
                               "windows, fewer than --batch_size 100000"),
    "token multiple": (lambda t: ["--model", "TimerXL", "--seq_len", 100],
                       "--seq_len (100) must be a multiple of --input_token_len (24)"),
    "MS on univariate": (_univariate, "--features MS needs covariates"),
    "unknown model": (lambda t: ["--model", "Nope"], "unknown --model 'Nope'; available: DLinear, "),
    "unknown data": (lambda t: ["--data", "ETTh3"], "unknown --data 'ETTh3'; choose one of ETTh1"),
    "unknown lradj": (lambda t: ["--lradj", "fancy"], "unknown --lradj 'fancy'; choose one of type1"),
    "unwritable checkpoints": (lambda t: _file_in_the_way(t, "checkpoints"), "--checkpoints"),
    "unwritable results_dir": (lambda t: _file_in_the_way(t, "results_dir"), "--results_dir"),
}


@pytest.mark.parametrize("case", CATALOGUE)
def test_bad_input_catalogue_under_ddp(tmp_path, case):
    build, message = CATALOGUE[case]
    argv = build(tmp_path)
    sentinel = tmp_path / "results" / "results.jsonl"
    sentinel.parent.mkdir()
    sentinel.write_text('{"earlier": "result"}\n')
    outputs = [] if any(str(a).startswith("--checkpoints") or str(a).startswith("--results_dir") for a in argv) \
        else _outputs(tmp_path)
    started = time.time()
    proc = run_cli(tmp_path, *argv, *outputs, "--ddp", "--nproc_per_node", 2, outputs=False, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr, proc.stderr[-2000:]
    worker_lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ") and "worker" not in line]
    assert len(worker_lines) == 1  # one line, from rank 0
    assert "Traceback" not in proc.stderr + proc.stdout
    assert time.time() - started < 30
    assert sentinel.read_text() == '{"earlier": "result"}\n'  # nothing overwritten
    if "unwritable" in case:
        assert "is not a writable folder" in proc.stderr


@pytest.fixture(scope="module")
def timerxl_checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("timerxl")
    assert_ok(run_cli(tmp, *SMALL_TIMERXL, "--train_epochs", 1))
    return tmp / "checkpoints" / records(tmp)[-1]["setting"] / "checkpoint.pth"


def test_checkpoint_of_another_model_is_refused_and_left_intact(tmp_path, timerxl_checkpoint):
    before = timerxl_checkpoint.read_bytes()
    proc = run_cli(tmp_path, "--is_training", 0, "--checkpoint", timerxl_checkpoint, "--ddp", "--nproc_per_node", 2)
    assert proc.returncode == 2
    assert "does not fit model DLinear: missing: Linear_Seasonal.bias" in proc.stderr
    assert "unexpected: blocks." in proc.stderr
    assert timerxl_checkpoint.read_bytes() == before
    assert not (tmp_path / "results" / "results.jsonl").exists()


def test_corrupt_training_state_is_refused(tmp_path):
    (tmp_path / "last.pth").write_bytes(b"PK\x03\x04 definitely not a checkpoint")
    proc = run_cli(tmp_path, "--resume", tmp_path / "last.pth")
    assert proc.returncode == 2 and "truncated or corrupt" in proc.stderr
