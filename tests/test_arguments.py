"""run.py's command line (utils/arguments.py): a TSLib script's command line runs unchanged but for the
data path, every argument of TSLib's run.py is ours with TSLib's default (a model written for TSLib finds
each configs field it reads), OpenLTM's arguments that are not ours are ignored with one warning, any other
unknown argument is an error naming the closest one, and our own arguments keep their type checks. TSLib's task
names, and a model with no branch for one."""
import shlex
from unittest import mock

import pytest
import torch
from torch import nn

from helpers import assert_ok, make_args, make_experiment, records, run_cli, run_on_ranks, write_etth1_shaped

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
# Arguments of TSLib's run.py for other tasks and models, which its scripts pass freely: ours too, silently.
# (--use_multi_gpu --devices are read: DDP over those devices, tests/test_multi_gpu_flags.py.)
TSLIB_OTHERS = ["--p_hidden_dims", "128", "128", "--distil", "--mask_rate", "0.25", "--seasonal_patterns", "Monthly"]
# An argument TSLib's run.py no longer defines (older scripts pass it) and OpenLTM's still does: ignored, in the
# warning line
FOREIGN = ["--output_attention"]


def test_tslib_command_line_runs_unchanged_but_for_the_data_path(tmp_path):
    write_etth1_shaped(tmp_path / "ETT-small")
    command = TSLIB_DLINEAR_ETTH1.replace("$model_name", "DLinear").replace("./dataset/ETT-small/", f"{tmp_path}/ETT-small/")
    argv = shlex.split(command.replace("\\\n", " "))[3:]  # after `python -u run.py`
    proc = run_cli(tmp_path, *argv, "--train_epochs", 1, *TSLIB_OTHERS, *FOREIGN, "--num_threads", 1)
    assert_ok(proc)
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: ignoring arguments run.py does not use: --output_attention "
                        "(--output_attention: no model here returns attention maps)"]
    record = records(tmp_path)[-1]
    assert (record["model"], record["data"], record["pred_len"], record["args"]["enc_in"]) == ("DLinear", "ETTh1", 96, 7)
    assert record["setting"].startswith("long_term_forecast_ETTh1_96_96_DLinear_ETTh1_ftM_sl96_ll48_pl96")


def test_our_own_arguments_keep_their_checks():
    from utils.arguments import build_parser, parse_args

    with pytest.raises(SystemExit):
        build_parser().parse_known_args(["--seq_len", "abc"])
    args = parse_args(["--use_gpu", "--seg_len", "24"])  # TSLib's bare --use_gpu too
    assert args.use_gpu is True and args.seg_len == 24 and args.ignored_args == []
    assert parse_args(["--no_use_gpu"]).use_gpu is False


@pytest.mark.parametrize("argv, line", [
    (["--learning_rat", "0.01"], "error: unknown argument --learning_rat; did you mean --learning_rate? "),
    (["--lerning_rate=0.01"], "error: unknown argument --lerning_rate; did you mean --learning_rate? "),
    (["-learning_rate", "0.01"], "error: unknown argument -learning_rate; did you mean --learning_rate? "),
    (["--embed_type", "0"], "error: unknown argument --embed_type; did you mean --embed? "),  # no TSLib run.py's
    (["--seq_len", "96", "48"], "error: unexpected value '48' with no argument before it that takes it"),
    (["--output_attention", "1"], "error: unexpected value '1'"),  # a switch in OpenLTM's run.py too
])
def test_an_argument_no_run_py_defines_is_an_error_naming_the_closest(capsys, argv, line):
    """A misspelt flag used to be ignored with a warning, and the run trained at the default learning rate."""
    from utils.arguments import parse_args

    with pytest.raises(SystemExit) as stop:
        parse_args(["--model", "DLinear", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err


# Every argument of thuml/OpenLTM's run.py (commit 0b30050, 2026-03-22), as `git show HEAD:run.py` lists them.
OPENLTM_ARGUMENTS = (
    "--task_name --is_training --model_id --model --seed --data --root_path --data_path --checkpoints --test_flag "
    "--seq_len --input_token_len --output_token_len --test_seq_len --test_pred_len --dropout --e_layers --d_model "
    "--n_heads --d_ff --activation --covariate --node_num --node_list --use_norm --nonautoregressive --test_dir "
    "--test_file_name --output_attention --visualize --flash_attention --adaptation --pretrain_model_path "
    "--subset_rand_ratio --num_workers --itr --train_epochs --batch_size --patience --learning_rate --des --loss "
    "--lradj --cosine --tmax --weight_decay --valid_last --last_token --gpu --ddp --dp --devices --gpt_layers "
    "--patch_size --kernel_size --stride --n_vars --factor --mode --AP_levels --use_decoder --d_mode --layers "
    "--hidden_dim --ts_vocab_size --domain_des --llm_model --llm_layers").split()


def test_exactly_openltms_other_arguments_are_accepted_and_ignored():
    """Those of OpenLTM's run.py arguments that are not ours, and no other, are kept aside for the warning
    line (TSLib's are all ours: test_every_tslib_argument_is_ours_with_tslibs_default)."""
    from utils.arguments import OPENLTM_ONLY, OPENLTM_SWITCHES, build_parser, describe_ignored, parse_args

    ours = {o for action in build_parser()._actions for o in action.option_strings}
    assert set(OPENLTM_ONLY) == set(OPENLTM_ARGUMENTS) - ours
    argv = [token for name in OPENLTM_ONLY for token in ([name] if name in OPENLTM_SWITCHES else [name, "7"])]
    args = parse_args(["--learning_rate", "0.01", *argv])
    assert args.learning_rate == 0.01 and args.ignored_args == argv
    line = describe_ignored(["--gpt_layers", "6", "--patch_size=4", "--AP_levels", "-1", "--flash_attention"])
    assert line == ("--gpt_layers 6 --patch_size=4 --AP_levels -1 --flash_attention (--gpt_layers, --patch_size, "
                    "--AP_levels: OpenLTM's, read by its GPT4TS, TTM, Time-LLM and AutoTimes, which are not models "
                    "here; --flash_attention: attention here always runs through PyTorch's fused "
                    "scaled_dot_product_attention)")


# ---------------------------------------------------------------- TSLib's configs
# Every argument of thuml/Time-Series-Library's run.py (commit 4e938a1, 2026-04-18) with its default there
# (--no_use_gpu is --use_gpu's other spelling).
TSLIB_DEFAULTS = {
    "task_name": "long_term_forecast", "is_training": 1, "model_id": "test", "model": "Autoformer", "data": "ETTh1",
    "root_path": "./data/ETT/", "data_path": "ETTh1.csv", "features": "M", "target": "OT", "freq": "h",
    "checkpoints": "./checkpoints/", "seq_len": 96, "label_len": 48, "pred_len": 96, "seasonal_patterns": "Monthly",
    "inverse": False, "mask_rate": 0.25, "anomaly_ratio": 0.25, "expand": 2, "d_conv": 4, "tv_dt": 0, "tv_B": 0,
    "tv_C": 0, "use_D": 0, "top_k": 5, "num_kernels": 6, "enc_in": 7, "dec_in": 7, "c_out": 7, "d_model": 512,
    "n_heads": 8, "e_layers": 2, "d_layers": 1, "d_ff": 2048, "moving_avg": 25, "factor": 1, "distil": True,
    "dropout": 0.1, "embed": "timeF", "activation": "gelu", "channel_independence": 1, "decomp_method": "moving_avg",
    "use_norm": 1, "down_sampling_layers": 0, "down_sampling_window": 1, "down_sampling_method": None, "seg_len": 96,
    "num_workers": 10, "itr": 1, "train_epochs": 10, "batch_size": 32, "patience": 3, "learning_rate": 0.0001,
    "des": "test", "loss": "MSE", "lradj": "type1", "use_amp": False, "use_gpu": True, "gpu": 0, "gpu_type": "cuda",
    "use_multi_gpu": False, "devices": "0,1,2,3", "p_hidden_dims": [128, 128], "p_hidden_layers": 2, "use_dtw": False,
    "augmentation_ratio": 0, "seed": 2, "jitter": False, "scaling": False, "permutation": False,
    "randompermutation": False, "magwarp": False, "timewarp": False, "windowslice": False, "windowwarp": False,
    "rotation": False, "spawner": False, "dtwwarp": False, "shapedtwwarp": False, "wdba": False, "discdtw": False,
    "discsdtw": False, "extra_tag": "", "patch_len": 16, "node_dim": 10, "gcn_depth": 2, "gcn_dropout": 0.3,
    "propalpha": 0.3, "conv_channel": 32, "skip_channel": 32, "individual": False, "alpha": 0.1, "top_p": 0.5, "pos": 1}
# Ours where they differ, as docs/command_line.md lists them: what the data decides, this repository's layout
# and built-in data, loader workers (batches are gathered in one op here), the seed TSLib's run.py fixes
# everything with (its --seed seeds only augmentation), every visible GPU.
OUR_DEFAULTS = {"model": "DLinear", "data": "synthetic", "root_path": "./dataset/", "target": None, "enc_in": None,
                "dec_in": None, "c_out": None, "num_workers": 0, "des": "exp", "gpu": None, "devices": None, "seed": 2021}


def test_every_tslib_argument_is_ours_with_tslibs_default():
    from utils.arguments import parse_args

    args = vars(parse_args([]))
    assert {name: args.get(name, "(missing)") for name in TSLIB_DEFAULTS} == {**TSLIB_DEFAULTS, **OUR_DEFAULTS}
    assert parse_args(["--distil"]).distil is False  # TSLib's inverted flag: given, no distilling


def test_tslibs_model_arguments_are_part_of_what_a_checkpoint_must_match():
    from utils.arguments import MODEL_SHAPING_ARGS
    from utils.checkpoint import IDENTITY_ARGS

    for name in ("seg_len", "distil", "expand", "d_conv", "p_hidden_dims", "node_dim", "top_p", "pos"):
        assert name in MODEL_SHAPING_ARGS and name in IDENTITY_ARGS, name


def test_tslibs_extras_that_would_change_its_results_are_named_in_the_warning():
    from utils.arguments import describe_ignored, parse_args

    assert parse_args(["--jitter", "--extra_tag", "x", "--mask_rate", "0.5"]).ignored_args == []  # TSLib's no-ops
    args = parse_args(["--augmentation_ratio", "2", "--jitter", "--use_dtw"])
    assert describe_ignored(args.ignored_args) == (
        "--use_dtw --augmentation_ratio 2 --jitter (--use_dtw: TSLib's DTW metric is not computed here; "
        "--augmentation_ratio: TSLib's training-data augmentation is not done here: training sees the data as it is)")


class SegmentModel(nn.Module):
    """A model written for TSLib (its SegRNN's way): configs fields this codebase's zoo does not read."""

    def __init__(self, configs):
        super().__init__()
        self.seg_len, self.hidden = configs.seg_len, configs.p_hidden_dims
        assert configs.distil is True and configs.num_kernels == 6  # TSLib's defaults
        self.linear = nn.Linear(configs.seq_len, configs.pred_len)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        return self.linear(x_enc.transpose(1, 2)).transpose(1, 2)


class TaskBranchingModel(SegmentModel):
    """TSLib's models' forward: a branch per task it does, and None for any other."""

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if self.task_name == "classification":
            return super().forward(x_enc)
        return None

    def __init__(self, configs):
        super().__init__(configs)
        self.task_name = configs.task_name


SMALL = ["--synthetic_rows", 1500, "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--num_threads", 1]


def _user_experiment(model_class, *argv):
    with mock.patch("exp.settings.get_model_class", return_value=model_class):
        return make_experiment(make_args("--model", model_class.__name__, *SMALL, *argv))


def test_a_tslib_model_finds_tslibs_configs_fields_and_trains():
    from data_provider.data_factory import data_provider

    exp = _user_experiment(SegmentModel)
    assert (exp.raw_model.seg_len, exp.raw_model.hidden) == (96, [128, 128])
    optimizer = exp.make_optimizer()
    before = exp.raw_model.linear.weight.detach().clone()
    exp.train_step([next(iter(data_provider(exp.args, "train")[1]))], optimizer)
    assert not torch.equal(before, exp.raw_model.linear.weight)
    assert _user_experiment(SegmentModel, "--seg_len", 12).raw_model.seg_len == 12


def _forward_returning_none(rank, world_size):
    """The training forward of a model with no branch for the task, on each rank (DDP-wrapped on 2)."""
    from data_provider.data_factory import data_provider
    from exp.forward import forward
    from utils.errors import UserError

    exp = _user_experiment(TaskBranchingModel, *(["--ddp"] if world_size > 1 else []))
    batch = next(iter(data_provider(exp.args, "train")[1]))
    try:
        forward(exp.model, batch, exp.args, "train", exp.device)
    except UserError as problem:  # run.py prints an agreed one on rank 0, and every rank leaves together
        return type(problem).__name__, str(problem)
    return None


def test_a_model_returning_none_ends_in_one_line_naming_model_and_task():
    expected = ("model TaskBranchingModel returned None for --task_name long_term_forecast: its forward has no "
                "branch for this task; give a task it forecasts (TSLib's models: --task_name long_term_forecast), "
                "or have its forward return the forecast")
    assert _forward_returning_none(0, 1) == ("AgreedError", expected)
    assert run_on_ranks(_forward_returning_none, 2) == [("AgreedError", expected)] * 2


def test_openltms_forecast_task_is_for_its_token_models():
    from exp.settings import resolve_args
    from utils.errors import UserError

    resolve_args(make_args("--task_name", "forecast", "--model", "timer_xl", *SMALL[:2]), 1)
    with pytest.raises(UserError, match="^--task_name forecast is OpenLTM's name for its token models"):
        resolve_args(make_args("--task_name", "forecast", *SMALL[:2]), 1)
