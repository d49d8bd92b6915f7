"""OpenLTM's Timer and Timer-XL scripts run unchanged (issue 23, item 1): every command line of
thuml/OpenLTM's scripts/supervised/rolling_forecast/timer*.sh, scripts/adaptation/*/timer_xl_etth1.sh and
scripts/pretrain/timer_xl_*.sh goes through run.py as written, followed only by tiny sizes and where the
data lies here. No script is copied: the command lines are written out below as data (bash's expansion
of each script: $seq_len, the for loops), each under its script's path; with OPENLTM_DIR pointing at an
OpenLTM checkout the test reads them from the scripts themselves, and checks the data below against them.

Beside them, what the scripts rely on, checked alone: the model and data names (OpenLTM's spellings and
data set classes, with OpenLTM's split rules) and --cosine (OpenLTM's CosineAnnealingLR)."""
import math
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import ETTH1, assert_ok, make_args, records, run_cli, write_etth1_shaped

OPENLTM_COMMIT = "0b30050"  # thuml/OpenLTM, the scripts transcribed below
HORIZONS = (96, 192, 336, 720)  # each rolling-forecast script's `for test_pred_len in 96 192 336 720`


def _rolling(model, data_name):
    """scripts/supervised/rolling_forecast/<model>_<data>.sh: one training, then one run per horizon."""
    if data_name == "ETTh1":
        common = (f"--root_path ./dataset/ETT-small/ --data_path ETTh1.csv --model_id ETTh1 --model {model} "
                  "--data MultivariateDatasetBenchmark --seq_len 672 --input_token_len 96 --output_token_len 96 "
                  "--test_seq_len 672 --test_pred_len {horizon} --batch_size 32 --learning_rate 0.0001 "
                  "--train_epochs 10 --d_model 1024 --d_ff 2048 --gpu 0 --lradj type1 --use_norm --e_layers 1 "
                  "--valid_last")
        testing = (f"--task_name forecast --is_training 0 {common} --test_dir forecast_ETTh1_{model}_ETTh1_Multi_sl672_"
                   "it96_ot96_lr0.0001_bt32_wd0_el1_dm1024_dff2048_nh8_cosFalse_test_0")
    else:
        common = (f"--root_path ./dataset/electricity/ --data_path electricity.csv --model_id ECL --model {model} "
                  "--data MultivariateDatasetBenchmark --seq_len 672 --input_token_len 96 --output_token_len 96 "
                  "--test_seq_len 672 --test_pred_len {horizon} --e_layers 5 --d_model 512 --d_ff 2048 "
                  "--batch_size 4 --learning_rate 0.0005 --train_epochs 10 --gpu 0 --cosine --tmax 10 --use_norm "
                  "--valid_last")
        # the ECL scripts' testing loop trains again (--is_training 1): OpenLTM then ignores --test_dir
        testing = (f"--task_name forecast --is_training 1 {common} --test_dir forecast_ECL_{model}_Custom_Multi_sl672_"
                   "it96_ot96_lr0.0005_bt4_wd0_el5_dm512_dff2048_nh8_cosTrue_test_0")
    training = f"--task_name forecast --is_training 1 {common}".format(horizon=96)
    return [training, *(testing.format(horizon=h) for h in HORIZONS)]


_ADAPTATION = ("--task_name forecast --is_training 1 --root_path ./dataset/ETT-small/ --data_path ETTh1.csv "
               "--model_id ETTh1_{shots} --model timer_xl --data UnivariateDatasetBenchmark --seq_len 2880 "
               "--input_token_len 96 --output_token_len 96 --test_seq_len 2880 --test_pred_len 96 --e_layers 8 "
               "--d_model 1024 --d_ff 2048 --batch_size 2048 --learning_rate 5e-6 --train_epochs 10 --gpu 0 --cosine "
               "--tmax 10 --use_norm --adaptation --pretrain_model_path checkpoints/timer_xl/checkpoint.pth")
COMMAND_LINES = {  # script path in OpenLTM -> its run.py command lines, after `python -u run.py`
    "scripts/supervised/rolling_forecast/timer_etth1.sh": _rolling("timer", "ETTh1"),
    "scripts/supervised/rolling_forecast/timer_ecl.sh": _rolling("timer", "ECL"),
    "scripts/supervised/rolling_forecast/timer_xl_etth1.sh": _rolling("timer_xl", "ETTh1"),
    "scripts/supervised/rolling_forecast/timer_xl_ecl.sh": _rolling("timer_xl", "ECL"),
    "scripts/adaptation/full_shot/timer_xl_etth1.sh": [_ADAPTATION.format(shots="full_shot")],
    "scripts/adaptation/few_shot/timer_xl_etth1.sh": [_ADAPTATION.format(shots="few_shot") + " --subset_rand_ratio 0.5"],
    "scripts/pretrain/timer_xl_utsd.sh": [
        "--task_name forecast --is_training 1 --root_path ./dataset/UTSD-full-npy --model_id utsd --model timer_xl "
        "--data Utsd_Npy --seq_len 2880 --input_token_len 96 --output_token_len 96 --test_seq_len 2880 "
        "--test_pred_len 96 --e_layers 8 --d_model 1024 --d_ff 2048 --batch_size 16384 --learning_rate 0.00005 "
        "--train_epochs 10 --gpu 0 --cosine --tmax 10 --use_norm --valid_last --dp --devices 0,1,2,3,4,5,6,7"],
    "scripts/pretrain/timer_xl_multivariate.sh": [
        "--task_name forecast --is_training 1 --root_path ./path/to/dataset/ --data_path dataset.csv --model_id "
        "multivariate_pretrain --model timer_xl --data MultivariateDatasetBenchmark --seq_len 3072 --input_token_len 96 "
        "--output_token_len 96 --test_seq_len 3072 --test_pred_len 96 --e_layers 4 --d_model 512 --d_ff 2048 "
        "--batch_size 4096 --learning_rate 0.0001 --train_epochs 10 --gpu 0 --cosine --tmax 10 --dp "
        "--devices 0,1,2,3,4,5,6,7"],
    "scripts/pretrain/timer_xl_era5.sh": [
        "--task_name forecast --is_training 1 --root_path ./dataset/era5_pretrain/ --data_path pretrain.npy --model_id "
        "era5_pretrain --model timer_xl --data Era5_Pretrain --seq_len 3072 --input_token_len 96 --output_token_len 96 "
        "--test_seq_len 3072 --test_pred_len 96 --e_layers 4 --d_model 512 --d_ff 2048 --batch_size 40960 "
        "--learning_rate 0.0001 --train_epochs 10 --gpu 0 --cosine --tmax 10 --dp --devices 0,1,2,3,4,5,6,7"],
}
# Appended to every command line: tiny sizes (2 optimizer steps), outputs under the test's folder; --dp's
# scripts also get one device (the 2-process launch of --dp / --use_multi_gpu: tests/test_multi_gpu_flags.py).
TINY = ["--seq_len", 48, "--test_seq_len", 48, "--input_token_len", 24, "--output_token_len", 24, "--d_model", 16,
        "--d_ff", 32, "--n_heads", 2, "--e_layers", 1, "--batch_size", 32, "--eval_batch_size", 512,
        "--train_steps", 2, "--num_threads", 1, "--quiet"]
SPAN = 48 + 24  # a training window: seq_len + output_token_len


def from_script(path):
    """The run.py command lines a script runs, as bash expands them (its `python` replaced by a recorder)."""
    recorder = 'python() { shift 2; printf "%s\\x1f" "$@"; printf "\\n"; }; source "$1"'
    out = subprocess.run(["bash", "-c", recorder, "_", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.rstrip("\x1f").split("\x1f") for line in out.splitlines()]


def command_lines(script):
    """The script's command lines: from the OpenLTM checkout that OPENLTM_DIR names, or written out above."""
    checkout = os.environ.get("OPENLTM_DIR")
    if checkout:
        return from_script(Path(checkout) / script)
    return [shlex.split(line) for line in COMMAND_LINES[script]]


@pytest.mark.skipif(not os.environ.get("OPENLTM_DIR"), reason="set OPENLTM_DIR to an OpenLTM checkout")
def test_the_written_out_command_lines_are_openltms():
    checkout = Path(os.environ["OPENLTM_DIR"])
    for script, lines in COMMAND_LINES.items():
        assert from_script(checkout / script) == [shlex.split(line) for line in lines], script


# ---------------------------------------------------------------- the data the scripts read, small
ECL_ROWS = 4000
UTSD_FILES = {"a/x.npy": (3000, 2), "b/y.npy": (2000, 1), "b/short.npy": (50, 1)}  # rows, channels


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("openltm")
    ett = ETTH1.parent if ETTH1.exists() else write_etth1_shaped(root / "ETT-small")
    rng = np.random.default_rng(0)
    steps = np.arange(ECL_ROWS)  # the test split (20 %) holds the 720-step horizon
    ecl = pd.DataFrame({"date": pd.date_range("2016-07-01", periods=ECL_ROWS, freq="h").astype(str)})
    for c in range(3):
        ecl[f"MT_{c}"] = np.sin(2 * np.pi * steps / 24 + c) + 0.1 * rng.normal(size=ECL_ROWS)
    ecl["OT"] = np.cos(2 * np.pi * steps / 24) + 0.1 * rng.normal(size=ECL_ROWS)
    (root / "electricity").mkdir()
    ecl.to_csv(root / "electricity" / "electricity.csv", index=False)
    for name, (rows, channels) in UTSD_FILES.items():
        (root / "utsd" / name).parent.mkdir(parents=True, exist_ok=True)
        np.save(root / "utsd" / name, np.sin(np.arange(rows * channels) / 7.0).reshape(rows, channels))
    (root / "era5").mkdir()
    np.save(root / "era5" / "pretrain.npy", rng.normal(size=(600, 5)).cumsum(axis=0))
    return {"ETTh1.csv": ["--root_path", f"{ett}/"], "electricity.csv": ["--root_path", f"{root}/electricity/"],
            "Utsd_Npy": ["--root_path", root / "utsd"], "pretrain.npy": ["--root_path", f"{root}/era5/"],
            "dataset.csv": ["--root_path", f"{root}/electricity/", "--data_path", "electricity.csv"]}


def where_data_lies(argv, data):
    """The trailing arguments that point a command line at the small data above."""
    for key, extra in data.items():
        if key in argv:
            return extra
    raise AssertionError(f"no data for {argv}")


def run_script(script, outputs, data, extra=()):
    """Every command line of `script`, in order, each followed by TINY and where its data lies; their records."""
    before = len(records(outputs)) if (outputs / "results" / "results.jsonl").exists() else 0
    logs = []
    for argv in command_lines(script):
        one_device = ["--devices", 0] if "--dp" in argv else []
        proc = run_cli(outputs, *argv, *TINY, *one_device, *where_data_lies(argv, data), *extra)
        assert_ok(proc)
        logs.append(proc.stdout + proc.stderr)
    return records(outputs)[before:], logs


@pytest.fixture(scope="module")
def pretrained(data, tmp_path_factory):
    """scripts/pretrain/timer_xl_utsd.sh's run: TimerXL pre-trained on UTSD's .npy files (OpenLTM's 0.9 split)."""
    outputs = tmp_path_factory.mktemp("pretrain")
    (record,), _ = run_script("scripts/pretrain/timer_xl_utsd.sh", outputs, data)
    return record, outputs / "checkpoints" / record["setting"] / "checkpoint.pth"


@pytest.mark.parametrize("model", ["timer", "timer_xl"])
def test_rolling_forecast_etth1_trains_once_and_rolls_out_every_horizon(tmp_path, data, model):
    trained, *rolled = run_script(f"scripts/supervised/rolling_forecast/{model}_etth1.sh", tmp_path, data)[0]
    name = {"timer": "Timer", "timer_xl": "TimerXL"}[model]
    assert [r["model"] for r in (trained, *rolled)] == [name] * 5  # OpenLTM's spelling, the registry's model
    assert trained["data"] == "MultivariateDatasetBenchmark" and trained["args"]["enc_in"] == 7
    assert [r["args"]["is_training"] for r in rolled] == [0] * 4
    assert [r["args"]["test_pred_len"] for r in rolled] == list(HORIZONS)
    # ETTh1.csv gets the ETT borders: 12 months of training rows, 4 of test, test windows start seq_len early
    assert trained["train_windows"] == 12 * 30 * 24 - SPAN + 1
    assert [r["test_windows"] for r in rolled] == [4 * 30 * 24 + 48 - 48 - h + 1 for h in HORIZONS]
    # --test_dir names a folder no run writes (OpenLTM's scripts carry an older setting format): the weights
    # these same arguments trained are evaluated, so the 96 roll-out is the training run's own test
    assert {r["setting"] for r in rolled} == {trained["setting"]}
    assert rolled[0]["mse"] == pytest.approx(trained["mse"], rel=1e-6)
    assert all(math.isfinite(r["mse"]) for r in rolled)


@pytest.mark.parametrize("model", ["timer", "timer_xl"])
def test_rolling_forecast_ecl_trains_for_every_horizon_with_cosine(tmp_path, data, model):
    runs, logs = run_script(f"scripts/supervised/rolling_forecast/{model}_ecl.sh", tmp_path, data)
    assert [r["args"]["test_pred_len"] for r in runs] == [96, *HORIZONS]
    assert all(r["args"]["is_training"] == 1 and r["args"]["cosine"] and r["args"]["tmax"] == 10 for r in runs)
    assert runs[0]["args"]["enc_in"] == 4 and runs[0]["args"]["learning_rate"] == 0.0005
    # a training run does not read --test_dir (nor does OpenLTM's): named once, with the reason
    assert "warning: ignoring arguments run.py does not use: --test_dir forecast_ECL_" in logs[1]
    assert "--test_dir: read with --is_training 0 only" in logs[1]
    assert runs[1]["mse"] == pytest.approx(runs[0]["mse"], rel=1e-6)  # the same training, the same test


def test_utsd_pretraining_splits_every_file_as_openltm(pretrained):
    """UTSD_Npy: every .npy under --root_path, each channel a series, int(0.9 x rows) training rows and
    int(rows x (1 - 0.9) / 2) test rows (149 of 3000, not 150: OpenLTM's float rounding); a series whose
    training part is shorter than a window adds none (OpenLTM skips such files)."""
    record, checkpoint = pretrained
    assert record["data"] == "Utsd_Npy" and record["model"] == "TimerXL" and checkpoint.exists()
    assert record["world_size"] == 1 and record["args"]["dp"]  # --dp --devices 0: one process on device 0
    assert record["train_windows"] == 2 * (2700 - SPAN + 1) + (1800 - SPAN + 1)
    history, horizon = 48, 96
    assert record["test_windows"] == 2 * (149 + history - (48 + horizon) + 1) + (99 + history - (48 + horizon) + 1)


@pytest.mark.parametrize("shots", ["full_shot", "few_shot"])
def test_adaptation_fine_tunes_the_pretrained_checkpoint(tmp_path, data, pretrained, shots):
    """The script's --pretrain_model_path (checkpoints/timer_xl/checkpoint.pth, relative to OpenLTM's
    folder) is pointed at the UTSD pre-training's checkpoint."""
    (record,), _ = run_script(f"scripts/adaptation/{shots}/timer_xl_etth1.sh", tmp_path, data,
                              ["--pretrain_model_path", pretrained[1]])
    assert record["data"] == "UnivariateDatasetBenchmark" and record["args"]["enc_in"] == 1
    assert record["args"]["adaptation"] and record["args"]["cosine"]
    every_window = 7 * (12 * 30 * 24 - SPAN + 1)  # 7 ETTh1 channels, each a series with the ETT borders
    assert record["train_windows"] == (every_window if shots == "full_shot" else round(every_window / 2))


def test_multivariate_and_era5_pretraining_scripts_run(tmp_path, data):
    (multivariate,), _ = run_script("scripts/pretrain/timer_xl_multivariate.sh", tmp_path, data)
    assert multivariate["args"]["enc_in"] == 4 and multivariate["train_windows"] == int(ECL_ROWS * 0.7) - SPAN + 1
    (era5,), _ = run_script("scripts/pretrain/timer_xl_era5.sh", tmp_path, data)
    # Era5_Pretrain: the first int(0.8 x 5) = 4 columns of pretrain.npy, each a series, 70/10/20
    assert era5["data"] == "Era5_Pretrain" and era5["train_windows"] == 4 * (int(600 * 0.7) - SPAN + 1)


# ---------------------------------------------------------------- the names and schedule, alone
def test_model_names_are_the_registrys_in_any_spelling():
    from models import available_models, canonical_name

    assert canonical_name("timer_xl") == "TimerXL" and canonical_name("timer") == "Timer"
    assert canonical_name("TIMER-XL") == "TimerXL" and canonical_name("dlinear") == "DLinear"
    assert all(canonical_name(name.lower()) == name for name in available_models())  # no list kept by hand
    assert canonical_name("nope") == "nope" and make_args("--model", "patchtst").model == "PatchTST"


@pytest.mark.parametrize("name, rows, ends", [
    ("ETTh1.csv", 17420, [8640, 11520, 14400]), ("ETTh.csv", 17420, [8640, 11520, 14400]),
    ("ETTm2.csv", 69680, [34560, 46080, 57600]), ("electricity.csv", 26304, [18412, 21044, 26304])])
def test_multivariate_benchmark_splits_by_the_files_name(tmp_path, name, rows, ends):
    """OpenLTM's MultivariateDatasetBenchmark: the ETT borders for a file named ETTh*/ETTm*, else 70/10/20."""
    from data_provider.data_factory import prepared_data

    pd.DataFrame({"a": np.arange(rows, dtype=float), "OT": np.ones(rows)}).to_csv(tmp_path / name, index=False)
    args = make_args("--data", "MultivariateDatasetBenchmark", "--root_path", tmp_path, "--data_path", name)
    assert list(prepared_data(args).ends) == ends


def test_utsd_split_is_openltms():
    from data_provider.openltm_data import utsd_split_ends

    assert utsd_split_ends(3000) == [2700, 2851, 3000]  # 149 test rows: int(3000 * (1 - 0.9) / 2) in floats
    assert utsd_split_ends(1000) == [900, 951, 1000]


def test_cosine_is_openltms_cosine_annealing():
    """--cosine --tmax T: torch's CosineAnnealingLR(T_max=T, eta_min=1e-8), stepped after every epoch
    (past T it rises again, as torch's does), whatever --lradj says."""
    import torch

    from utils.tools import learning_rate_for_epoch

    optimizer = torch.optim.Adam(torch.nn.Linear(1, 1).parameters(), lr=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4, eta_min=1e-8)
    args = make_args("--cosine", "--tmax", 4, "--learning_rate", 5e-4, "--lradj", "type1")
    for epoch in range(1, 12):
        assert learning_rate_for_epoch(args, epoch) == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-9), epoch
        optimizer.step()
        schedule.step()


def test_visualize_and_attention_flags_are_accepted():
    from utils.arguments import describe_ignored, parse_args

    assert parse_args(["--no_plots", "--visualize"]).no_plots is False  # OpenLTM's --visualize draws
    args = parse_args(["--flash_attention", "--output_attention"])
    assert describe_ignored(args.ignored_args) == (
        "--flash_attention --output_attention (--flash_attention: attention here always runs through PyTorch's "
        "fused scaled_dot_product_attention; --output_attention: no model here returns attention maps)")


def test_the_openltm_checkout_reader_expands_loops(tmp_path):
    """from_script expands variables and loops as bash does (what OPENLTM_DIR's scripts need)."""
    script = tmp_path / "s.sh"
    script.write_text("export CUDA_VISIBLE_DEVICES=0\nn=7\nfor h in 96 192\ndo\npython -u run.py \\\n  --a $[$n*2] \\\n"
                      "  --h $h\ndone\n")
    assert from_script(script) == [["--a", "14", "--h", "96"], ["--a", "14", "--h", "192"]]
    assert shutil.which("bash")
