"""benchmarks/tslib_models.py's pieces on a fake TSLib checkout (CI has no real one): which files are
long-term forecasting, the scratch copy with one file dropped in, the refusal of a file whose package is not
installed, the contract tests it selects, and the metrics it compares."""
import pytest

from benchmarks import tslib_models

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
    for name in ("run.py", "models/DLinear.py", "tests/test_model_contract.py", "benchmarks/tslib_models.py"):
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
    [line] = tslib_models.tslib_alike(root, "Narrow", [failure, INVARIANCE])
    assert line == f"TSLib's own Narrow.py at --features MS: RuntimeError: {ours} (the same failure: the file's own)"
    [line] = tslib_models.tslib_alike(root, "Narrow", [failure.replace("192x7", "192x6")])
    assert line.endswith("(ours differs from TSLib's)"), line
    assert tslib_models.tslib_alike(root, "Narrow", [INVARIANCE]) == []


def test_a_merged_results_file_names_every_run_its_rows_come_from(tmp_path):
    """--merge: a file checked again replaces its earlier row, and the header names each run's command, date,
    commit and seconds (the results file must say where every figure comes from)."""
    import json

    earlier = dict(command="python benchmarks/tslib_models.py --files A B", date="2026-01-01 10:00 UTC",
                   version="commit abc1234", seconds=100.0, files=2)
    rows = [dict(file=f"models/{name}.py", status="fails", difference="", reload="", contract="", seconds="50",
                 note="old") for name in "AB"]
    (tmp_path / "earlier.json").write_text(json.dumps(dict(rows=rows, seconds=100.0, run=earlier)))
    again = dict(rows[1], status="runs", note="")
    merged, runs = tslib_models.merged([again], tslib_models.run_record("python again", 60.0, 1),
                                       [str(tmp_path / "earlier.json")])
    assert [(row["file"], row["status"]) for row in merged] == [("models/A.py", "fails"), ("models/B.py", "runs")]
    text = tslib_models.markdown(merged, [], tmp_path, runs)
    assert "- `python benchmarks/tslib_models.py --files A B`, 2026-01-01 10:00 UTC, this repository's commit " \
           "abc1234, 100 s (2 files)" in text
    assert "- `python again`, " in text and ", 160 s of runs in all" in text and "**1 of 2 model files run" in text
