"""run.py's command line (utils/arguments.py): a TSLib script's command line runs unchanged but for the
data path, arguments of TSLib's other tasks are ignored with one warning, and our own arguments keep
their type checks, with a hint for a typo."""
import shlex

import pytest

from helpers import assert_ok, records, run_cli, write_etth1_shaped

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
# Arguments of TSLib's run.py for other tasks and models, which its scripts pass freely. (--use_multi_gpu
# --devices are read: DDP over those devices, tests/test_multi_gpu_flags.py.)
TSLIB_FOREIGN = ["--p_hidden_dims", "128", "128", "--distil", "--mask_rate", "0.25", "--seasonal_patterns", "Monthly"]


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
