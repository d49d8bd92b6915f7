"""Results files (issue 19, defects 7 and 11): every output path is checked before training, an append
after a cut-off line starts a line of its own, the report skips unreadable lines and never pools runs
trained differently, a non-finite metric is written as null and explained, and a mistyped argument is
reported even with --quiet."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from benchmarks.report import main as report_main
from helpers import assert_ok, make_args, run_cli

TINY = ["--train_epochs", 1, "--synthetic_rows", 1000, "--seq_len", 24, "--label_len", 12, "--pred_len", 12]


def _strict_json(text):
    """json.loads that refuses NaN and Infinity, as every JSON reader but Python's does."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------ defect 7: results files
def test_an_append_after_a_cut_off_line_starts_a_new_line(tmp_path):
    from exp.outputs import save_results

    args = make_args(*TINY, "--results_dir", tmp_path)
    jsonl = tmp_path / "results.jsonl"
    whole = json.dumps({"model": "DLinear", "pred_len": 12, "mse": 1.0, "mae": 1.0})
    jsonl.write_text(whole + "\n" + whole[:20])  # a run killed in the middle of its append
    save_results(args, "setting", {"mse": 0.5, "mae": 0.6})
    lines = jsonl.read_text().splitlines()
    assert len(lines) == 3 and lines[1] == whole[:20]
    assert _strict_json(lines[2])["mse"] == 0.5  # the new record is whole, not glued to the fragment
    save_results(args, "setting", {"mse": 0.7, "mae": 0.8})  # after a whole line: no blank line
    assert [_strict_json(x)["mse"] for x in jsonl.read_text().splitlines()[2:]] == [0.5, 0.7]


def test_report_skips_undecodable_and_cut_off_lines_with_one_warning(tmp_path, capsys):
    good = [json.dumps(_record(seed)).encode() for seed in (1, 2)]
    (tmp_path / "results.jsonl").write_bytes(good[0] + b"\n\xff\xfe\x00 binary junk\n" + good[1][:30] + b"\n"
                                             + good[1] + b"\n")
    assert report_main([str(tmp_path / "results.jsonl"), "--reference", ""]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "skipped 2 line(s)" in warnings[0] and "results.jsonl:2" in warnings[0]
    assert "Traceback" not in err
    assert "| 0.4500 ± 0.0707 |" in out  # the two whole records, seeds 1 and 2


# ------------------------------------------------------------------ defect 11: the report's rows
def _record(seed, mse=None, setting="s", **args):
    args = {"features": "M", "seq_len": 96, "data": "ETTh1", "data_path": "ETTh1.csv", "learning_rate": 0.0001,
            "batch_size": 32, "lradj": "type1", "des": "Exp", "checkpoints": "./checkpoints", **args}
    mse = 0.4 + 0.1 * (seed - 1) if mse is None else mse
    return {"setting": setting, "model": "DLinear", "data": "ETTh1", "pred_len": 96, "seed": seed, "mse": mse,
            "mae": mse, "world_size": 1, "args": args}


def test_report_never_pools_runs_trained_differently(tmp_path):
    records = [
        _record(1), _record(2),  # the recipe every other record differs from in one argument
        _record(3, train_epochs=5),
        _record(4, lr_scaling="linear", global_batch_size=32),
        _record(5, accumulation_steps=2, batch_size=16, global_batch_size=32),
        _record(6, model_id="ETTh1_96_96"),
        # --is_training 0: seed 1's checkpoint scored twice, under two --seed values: one model, in a row apart
        _record(1, mse=0.9, is_training=0, checkpoint="ck/seed1.pth"),
        _record(7, mse=0.9, is_training=0, checkpoint="ck/seed1.pth"),
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert report_main([str(tmp_path), "--reference", "", "--format", "csv", "--out", str(tmp_path / "t.csv")]) == 0
    table = pd.read_csv(tmp_path / "t.csv")
    by_des = dict(zip(table.des, zip(table.seeds, table.mse)))
    assert by_des.pop("Exp") == (2, pytest.approx(0.45))
    assert by_des.pop("Exp, train_epochs 5") == (1, pytest.approx(0.6))
    assert by_des.pop("Exp, lr_scaling linear") == (1, pytest.approx(0.7))
    assert by_des.pop("Exp, batch_size 16, accumulation_steps 2") == (1, pytest.approx(0.8))
    assert by_des.pop("Exp, model_id ETTh1_96_96") == (1, pytest.approx(0.9))
    assert by_des.pop("Exp, evaluated checkpoints (--is_training 0)") == (1, pytest.approx(0.9))
    assert not by_des


# ------------------------------------------------------------------ defect 11: metrics.json, --quiet
def test_a_non_finite_metric_is_written_as_null_and_explained(tmp_path, caplog):
    from exp.outputs import save_results

    args = make_args(*TINY, "--results_dir", tmp_path)
    metrics = {"mse": 0.5, "mae": 0.6, "mape": 1.5, "mse_orig": 2.0, "mae_orig": 1.0, "mape_orig": math.inf,
               "mspe_orig": math.nan}
    with caplog.at_level("WARNING", logger="tsl"):
        save_results(args, "setting", metrics)
    saved = _strict_json((tmp_path / "setting" / "metrics.json").read_text())
    assert saved["mape_orig"] is None and saved["mspe_orig"] is None and saved["mape"] == 1.5
    assert _strict_json((tmp_path / "results.jsonl").read_text())["mape_orig"] is None
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(lines) == 1 and "mape_orig inf, mspe_orig nan: the true values hold a 0 on the original scale" in lines[0]
    assert "written as null" in lines[0]


def test_each_scale_explains_its_own_non_finite_ratios(caplog):
    """A percentage error is blamed on a 0 among the true values only when the same scale's mae is finite."""
    from exp.outputs import finite_metrics

    metrics = {"mae": 0.6, "mape": math.inf, "mae_orig": 1.0, "mape_orig": math.inf}
    with caplog.at_level("WARNING", logger="tsl"):
        finite_metrics(metrics)
    line = caplog.records[-1].getMessage()
    assert "mape inf: the true values hold a 0 on the scaled data" in line
    assert "mape_orig inf: the true values hold a 0 on the original scale" in line
    # a diverged model: not finite on either scale, and no overflow is claimed
    finite_metrics({"mae": math.nan, "mae_orig": math.nan, "mape_orig": math.nan})
    assert ("mae_orig nan, mape_orig nan: the forecasts or the true values are not finite on the original scale"
            in caplog.records[-1].getMessage())


def test_original_scale_metrics_of_huge_values_are_float64_and_an_overflow_is_named(caplog):
    """Issue 36, item 13: values of 1e30 gave inf in float32 and a warning blaming the data; in float64 they
    are finite. Past float64's range (errors of 1e160 squared) the warning names the overflow."""
    from types import SimpleNamespace

    import torch

    from exp.outputs import OriginalScale, finite_metrics
    from utils.metrics import ErrorSums

    pred, true = torch.randn(2, 2, 12, 1, generator=torch.Generator().manual_seed(0))
    for size in (1e30, 1e160):
        to_original = OriginalScale(SimpleNamespace(mean_=np.array([size]), scale_=np.array([size])), "cpu")
        original = ErrorSums(transform=to_original)
        original.update(pred, to_original(true))  # the truths come on the original scale (the data's own values)
        scaled = ErrorSums()
        scaled.update(pred, true)
        metrics = {**scaled.metrics(), **{f"{k}_orig": v for k, v in original.metrics().items()}}
        err = (pred.double() - true.double()).numpy() * size
        assert metrics["mae_orig"] == pytest.approx(np.abs(err).mean(), rel=1e-12)
        if size == 1e30:
            assert metrics["mse_orig"] == pytest.approx(np.mean(err ** 2), rel=1e-12)
            continue
        assert metrics["mse_orig"] == math.inf and math.isfinite(metrics["mse"])
        with caplog.at_level("WARNING", logger="tsl"):
            finite_metrics(metrics)
        line = caplog.records[-1].getMessage()
        assert line.startswith("mse_orig inf, rmse_orig inf: float64 overflow on the original scale"), line
        assert "not finite" not in line


@pytest.fixture(scope="module")
def quiet_run_on_zeros(tmp_path_factory):
    """One --quiet --inverse run, with an argument of OpenLTM's that is ignored here, on data whose target holds zeros."""
    tmp = tmp_path_factory.mktemp("zeros")
    rows = 600
    frame = pd.DataFrame({"date": pd.date_range("2021-01-01", periods=rows, freq="h"),
                          "a": np.sin(np.arange(rows) / 5.0), "OT": 2.0 * (np.arange(rows) % 2)})  # 0, 2, ...: mean 1 and std 1, so the 0s come back exactly
    frame.to_csv(tmp / "zeros.csv", index=False)
    proc = run_cli(tmp, "--data", "custom", "--root_path", tmp, "--data_path", "zeros.csv", *TINY, "--inverse",
                   "--quiet", "--flash_attention")
    assert_ok(proc)
    return tmp, proc


def test_inverse_metrics_with_zero_truths_give_valid_json(quiet_run_on_zeros):
    tmp, proc = quiet_run_on_zeros
    saved = _strict_json(next((tmp / "results").glob("*/metrics.json")).read_text())
    assert saved["mape_orig"] is None and math.isfinite(saved["mse_orig"])
    assert _strict_json((tmp / "results" / "results.jsonl").read_text())["mape_orig"] is None
    assert sum("mape_orig inf" in line and "the true values hold a 0 on the original scale" in line
               for line in proc.stdout.splitlines()) == 1


def test_quiet_keeps_the_ignored_argument_warning(quiet_run_on_zeros):
    _, proc = quiet_run_on_zeros
    assert "epoch 1/1" not in proc.stdout  # --quiet is quiet
    assert proc.stdout.count("warning: ignoring arguments run.py does not use: --flash_attention (") == 1


def test_the_ignored_argument_warning_prints_once_under_ddp(tmp_path):
    # a missing data file ends the job at once: the warning comes before the data is read
    proc = run_cli(tmp_path, *TINY, "--quiet", "--flash_attention", "--data", "custom", "--root_path", tmp_path,
                   "--data_path", "nope.csv", "--ddp",
                   "--nproc_per_node", 2, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (proc.stdout + proc.stderr).count("ignoring arguments run.py does not use: --flash_attention") == 1


def test_a_stop_during_a_write_is_raised_as_the_stop_not_as_the_writers_cleanup_error(tmp_path):
    """SIGTERM arriving inside torch.save: its zip writer's clean-up then fails on the half-written file
    (RuntimeError: unexpected pos); atomic_write re-raises the stop, so run.py ends with its one line."""
    import pytest

    from utils.files import atomic_write

    class Stop(BaseException):
        pass

    def write(f):
        try:
            f.write(b"half")
            raise Stop()
        finally:
            raise RuntimeError("unexpected pos 159360 vs 159252")  # what torch.save's __exit__ raises

    with pytest.raises(Stop):
        atomic_write(str(tmp_path / "last.pth"), write)
    assert list(tmp_path.iterdir()) == []  # nothing half-written left
    with pytest.raises(RuntimeError):  # a writer's own error, with no stop behind it, stays what it is
        atomic_write(str(tmp_path / "x"), lambda f: (_ for _ in ()).throw(RuntimeError("disk says no")))


# ------------------------------------------------------------------ a full disk under --results_dir
@pytest.fixture
def small_disk(tmp_path, request):
    """A tmpfs of request.param kB: 4 holds none of the results files, 12 window_errors.csv (7.5 kB) alone.
    Mounting needs root and a kernel that lets this container mount: skipped elsewhere
    (test_an_append_that_fails_part_way_leaves_the_file_as_it_was holds the record's half of it everywhere)."""
    import os
    import shutil
    import subprocess

    folder = tmp_path / "small_disk"
    folder.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount") or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={request.param}k", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (not root, or no mount permission)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.mark.parametrize("small_disk, unwritten", [(4, "window_errors.csv"), (12, "metrics.json")],
                         indirect=["small_disk"], ids=["nothing fits", "window errors fit"])
def test_a_full_results_dir_prints_the_result_then_stops_every_rank_with_one_line(tmp_path, small_disk, unwritten):
    """--results_dir on a full disk, 2 processes, pictures and --do_predict: the result line is printed, each
    picture that cannot be written is one warning, and the records stop every rank with one line, exit 2
    (was: a traceback from window_errors.csv or metrics.json, the result line never printed)."""
    from helpers import assert_one_error_line, output_args

    argv = [*TINY, "--do_predict", "--num_threads", 1, *output_args(tmp_path)[:2], "--results_dir", small_disk]
    proc = run_cli(tmp_path, *argv, nproc=2, outputs=False, plots=True, timeout=120)
    setting = next(small_disk.iterdir())
    assert_one_error_line(proc, f"error: cannot write {setting / unwritten} (No space left on device); the "
                                "result line above holds this test's metrics, and results.jsonl no part of its record. "
                                "Free space under --results_dir (or fix its permissions), then score the weights again "
                                "with --is_training 0")
    assert sum(line.startswith(f"test {setting.name}: mse ") for line in proc.stdout.splitlines()) == 1
    assert sum("warning: cannot write" in line and "(No space left on device); the run goes on without it" in line
               for line in proc.stdout.splitlines()) == 2  # training_curves.png, forecast.png
    written = [] if unwritten == "window_errors.csv" else ["window_errors.csv"]
    assert sorted(p.name for p in setting.iterdir()) == written  # nothing half-written
    assert not (small_disk / "results.jsonl").exists()


def test_an_append_that_fails_part_way_leaves_the_file_as_it_was(tmp_path):
    """results.jsonl on a disk that fills inside the append (here RLIMIT_FSIZE: the file may grow 3 000 bytes,
    the record is 5 001): the file keeps its earlier record alone, whole, and the next append starts after it
    (was: a cut-off record left behind)."""
    import subprocess
    import sys

    from helpers import repo_first_env, subprocess_env

    path = tmp_path / "results.jsonl"
    path.write_text('{"setting": "earlier"}\n')
    before = path.read_bytes()
    child = (f"import resource, signal\nfrom utils.files import append_line\n"
             "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"  # then a write past the limit fails with EFBIG
             "resource.setrlimit(resource.RLIMIT_FSIZE, (3000, resource.RLIM_INFINITY))\n"
             f"try:\n    append_line({str(path)!r}, '\"' + 'x' * 4999 + '\"')\n"
             "except OSError as failure:\n    print(failure.strerror)\n")
    proc = subprocess.run([sys.executable, "-c", child], env=repo_first_env(subprocess_env()), capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.strip() == "File too large", proc.stdout + proc.stderr
    assert path.read_bytes() == before
    from utils.files import append_line

    append_line(str(path), '{"setting": "next"}')
    assert [json.loads(line)["setting"] for line in path.read_text().splitlines()] == ["earlier", "next"]


def test_a_non_finite_metrics_line_follows_whether_the_data_was_scaled(caplog):
    """--scale false (and M4, which is never scaled) said "on the scaled data"; and all-zero truths blamed WQL's
    inf on non-finite forecasts."""
    from argparse import Namespace

    from exp.outputs import finite_metrics

    with caplog.at_level("WARNING", logger="tsl"):
        finite_metrics({"mae": 0.5, "mape": math.inf}, Namespace(scale=False, data="custom"))
        finite_metrics({"mae": math.nan, "mse": math.nan}, Namespace(scale=False, data="custom"))
        finite_metrics({"mae": 0.5, "mape": math.inf, "wql": math.inf}, Namespace(scale=True, data="custom"))
        finite_metrics({"smape": 30.0, "mape": math.inf}, Namespace(scale=True, data="m4"))
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0].startswith("mape inf: the true values hold a 0 on the unscaled data, ")
    assert lines[1].startswith("mae nan, mse nan: the forecasts or the true values are not finite on the unscaled data")
    assert "wql inf: every true value is 0 on the scaled data, and WQL divides by the sum of their absolute" in lines[2]
    assert lines[3].startswith("mape inf: the true values hold a 0 on the unscaled data, ")


def test_a_zero_mase_scale_is_named_as_the_cause(tmp_path):
    """A constant target scored probabilistically: its seasonal error, MASE's and MSIS's scale, is 0, so gluonts'
    rule leaves its elements out. Alone (--features S), nothing is left: mase and msis are null, and the line names
    the series and the cause (was: "the forecasts or the true values are not finite on the scaled data", with
    --scale false too). Beside another channel (--features M), the two are of the other channel, and one line
    says which series were left out."""
    from helpers import records

    rows = 600
    pd.DataFrame({"date": pd.date_range("2021-01-01", periods=rows, freq="h"), "a": np.sin(np.arange(rows) / 5.0),
                  "OT": np.full(rows, 3.0)}).to_csv(tmp_path / "flat.csv", index=False)
    argv = ["--data", "custom", "--root_path", tmp_path, "--data_path", "flat.csv", "--seq_len", 48, "--label_len", 24,
            "--pred_len", 24, "--train_epochs", 1, "--loss", "quantile", "--quantiles", "0.1,0.5,0.9", "--quiet",
            "--num_threads", 1]
    proc = run_cli(tmp_path, *argv, "--features", "S", "--scale", "false")
    assert_ok(proc)
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: mase nan, sql nan, rmsse nan: MASE's scale, the seasonal error at season 24, is 0 for every scored "
                        "series (column OT: a history that repeats itself at the season, e.g. a constant one), so "
                        "MASE and MSIS are undefined: gluonts and GIFT-Eval leave such series out, and none is left "
                        "(written as null in metrics.json and results.jsonl)"], warnings
    assert records(tmp_path)[-1]["mase"] is None
    proc = run_cli(tmp_path, *argv, "--features", "M")
    assert_ok(proc)
    assert ("warning: MASE and MSIS leave out 1 of the 2 scored series, whose seasonal error (their scale, at season "
            "24) is 0: column OT (a history that repeats itself at the season), as gluonts and GIFT-Eval leave them "
            "out") in proc.stdout.splitlines()
    assert math.isfinite(records(tmp_path)[-1]["mase"])
