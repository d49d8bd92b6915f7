"""lab/tslib_models.py's pieces on a fake TSLib checkout (CI has no real one): which files are
long-term forecasting, the scratch copy with one file dropped in, the refusal of a file whose package is not
installed, the contract tests it selects, and the metrics it compares."""
import pytest

from lab import tslib_models

FORECASTER = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, configs):
        super(Model, self).__init__()
        self.task_name = configs.task_name
        self.linear = nn.Linear(configs.seq_len, configs.pred_len)

    def forecast(self, x_enc):
        return self.linear(x_enc.permute(0, 2, 1)).permute(0, 2, 1)

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None):
        if self.task_name == 'long_term_forecast':
            return self.forecast(x_enc)
        return None
'''
FILES = {
    "Linear": FORECASTER,
    "iLinear": FORECASTER,  # its name holds Linear: the contract tests of Linear must not select it
    "NoTask": "import torch.nn as nn\n\n\nclass Model(nn.Module):\n    pass\n",  # PAttn: forecasts, no switch
    "Needy": "import torch\nfrom no_such_package_here import Block\n\n\nclass Model(torch.nn.Module):\n"
             "    def __init__(self, configs):\n        self.task_name = 'long_term_forecast'\n",
    "Classifier": "class Model:\n    def __init__(self, configs):\n        if configs.task_name in ['classification']:\n"
                  "            pass\n",
    "Released": "from chronos import BaseChronosPipeline\n\n\nclass Model:\n    task_name = 'zero_shot_forecast'\n",
    "Unfinished": "class Model:\n    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec):\n"  # TSLib's KANAD
                  "        if self.task_name == 'long_term_forecast':\n"
                  "            raise NotImplementedError('forecasting is not supported yet')\n",
}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = tmp_path_factory.mktemp("Time-Series-Library")
    (root / "layers").mkdir()
    (root / "models").mkdir()
    (root / "models" / "__init__.py").write_text("")
    for name, source in FILES.items():
        (root / "models" / f"{name}.py").write_text(source)
    return root


def test_long_term_forecasting_files_are_told_from_the_rest(checkout):
    kinds = {path.stem: tslib_models.classify(path) for path in tslib_models.model_files(checkout)}
    assert [name for name, (kind, _) in kinds.items() if kind == "ltf"] == ["Linear", "Needy", "NoTask", "iLinear"]
    assert kinds["Classifier"] == ("excluded", "no long-term forecasting branch (its tasks: classification)")
    assert "foundation model" in kinds["Released"][1] and "chronos" in kinds["Released"][1]
    assert kinds["Unfinished"] == ("excluded", "its long_term_forecast branch raises NotImplementedError: "
                                               "forecasting is not supported yet")


def test_a_files_own_settings_reach_its_runs_and_its_contract(tmp_path):
    """TSLib's TemporalFusionTransformer knows only ETTh1's and ETTm1's columns: its runs get an ETTh1-shaped
    file written into the scratch copy, and the contract reads the same settings from TSL_CONTRACT_ARGS."""
    import shlex
    import subprocess
    import sys

    arguments = tslib_models.file_args("TemporalFusionTransformer", tmp_path)
    folder = arguments[arguments.index("--root_path") + 1]
    assert (tmp_path / "dataset" / "ETTh1-shaped" / "ETTh1.csv").is_file() and folder.startswith(str(tmp_path))
    assert tslib_models.file_args("DLinear", tmp_path) == []
    env = dict(tslib_models.scratch_env(tslib_models.REPO), TSL_CONTRACT_ARGS=shlex.join(["--seq_len", "96"]))
    shown = subprocess.run([sys.executable, "-c", "import test_model_contract as c; print(c.CONTRACT_ARGS[-2:])"],
                           cwd=tslib_models.REPO / "tests", env=env, capture_output=True, text=True)
    assert shown.stdout.strip() == "['--seq_len', '96']", shown.stderr


def test_a_file_whose_package_is_missing_is_refused_in_one_line(checkout, tmp_path):
    """The file alone goes into a scratch copy of this working tree; run.py there refuses it, naming the pip
    command, and the row says so (nothing after the refusal runs)."""
    row = tslib_models.check_file(tslib_models.REPO, checkout / "models" / "Needy.py", keep=tmp_path)
    assert row["status"] == "refused", row
    assert row["note"] == ("error: models/Needy.py imports no_such_package_here, which is not installed: "
                           "pip install no_such_package_here")
    assert list(tmp_path.iterdir()) == []  # the scratch copy is gone


def test_the_scratch_copy_holds_the_working_tree_and_the_one_file(checkout, tmp_path):
    scratch = tslib_models.scratch_copy(tslib_models.REPO, tmp_path / "repo", checkout / "models" / "Linear.py")
    assert (scratch / "models" / "Linear.py").read_text() == FORECASTER
    assert not (scratch / "models" / "iLinear.py").exists()
    for name in ("run.py", "models/DLinear.py", "tests/test_model_contract.py", "lab/tslib_models.py"):
        assert (scratch / name).is_file(), name
    (scratch / "models" / "iLinear.py").write_text(FORECASTER)
    collected = tslib_models.collect_contract(scratch)
    ids = tslib_models.contract_tests(collected, "Linear")
    assert ids and all("Linear" in node and "iLinear" not in node for node in ids), ids
    assert any("test_output_shape[" in node for node in ids) and any("test_ddp_training_step[" in node for node in ids)
    assert any("test_house_style[DLinear]" in node for node in collected)
    zoo_name = tslib_models.contract_tests(collected, "DLinear")  # TSLib's DLinear.py replaces ours
    assert zoo_name and not any("house_style" in node for node in zoo_name)  # the zoo's style, not a drop-in's


def test_metrics_are_compared_relative_and_epoch_by_epoch():
    one = dict(mse=0.5, mae=0.25, history=[dict(epoch=1, train_loss=1.0, vali_loss=0.75, test_loss=0.5)])
    two = dict(mse=0.5, mae=0.25, history=[dict(epoch=1, train_loss=1.0 + 3e-6, vali_loss=0.75, test_loss=0.5)])
    difference, where = tslib_models.metrics_difference(one, two)
    assert where == "train_loss@1" and difference == pytest.approx(3e-6, rel=1e-3)
    assert tslib_models.metrics_difference(one, two, history=False) == (0.0, "mse")
    with pytest.raises(ValueError):  # a run that stopped after another number of epochs is not the same run
        tslib_models.metrics_difference(one, dict(two, history=two["history"] * 2))


INVARIANCE = f"X breaks the model contract: {tslib_models.INVARIANCE_CLAUSE}: gradients differ by 0.14 of their norm"
WINDOWS = f"X breaks the model contract: {tslib_models.WINDOWS_CLAUSE}: a window's forecast changes with ..."
ALIKE = dict(equal=False, micro_train=True, micro_all=True, reload="same metrics")  # 1 x (2 x 4) == 2 x 4
TRAINING_ALIKE = dict(ALIKE, micro_all=False)  # the training losses agree, the test metrics do not


@pytest.mark.parametrize("row, failures, status", [
    (dict(equal=True, reload="same metrics"), [], "runs"),
    (ALIKE, [INVARIANCE], "batch-dependent"),  # Autoformer: its training lags
    (ALIKE, [], "batch-dependent"),
    (TRAINING_ALIKE, [WINDOWS], "batch-dependent"),  # TimesNet: its periods, in evaluation too
    (TRAINING_ALIKE, [], "fails"),  # the evaluation differs, yet a window's forecast reads only itself
    (TRAINING_ALIKE, [INVARIANCE], "fails"),
    (dict(ALIKE, micro_train=False, micro_all=False), [INVARIANCE], "fails"),  # not the batch alone
    (ALIKE, [INVARIANCE, "runs in half precision: ..."], "fails"),
    (dict(ALIKE, reload="differs by 1.0e-03"), [INVARIANCE], "fails"),
    (dict(equal=True, reload="same metrics"), [INVARIANCE], "fails"),
])
def test_a_file_that_reads_its_batch_is_told_apart_and_never_counted_as_running(row, failures, status):
    """1 x 8 vs 2 x 4 differ but 1 process in micro-batches of 4 agrees with 2 x 4: batch-dependent by design,
    only when nothing else fails; the summary counts it apart from the files that run."""
    assert tslib_models.verdict(row, failures, total=14) == status


def test_the_summary_counts_batch_dependent_files_apart():
    rows = [dict(file="models/A.py", status="runs"), dict(file="models/TimesNet.py", status="batch-dependent"),
            dict(file="models/M.py", status="refused"), dict(file="models/F.py", status="fails")]
    line = tslib_models.summary(rows)
    assert line.startswith("**1 of 4 model files run unchanged**; 1 more run unchanged but train alike"), line
    assert "(TimesNet)" in line and line.endswith("1 refused in one line for a package that is not installed; 1 fail.")


NARROW = FORECASTER.replace(  # reads c_out columns, as TSLib's TimeFilter does: fails at --features MS
    "nn.Linear(configs.seq_len, configs.pred_len)", "nn.Linear(configs.c_out, configs.c_out)").replace(
    "self.linear(x_enc.permute(0, 2, 1)).permute(0, 2, 1)", "self.linear(x_enc)[:, -24:]")


def test_a_failure_is_checked_against_tslibs_own_file(tmp_path):
    """A contract configuration that raises is run on TSLib's own file at the same shapes (--features MS:
    7 columns in, c_out 1): the same exception and message is the file's own; another means ours differs."""
    root = tmp_path / "Time-Series-Library"
    (root / "models").mkdir(parents=True)
    (root / "models" / "Narrow.py").write_text(NARROW)
    ours = "mat1 and mat2 shapes cannot be multiplied (192x7 and 1x1)"  # 4 x 48 rows of 7 columns
    failure = (f"Narrow breaks the model contract: output shape (--features MS, batch 4): RuntimeError: {ours} "
               "(at x.py:1); see")
    said = tslib_models.tslib_said(root, "Narrow", [failure, INVARIANCE])
    assert said == {"MS": f"RuntimeError: {ours}"}
    assert tslib_models.own_limits([failure, INVARIANCE], said) == {failure: "MS"}
    other = failure.replace("192x7", "192x6")
    assert tslib_models.own_limits([other], tslib_models.tslib_said(root, "Narrow", [other])) == {}
    assert tslib_models.tslib_said(root, "Narrow", [INVARIANCE]) == {}


def test_a_merged_results_file_names_every_run_its_rows_come_from(tmp_path):
    """--merge: a file checked again replaces its earlier row, and the header names each run's command, date,
    commit and seconds (the results file must say where every figure comes from)."""
    import json

    earlier = dict(command="python lab/tslib_models.py --files A B", date="2026-01-01 10:00 UTC",
                   version="commit abc1234", seconds=100.0, files=2)
    rows = [dict(file=f"models/{name}.py", status="fails", difference="", reload="", contract="", seconds="50",
                 note="old") for name in "AB"]
    (tmp_path / "earlier.json").write_text(json.dumps(dict(rows=rows, seconds=100.0, run=earlier)))
    again = dict(rows[1], status="runs", note="")
    merged, runs = tslib_models.merged([again], tslib_models.run_record("python again", 60.0, 1),
                                       [str(tmp_path / "earlier.json")])
    assert [(row["file"], row["status"]) for row in merged] == [("models/A.py", "fails"), ("models/B.py", "runs")]
    text = tslib_models.markdown(merged, [], tmp_path, runs)
    assert "- `python lab/tslib_models.py --files A B`, 2026-01-01 10:00 UTC, this repository's commit " \
           "abc1234, 100 s (2 files)" in text
    assert "- `python again`, " in text and ", 160 s of runs in all" in text and "**1 of 2 model files run" in text


# Measured (2026-11-27, this script's settings): 1 vs 2 processes and the file's own floor, 1 vs 2 threads.
PATCHTST = dict(equal=False, gap=2.5e-5, floor=2.4e-5, reload="same metrics")
PYRAFORMER = dict(PATCHTST, gap=5.1e-6, floor=1.3e-5)


@pytest.mark.parametrize("row, failures, status", [
    (PATCHTST, [], "runs (rounding-sensitive)"),
    (PYRAFORMER, [], "runs (rounding-sensitive)"),
    (dict(PATCHTST, gap=4 * 2.4e-5), [], "runs (rounding-sensitive)"),  # at the factor
    (dict(PATCHTST, gap=5 * 2.4e-5), [], "fails"),  # beyond ROUNDING_FACTOR x the floor
    (dict(PATCHTST, gap=3e-6, floor=9e-7), [], "fails"),  # a floor below TOLERANCE: the file rounds finely
    (dict(PATCHTST, floor=None), [], "fails"),  # not measured
    (dict(PATCHTST, gap=None), [], "fails"),  # the 2 processes did not compare
    (dict(PATCHTST, reload="differs by 1.0e-03"), [], "fails"),
    (PATCHTST, [INVARIANCE], "fails"),  # the contract must be clean
    (dict(ALIKE, gap=2.5e-5, floor=2.4e-5), [INVARIANCE], "batch-dependent"),  # equal micro-batches explain it
])
def test_a_file_within_its_own_rounding_floor_runs_and_is_named_so(row, failures, status):
    """1 vs 2 processes beyond TOLERANCE for no batch reason counts as running only within ROUNDING_FACTOR x
    the file's own floor (1 process on 1 vs 2 threads), a floor itself above TOLERANCE."""
    assert tslib_models.verdict(row, failures, total=14) == status


def test_the_floor_is_measured_only_where_it_decides():
    ready = dict(PATCHTST, floor=None)
    assert tslib_models.needs_floor(ready, [], 14, {})
    assert not tslib_models.needs_floor(dict(ready, equal=True), [], 14, {})  # runs already
    assert not tslib_models.needs_floor(ready, [INVARIANCE], 14, {})  # fails anyway
    assert not tslib_models.needs_floor(dict(ready, reload="fails"), [], 14, {})
    assert not tslib_models.needs_floor(dict(ALIKE, gap=2e-3, floor=None), [INVARIANCE], 14, {})  # the batch's
    assert not tslib_models.needs_floor(PATCHTST, [], 14, {})  # measured


S_ERROR = "IndexError: index 1 is out of bounds for dimension 2 with size 1"
MS_ERROR = "RuntimeError: shape '[4, 1, 24]' is invalid for input of size 672"


def raised(features, error):
    return (f"X breaks the model contract: output shape (--features {features}, batch 4): {error} (at models/X.py:83)"
            "; the model must build and run on this configuration; see models/README.md")


@pytest.mark.parametrize("failures, said, forgiven", [
    ([raised("S", S_ERROR)], {"S": S_ERROR}, ["S"]),  # TemporalFusionTransformer
    ([raised("S", S_ERROR), raised("MS", MS_ERROR), INVARIANCE], {"S": S_ERROR, "MS": "runs, output (4, 24, 1)"},
     ["S"]),  # TSLib's own file runs at MS: ours fails there
    ([raised("MS", MS_ERROR)], {"MS": MS_ERROR.replace("672", "671")}, []),  # another message, other shapes
    ([raised("MS", MS_ERROR)], {"S": MS_ERROR}, []),  # raised at another configuration
    ([INVARIANCE, WINDOWS], {"MS": MS_ERROR}, []),
])
def test_only_a_failure_tslibs_own_file_shares_is_its_own_limit(failures, said, forgiven):
    limits = tslib_models.own_limits(failures, said)
    assert sorted(limits.values()) == forgiven and all(tslib_models.raised_at(f)[0] in forgiven for f in limits)


@pytest.mark.parametrize("row, failures, said, status", [
    (dict(equal=True, reload="same metrics"), [raised("S", S_ERROR)], {"S": S_ERROR},
     "runs (own limit: --features S)"),
    (dict(equal=True, reload="same metrics"), [raised("S", S_ERROR)], {"S": "runs, output (4, 24, 1)"}, "fails"),
    (dict(equal=True, reload="same metrics"), [raised("S", S_ERROR), INVARIANCE], {"S": S_ERROR}, "fails"),
    (TRAINING_ALIKE, [raised("MS", MS_ERROR), INVARIANCE, WINDOWS], {"MS": MS_ERROR},
     "batch-dependent (own limit: --features MS)"),  # TimeMixer
    (TRAINING_ALIKE, [raised("MS", MS_ERROR), INVARIANCE, WINDOWS, "runs in half precision: ..."], {"MS": MS_ERROR},
     "fails"),
    (PATCHTST, [raised("S", S_ERROR)], {"S": S_ERROR}, "runs (rounding-sensitive; own limit: --features S)"),
])
def test_a_contract_failure_of_tslibs_own_file_does_not_count_and_is_named(row, failures, said, status):
    assert tslib_models.verdict(row, failures, 14, said) == status


def test_the_note_keeps_the_own_limit_and_the_floor():
    """A forgiven clause stays in the note with its error (the contract column still counts it), after the
    design's reason for a batch-dependent file; a rounding-sensitive file's note gives both figures."""
    row = dict(TRAINING_ALIKE, difference="2.8e-03 (mape)", contract="11/14", note="")
    failures = [raised("MS", MS_ERROR), INVARIANCE, WINDOWS]
    tslib_models.judge(row, "TimeMixer", failures, 14, {"MS": MS_ERROR})
    assert row["status"] == "batch-dependent (own limit: --features MS)"
    assert row["note"].startswith("by design: x_mark.repeat") and row["note"].endswith(
        f"; --features MS: fails in TSLib's own file identically: {MS_ERROR} (the file's own limit: that contract "
        "clause does not count against it)"), row["note"]
    assert "must build and run" not in row["note"]
    row = dict(PATCHTST, difference="2.5e-05 (mspe)", floor_text="2.4e-05 (mspe)", note="")
    tslib_models.judge(row, "PatchTST", [], 14, {})
    assert row["note"].startswith("rounding floor: 1 process on 1 vs 2 threads 2.4e-05 (mspe), 1 vs 2 processes "
                                  "2.5e-05 (mspe): within 4 x the floor; 1 vs 2: with --sync_bn"), row["note"]
    row = dict(equal=True, reload="same metrics", difference="7.0e-08 (mspe)", note="")
    tslib_models.judge(row, "Koopa", [], 14, {})  # passes the contract, by its rounding allowance: said so
    assert row["status"] == "runs" and row["note"].startswith("TSLib's own Koopa.py: the same weights"), row


def test_the_summary_counts_and_names_the_files_own_findings():
    rows = [dict(file="models/A.py", status="runs"),
            dict(file="models/PatchTST.py", status="runs (rounding-sensitive)"),
            dict(file="models/TFT.py", status="runs (own limit: --features S)"),
            dict(file="models/TimeMixer.py", status="batch-dependent (own limit: --features MS)"),
            dict(file="models/F.py", status="fails")]
    line = tslib_models.summary(rows)
    assert line.startswith("**3 of 5 model files run unchanged**, of them 1 rounding-sensitive: 1 vs 2 processes "
                           "within 4 x the file's own rounding floor, 1 vs 2 threads (PatchTST) and 1 with a contract "
                           "configuration that fails in TSLib's own file identically (TFT --features S); 1 more run "
                           "unchanged but"), line
    assert "by design (TimeMixer), of them 1 with a contract configuration that fails in TSLib's own file " \
           "identically (TimeMixer --features MS); 0 refused" in line and line.endswith("; 1 fail."), line


def test_the_committed_table_is_read_back_as_it_was_written(tmp_path):
    """--merge_markdown: the rows and run records of a results file (its --json files gone) come back as
    markdown() wrote them, an escaped | included, so that a rerun of some files rewrites it unchanged elsewhere."""
    rows = [dict(file="models/A.py", status="runs (rounding-sensitive)", difference="2.5e-05 (mspe)", micro="3.1e-02",
                 reload="same metrics", contract="14/14", seconds="145", note="max |difference| 1.19e-07; two"),
            dict(file="models/M.py", status="refused", difference="", micro="", reload="", contract="", seconds="9",
                 note="error: pip install m")]
    runs = [tslib_models.run_record(f"python lab/tslib_models.py --files {name}", 10.0 * n, 1)
            for n, name in enumerate("AM", 1)]
    text = tslib_models.markdown(rows, [("Chronos", "wraps a | model")], tmp_path, runs)
    (tmp_path / "t.md").write_text(text)
    again, records = tslib_models.markdown_rows(tmp_path / "t.md")
    assert again == rows and records == runs
    alone = tslib_models.markdown(rows, [], tmp_path, runs[:1])  # one run: its record alone, not a list
    (tmp_path / "one.md").write_text(alone)
    assert tslib_models.markdown_rows(tmp_path / "one.md")[1] == runs[:1]
