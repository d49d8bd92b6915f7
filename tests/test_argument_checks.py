"""Argument checks: every numeric argument carries its range in its type, channel counts must agree with
the data, models refuse impossible arguments, dates are read strictly. Each refusal's one `error:` line
through run.py (1 and 2 processes) is a probe of the bad-input catalogue (tests/bad_inputs.py); here are
the checks themselves and what the catalogue cannot show (a launcher's restarts, a warning)."""
import logging
import re
import sys
import time

import numpy as np
import pandas as pd
import pytest

from helpers import assert_one_error_line, make_args, run_command

FAST = ["--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24]


def run_py(tmp_path, *argv, torchrun=False):
    """run.py with outputs in tmp_path; under torchrun's engine (utils.launch) with `torchrun`."""
    launcher = ["-m", "utils.launch", "--standalone", "--nproc_per_node", "2", "--max_restarts", "2"] if torchrun else []
    cmd = [sys.executable, *launcher, "run.py", *map(str, argv), "--no_plots",
           "--checkpoints", str(tmp_path / "ck"), "--results_dir", str(tmp_path / "res")]
    started = time.time()
    proc = run_command(cmd, timeout=120)
    return proc, time.time() - started


def test_bad_number_under_torchrun_is_printed_once(tmp_path):
    # every worker parses the command line; only rank 0 prints, it is not stopped before it does,
    # and no restart parses it again
    proc, seconds = run_py(tmp_path, *FAST, "--ddp", "--learning_rate", -1, torchrun=True)
    assert_one_error_line(proc, "--learning_rate must be >= 0, got -1")
    assert seconds < 45


def _numeric_actions():
    from utils.arguments import build_parser, str2bool

    return [a for a in build_parser()._actions if a.type not in (None, str2bool) and a.option_strings]


def test_no_argument_is_a_bare_int_or_float():
    # a new numeric argument gets a type that says its range (utils.arguments.positive_int, ...)
    assert [a.dest for a in _numeric_actions() if a.type in (int, float)] == []
    # and the edges of each range stay open to use
    args = make_args("--dropout", 0, "--label_len", 0, "--weight_decay", 0, "--num_workers", 0, "--subset_rand_ratio", 1,
                     "--down_sampling_layers", 0, "--seed", 0, "--learning_rate", 1e-9, "--is_training", 0)
    assert (args.dropout, args.label_len, args.subset_rand_ratio, args.seed, args.is_training) == (0, 0, 1, 0, 0)


# a value every validated numeric type refuses, whatever its range
@pytest.mark.parametrize("action", _numeric_actions(), ids=lambda a: a.dest)
def test_every_numeric_argument_refuses_out_of_range_values(action, capsys):
    from utils.arguments import parse_args

    flag = action.option_strings[0]
    for bad in ("-1", "inf", "abc"):
        with pytest.raises(SystemExit) as stop:
            parse_args([flag, bad])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"error: {flag}"), err


def test_channel_counts_must_match_the_data():
    from exp.settings import resolve_args
    from utils.errors import UserError

    for model in ("DLinear", "TimerXL"):  # both ignored a wrong --enc_in
        with pytest.raises(UserError, match="--enc_in 3 does not match the data: synthetic has 7 channel"):
            resolve_args(make_args(*FAST, "--model", model, "--enc_in", 3), 1)
    with pytest.raises(UserError, match="so --c_out is 1 or 7; drop --c_out"):
        resolve_args(make_args(*FAST, "--features", "MS", "--c_out", 3), 1)
    args = resolve_args(make_args(*FAST, "--enc_in", 7, "--dec_in", 7, "--c_out", 7), 1)
    assert (args.enc_in, args.dec_in, args.c_out) == (7, 7, 7)
    ms = resolve_args(make_args(*FAST, "--features", "MS"), 1)
    assert (ms.enc_in, ms.c_out) == (7, 1)
    assert resolve_args(make_args(*FAST, "--features", "MS", "--c_out", 7), 1).c_out == 7  # TSLib's MS scripts
    # TiDE reads --c_out as its decoder's width per step (TSLib's scripts pass 8)
    assert resolve_args(make_args(*FAST, "--model", "TiDE", "--c_out", 8), 1).c_out == 8


def test_arguments_a_model_cannot_be_built_with_are_one_user_error():
    from exp.settings import build_model, resolve_args
    from utils.errors import UserError

    cases = {("--model", "PatchTST", "--patch_len", 64): "seq_len 48 is too short for patch_len 64 with stride 8",
             ("--model", "TimeMixer", "--down_sampling_layers", 3, "--down_sampling_window", 4,
              "--down_sampling_method", "avg"): "seq_len 48 is too short for 3 down-sampling layers of window 4",
             ("--model", "iTransformer", "--d_model", 30): "d_model (30) must be divisible by n_heads (8)"}
    for argv, message in cases.items():
        with pytest.raises(UserError, match=re.escape(message)):
            build_model(resolve_args(make_args(*FAST, *argv), 1))


def test_global_batch_size_replaces_batch_size_and_needs_a_window_per_micro_batch():
    from exp.settings import resolve_args
    from utils.errors import UserError

    args = resolve_args(make_args(*FAST, "--global_batch_size", 32, "--accumulation_steps", 2), 3)
    assert (args.global_batch_size, args.batch_size) == (32, 6)  # micro-batches of 5 or 6 windows
    with pytest.raises(UserError, match=re.escape("--global_batch_size 5 is smaller than the 3 processes x 2 "
                                                  "accumulation steps")):
        resolve_args(make_args(*FAST, "--global_batch_size", 5, "--accumulation_steps", 2), 3)


def _dated_csv(tmp_path, name, edit):
    rows = 1500
    frame = pd.DataFrame({"date": pd.date_range("2021-01-01", periods=rows, freq="h").astype(str),
                          "a": np.sin(np.arange(rows) / 7), "OT": np.cos(np.arange(rows) / 5)})
    edit(frame)
    frame.to_csv(tmp_path / name, index=False)
    return ["--data", "custom", "--root_path", tmp_path, "--data_path", name, "--seq_len", 48, "--label_len", 24,
            "--pred_len", 24]


def test_repeated_dates_warn_once_with_count_and_first(tmp_path):
    def repeat(frame):
        frame.loc[[50, 60, 61], "date"] = frame.loc[[49, 59, 59], "date"].to_numpy()

    # the data is read on both ranks; an error found after reading it ends the run before training
    argv = _dated_csv(tmp_path, "repeats.csv", repeat)
    proc, seconds = run_py(tmp_path, *argv, "--model", "PatchTST", "--d_model", 30, "--ddp", "--nproc_per_node", 2)
    assert_one_error_line(proc, "d_model (30) must be divisible by n_heads (8)")
    assert seconds < 45
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "repeat the timestamp" in line]
    assert warnings == [f"warning: {tmp_path / 'repeats.csv'}: 3 row(s) repeat the timestamp before them, the first "
                        "row 51 (2021-01-03 01:00:00); each row still counts as one step, so drop or merge them if "
                        "they are not"], proc.stdout + proc.stderr


def test_repeated_dates_are_kept_in_place(tmp_path, caplog):
    from data_provider.files import read_file

    _dated_csv(tmp_path, "repeats.csv", lambda f: f.loc.__setitem__((50, "date"), f.loc[49, "date"]))
    with caplog.at_level(logging.WARNING, logger="tsl"):
        table = read_file(str(tmp_path / "repeats.csv"))
    assert len(table.values) == 1500 and table.dates.iloc[50] == table.dates.iloc[49]
    assert "1 row(s) repeat the timestamp" in caplog.text


def test_an_empty_date_is_refused_naming_its_row(tmp_path):
    from data_provider.files import read_file
    from utils.errors import UserError

    _dated_csv(tmp_path, "holes.csv", lambda f: f.loc.__setitem__(([7, 9], "date"), None))
    with pytest.raises(UserError, match=r"holes.csv: the 'date' column is empty in row 8 \(2 row\(s\) in all\); fill in"):
        read_file(str(tmp_path / "holes.csv"))


def test_the_itr_loop_may_reach_the_largest_seed_but_not_pass_it():
    """--itr N runs seeds seed .. seed + N - 1; the last one may be the largest numpy accepts."""
    from exp.settings import resolve_args
    from utils.arguments import SEED_LIMIT
    from utils.errors import UserError

    rows = ["--synthetic_rows", 1500, "--synthetic_seed", 0]
    resolve_args(make_args("--seed", SEED_LIMIT - 3, "--itr", 3, *rows), 1)
    with pytest.raises(UserError) as refused:
        resolve_args(make_args("--seed", SEED_LIMIT - 2, "--itr", 3, *rows), 1)
    assert str(refused.value) == (f"--seed {SEED_LIMIT - 2} with --itr 3 passes the largest seed, 4294967295; "
                                  "use a smaller --seed")  # the message names the largest seed itself: 2**32 - 1


def test_data_on_device_always_without_loader_workers_is_accepted():
    """--data_on_device always is refused only with --num_workers > 0 (workers cannot gather on the GPU)."""
    from exp.settings import resolve_args
    from helpers import make_args

    resolve_args(make_args("--data_on_device", "always", "--num_workers", 0, "--synthetic_rows", 1500), 1)
    for where in ("auto", "never"):
        resolve_args(make_args("--data_on_device", where, "--num_workers", 2, "--synthetic_rows", 1500), 1)


def test_a_batch_size_that_a_global_batch_replaces_is_named(caplog):
    """--batch_size 8 beside --global_batch_size 32 on 2 processes runs micro-batches of 16: said in one warning
    (was silent); the default --batch_size, or one the global batch gives anyway, says nothing."""
    from exp.settings import resolve_args

    def warnings_of(*argv):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tsl"):
            args = resolve_args(make_args("--synthetic_rows", 1500, *argv), 2)
        return args.batch_size, [r.getMessage() for r in caplog.records if "replaced" in r.getMessage()]

    assert warnings_of("--batch_size", 8, "--global_batch_size", 32) == (16, [
        "--batch_size 8 is replaced by --global_batch_size 32: micro-batches of up to 16 windows on each of 2 "
        "process(es); to hold them smaller, add --accumulation_steps"])
    assert warnings_of("--global_batch_size", 32) == (16, [])
    assert warnings_of("--batch_size", 16, "--global_batch_size", 32) == (16, [])


# A process that runs run.py under a cap on its address space and reports the child's peak resident memory.
_MEASURED = """
import resource, subprocess, sys
cap = 6 << 30
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True,
                      preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
sys.stdout.write(proc.stdout)
sys.stderr.write(proc.stderr)
print("peak_kb", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(proc.returncode)
"""


def test_a_huge_horizon_is_refused_before_the_model_is_built(tmp_path):
    """--pred_len 1e8 on 1 500 rows: the length check came after the model was built (a DLinear of that horizon
    weighs 38 GB: the OOM killer ended it, exit 137, no line; 3e6 took 1.5 GB and 9 s). Refused from the data's
    length before anything is allocated: one line, exit 2, the memory of a bare run.py start (under a 6 GB cap on
    the address space, so that the bug, were it back, fails the test with a MemoryError, not the machine)."""
    cmd = [sys.executable, "-c", _MEASURED, sys.executable, "run.py", *map(str, FAST), "--pred_len", 100000000,
           "--no_plots", "--checkpoints", str(tmp_path / "ck"), "--results_dir", str(tmp_path / "res")]
    cmd = [str(part) for part in cmd]
    started = time.time()
    proc = run_command(cmd, timeout=120)
    assert_one_error_line(proc, "the train split of synthetic has 1050 rows, fewer than the 100000048 one window "
                                "needs (seq_len 48 + horizon)")
    peak_mb = int(re.search(r"peak_kb (\d+)", proc.stdout).group(1)) / 1024
    assert peak_mb < 700, peak_mb  # about 390 MB: the interpreter, torch and the data
    assert time.time() - started < 60
    assert not (tmp_path / "ck").exists() and not (tmp_path / "res").exists()


def test_the_window_check_reads_only_the_splits_an_evaluation_uses():
    """--is_training 0 scores validation and test: a training split too short for one window is no reason to
    refuse (a zero-shot evaluation on a short series)."""
    from data_provider.data_factory import prepared_data
    from exp.settings import _check_windows

    args = make_args(*FAST)
    args.is_training, args.autoregressive = 0, False
    data = prepared_data(args)
    calls = []
    original = data.window_dataset
    data.window_dataset = lambda flag, window, with_marks=True: calls.append(flag) or original(flag, window, with_marks)
    try:
        _check_windows(args, data)
        args.is_training = 1
        _check_windows(args, data)
    finally:
        del data.window_dataset
    assert calls == ["val", "test", "train", "val", "test"]


@pytest.mark.parametrize("name, value, why", [
    ("model_id", "x/../../../../escaped", "holds a path separator"), ("des", "a\\b", "holds a path separator"),
    ("des", "..", "holds '..'"), ("model_id", "v1..2", "holds '..'"), ("model_id", "", "is empty"),
    ("des", "a\x00b", "holds a control character"), ("model_id", "two\nlines", "holds a control character"),
    ("features", "M/..", "holds a path separator"),
])
def test_a_setting_part_that_is_no_safe_file_name_part_is_refused(name, value, why):
    """The setting, <checkpoints>/<setting>/, joins these arguments as given: --model_id 'x/../../../../escaped'
    wrote checkpoint.pth and last.pth outside --checkpoints, then failed with a traceback."""
    from exp.settings import check_setting_parts
    from utils.errors import UserError

    args = make_args(*FAST)
    setattr(args, name, value)
    with pytest.raises(UserError) as refused:
        check_setting_parts(args)
    assert str(refused.value).startswith(f"--{name} {value!r} {why}, but it is part of the name of the run's folders")
    check_setting_parts(make_args(*FAST, "--model_id", "ETTh1_96.v2", "--des", "Exp 1"))  # ordinary names pass


def test_a_setting_name_longer_than_a_file_name_may_be_is_refused():
    from exp.settings import resolve_args
    from utils.errors import UserError

    # the first run's name is 255 bytes long, the last one's (_seed2031_10) 256
    with pytest.raises(UserError, match=r"is 256 bytes long, longer than the 255 a file name may have"):
        resolve_args(make_args(*FAST, "--des", "d" * 158, "--itr", 11), 1)
    resolve_args(make_args(*FAST, "--des", "d" * 158), 1)
