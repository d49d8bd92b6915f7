"""The command line: every argument run.py takes, in groups that also serve as lists.

Argument names follow thuml's Time-Series-Library and OpenLTM so their scripts port over.
The groups are the one place an argument is classified: `DATA_ARGS` (what decides the
prepared data, hence the data cache key) and `MODEL_SHAPING_ARGS` (what a checkpoint
must match) are read from them, never kept by hand.
"""
import argparse
import difflib
import functools
import math
import re
import sys
import time

DATA_GROUP, WINDOW_GROUP, MODEL_GROUP = "data", "forecasting window", "model"
LORA_GROUP = "LoRA fine-tuning (peft)"
SEED_LIMIT = 2 ** 32  # numpy's seeds are 32-bit; --itr adds its run index
TSLIB_OTHER_GROUP = "TSLib's other tasks and tools (accepted, not done here)"
# What this codebase does: TSLib's long-term forecasting, OpenLTM's forecast task (the same thing, for its
# token models: exp.settings.check_task_fits_model), TSLib's zero-shot forecasting (pre-trained weights
# evaluated without training) and TSLib's short-term forecasting of M4 (--data m4, exp.short_term).
FORECAST_TASKS = ("long_term_forecast", "forecast", "zero_shot_forecast", "short_term_forecast")
# TSLib's other tasks, refused in one line (exp.settings.check_task)
OTHER_TSLIB_TASKS = ("imputation", "anomaly_detection", "classification")
# TSLib's data augmentation presets (its run.py's "Augmentation" flags), applied only with --augmentation_ratio > 0
TSLIB_AUGMENTATIONS = ("jitter", "scaling", "permutation", "randompermutation", "magwarp", "timewarp", "windowslice",
                       "windowwarp", "rotation", "spawner", "dtwwarp", "shapedtwwarp", "wdba", "discdtw", "discsdtw")


def _number(kind, ok, wanted):
    """An argparse type: an int or float that also satisfies `ok`, else why not (run.py's one line)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'}, got '{text}'") from None
        # NaN and inf would pass on into the loss silently
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text}")
        return value
    return parse


positive_int = _number(int, lambda v: v > 0, "positive")
non_negative_int = _number(int, lambda v: v >= 0, ">= 0")
seed_int = _number(int, lambda v: 0 <= v < SEED_LIMIT, f"in [0, {SEED_LIMIT})")
positive_float = _number(float, lambda v: v > 0, "positive")
non_negative_float = _number(float, lambda v: v >= 0, ">= 0")
probability = _number(float, lambda v: 0 <= v < 1, "in [0, 1)")
fraction = _number(float, lambda v: 0 < v <= 1, "in (0, 1]")
flag_int = _number(int, lambda v: v in (0, 1), "0 or 1")


def device_list(text):
    """--devices: TSLib's and OpenLTM's comma-separated GPU numbers ('0,1,2,3'), as a tuple of ints."""
    parts = text.replace(" ", "").split(",")
    if not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"must be GPU numbers separated by commas, such as 0,1, got '{text}'")
    devices = tuple(int(part) for part in parts)
    if len(set(devices)) != len(devices):
        raise argparse.ArgumentTypeError(f"must name each GPU once, got '{text}'")
    return devices


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument ends in one line that says what to do (no usage block), from one process."""

    def error(self, message):
        match = re.match(r"argument ([^:/]+)[^:]*: (.*)", message)
        if match:
            flag, reason = match.groups()
            action = next((a for a in self._actions if flag in a.option_strings), None)
            default = "" if action is None or action.default in (None, argparse.SUPPRESS) else f" ({action.default})"
            message = f"{flag}{' ' if reason.startswith('must') else ': '}{reason}; leave it out for the default{default}"
        self.fail(f"{message}, or see python run.py --help")

    def fail(self, line):
        """`error: line` from rank 0 alone, and exit 2 on every process."""
        from utils import distributed, worker

        if distributed.env_rank() != 0:
            worker.end_job_on_user_error()  # another node's agent: restarting cannot help
            # under torchrun every worker parses the same command line, and the agent stops them
            # all once one exits: let rank 0 print first
            time.sleep(10)
            sys.exit(2)
        print(f"error: {line}", file=sys.stderr, flush=True)
        worker.end_job_on_user_error()
        sys.exit(2)


def str2bool(value):
    if isinstance(value, bool):
        return value
    if value.lower() in ("1", "true", "yes", "y"):
        return True
    if value.lower() in ("0", "false", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false/1/0), got '{value}'")


def add_device_arguments(g):
    """--use_gpu, --no_use_gpu and --gpu, which utils.distributed.setup turns into the device (run.py's, and
    benchmarks.gift_eval's)."""
    g.add_argument("--use_gpu", type=str2bool, nargs="?", const=True, default=True, help="use CUDA when available")
    g.add_argument("--no_use_gpu", dest="use_gpu", action="store_false", default=argparse.SUPPRESS,
                   help="TSLib's spelling of --use_gpu false")
    g.add_argument("--gpu", type=non_negative_int, default=None,
                   help="the GPU of a single-process run (default 0); under --ddp each process uses its LOCAL_RANK's")


def build_parser():
    # allow_abbrev=False: an unknown TSLib flag must never be taken for a prefix of one of ours
    p = Parser(description="Time-series forecasting with exact DistributedDataParallel",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    g = p.add_argument_group("basic")
    g.add_argument("--task_name", default="long_term_forecast",
                   help="TSLib's long_term_forecast or zero_shot_forecast (--is_training 0 --pretrain_model_path "
                        "FILE), or OpenLTM's forecast (its token models: Timer, TimerXL); TSLib's other tasks are "
                        "not done here")
    g.add_argument("--is_training", type=flag_int, default=1,
                   help="1: train then test; 0: evaluate saved weights without training (--checkpoint, --test_dir, "
                        "--pretrain_model_path for zero-shot, else this setting's checkpoint.pth)")
    g.add_argument("--model_id", default="test")
    g.add_argument("--model", default="DLinear",
                   help="any models/<Name>.py, in any case, with or without _ (OpenLTM's timer_xl is TimerXL)")
    g.add_argument("--des", default="exp", help="free text appended to the setting name")
    g.add_argument("--itr", type=positive_int, default=1, help="repeat the experiment; run i uses seed + i")
    g.add_argument("--seed", type=seed_int, default=2021)

    g = p.add_argument_group(DATA_GROUP)
    g.add_argument("--data", default="synthetic",
                   help="ETTh1, ETTh2, ETTm1, ETTm2, custom, synthetic (built in), univariate (every channel of every file a "
                        "series) or corpus (a built corpus folder as --root_path: python -m data_provider.corpus); "
                        "OpenLTM's MultivariateDatasetBenchmark, UnivariateDatasetBenchmark, Utsd, Utsd_Npy and "
                        "Era5_Pretrain read as OpenLTM splits them (data_provider/openltm_data.py)")
    g.add_argument("--root_path", default="./dataset/", help="folder of --data_path")
    g.add_argument("--data_path", default="ETTh1.csv", help="file under --root_path; a glob (e.g. '*.csv') with --data univariate")
    g.add_argument("--features", default="M", help="M: multi->multi, S: uni->uni, MS: multi->target")
    g.add_argument("--target", default=None, help="target column (default: OT if present, else the last column)")
    g.add_argument("--freq", default="h", help="time-feature frequency: s, t, h, d, b, w, m, y (e.g. 15min)")
    g.add_argument("--date_format", default=None,
                   help="how the 'date' column is written, in strftime's codes (e.g. '%%d.%%m.%%Y %%H:%%M'); default: "
                        "guessed, and a day and month that could be either way round decided by the whole column")
    g.add_argument("--embed", default="timeF", choices=("timeF", "fixed", "learned", "none"),
                   help="calendar features: timeF (scaled), fixed/learned (integer), none (the model sees no calendar)")
    g.add_argument("--scale", type=str2bool, default=True, help="z-score with the training split's statistics")
    g.add_argument("--seasonal_patterns", default="Monthly",
                   help="--data m4: the M4 frequency, Yearly, Quarterly, Monthly, Weekly, Daily or Hourly (TSLib's)")
    g.add_argument("--synthetic_rows", type=positive_int, default=5000, help="length of the built-in series")
    g.add_argument("--synthetic_channels", type=positive_int, default=7)
    g.add_argument("--synthetic_seed", type=seed_int, default=None, help="seed of the built-in series (default: --seed)")

    g = p.add_argument_group(WINDOW_GROUP)
    g.add_argument("--seq_len", type=positive_int, default=96, help="input length")
    g.add_argument("--label_len", type=non_negative_int, default=48, help="decoder start-token length (TSLib)")
    g.add_argument("--pred_len", type=positive_int, default=96, help="horizon")
    g.add_argument("--input_token_len", type=positive_int, default=24, help="patch/token length of token models")
    g.add_argument("--output_token_len", type=positive_int, default=24, help="steps each token predicts")
    g.add_argument("--covariate", action="store_true", help="score only the target (last) channel")

    g = p.add_argument_group("evaluation")
    g.add_argument("--test_seq_len", type=positive_int, default=None, help="token models' test input (default seq_len)")
    g.add_argument("--test_pred_len", type=positive_int, default=None, help="token models' rolled-out horizon (default pred_len)")
    g.add_argument("--last_token", action="store_true", help="score only the last token")
    g.add_argument("--nonautoregressive", action="store_true", help="token models: test with one forward, no roll-out")
    g.add_argument("--valid_last", action="store_true", help="validate on the last token only")
    g.add_argument("--test_every_epoch", type=str2bool, nargs="?", const=True, default=True,
                   help="score the test split at every evaluation during training as TSLib does (false: validation "
                        "only, the test once at the end; history and pictures then carry no test loss)")
    g.add_argument("--times_eval_periods", default="window", choices=("window", "batch"),
                   help="TimesNet in evaluation: each window's own top_k periods (it is then scored as if alone, "
                        "at any batch size and number of processes) or the batch's, as TSLib's code at batch > 1")
    g.add_argument("--val_windows", type=non_negative_int, default=0,
                   help="validate on this many windows, a fixed random subset of a huge validation split (0: all)")
    g.add_argument("--test_windows", type=positive_int, default=None,
                   help="test on this many windows, a fixed random subset of a huge test split drawn as "
                        "--val_windows draws its own (default: all; more than the split holds: all); the "
                        "records say how many of the split's windows were scored")

    g = p.add_argument_group(MODEL_GROUP)
    g.add_argument("--enc_in", type=positive_int, default=None, help="default: from the data")
    g.add_argument("--dec_in", type=positive_int, default=None, help="default: from the data")
    g.add_argument("--c_out", type=positive_int, default=None, help="default: from the data (1 with MS)")
    g.add_argument("--d_model", type=positive_int, default=512)
    g.add_argument("--n_heads", type=positive_int, default=8)
    g.add_argument("--e_layers", type=positive_int, default=2)
    g.add_argument("--d_layers", type=positive_int, default=1)
    g.add_argument("--d_ff", type=positive_int, default=2048)
    g.add_argument("--moving_avg", type=positive_int, default=25)
    g.add_argument("--dropout", type=probability, default=0.1)
    g.add_argument("--activation", default="gelu")
    g.add_argument("--use_norm", type=flag_int, nargs="?", const=1, default=1, help="instance normalisation (flag or 0/1)")
    g.add_argument("--individual", action="store_true", help="DLinear/NLinear: one linear head per channel")
    g.add_argument("--factor", type=positive_int, default=1, help="attention factor (TSLib; full attention ignores it)")
    g.add_argument("--patch_len", type=positive_int, default=16, help="PatchTST patch length")
    g.add_argument("--stride", type=positive_int, default=8, help="PatchTST patch stride")
    g.add_argument("--top_k", type=positive_int, default=5, help="TimesNet: number of FFT periods")
    g.add_argument("--num_kernels", type=positive_int, default=6, help="TimesNet: inception kernels")
    g.add_argument("--times_padding", default="zeros", choices=("zeros", "tail"),
                   help="TimesNet: what completes a period grid's last row: zeros (TSLib's code since fd74cbc, "
                        "2023-02-22) or the series' last steps repeated (its 2023-02-18 code, 230805f)")
    g.add_argument("--channel_independence", type=flag_int, default=1, help="TimeMixer: 1 mixes each channel alone")
    g.add_argument("--decomp_method", default="moving_avg", choices=("moving_avg", "dft_decomp"), help="TimeMixer: moving_avg or dft_decomp")
    g.add_argument("--down_sampling_layers", type=non_negative_int, default=0, help="TimeMixer: number of coarser scales")
    g.add_argument("--down_sampling_window", type=positive_int, default=1, help="TimeMixer: down-sampling factor per scale")
    g.add_argument("--down_sampling_method", default=None, choices=("avg", "max", "conv"), help="TimeMixer: avg, max or conv")
    g.add_argument("--timerxl_attention", default="paper", choices=("paper", "openltm"),
                   help="TimerXL: the paper's attention, or OpenLTM's code's (rotary by flattened token index, "
                        "the variable bias before scaling, its covariate mask); the same on one variable "
                        "(docs/openltm.md)")
    g.add_argument("--mark_pairing", default="window", choices=("window", "tiled"),
                   help="TimeMixer with channel independence: the calendar each channel's series is given. "
                        "window: its own window's; tiled: the official code's x_mark.repeat(C, 1, 1), "
                        "which gives series b*C+c window (b*C+c) mod B's, so a forecast depends on the "
                        "rest of its batch (only to reproduce the published figures)")
    g.add_argument("--members", default=None, metavar="MEMBER,MEMBER,...",
                   help="--model Ensemble: its members, each a release folder (DIR, or Name=DIR) or a trained "
                        "checkpoint (checkpoints/SETTING/checkpoint.pth) (docs/ensembles.md)")
    g.add_argument("--ensemble_rule", default="median", choices=("median", "mean"),
                   help="--model Ensemble: the members' quantiles combined at each level by their median or mean")
    # TSLib's run.py defines these for its other models: a model file written for TSLib reads them from configs
    g.add_argument("--seg_len", type=positive_int, default=96, help="TSLib's SegRNN: segment length")
    g.add_argument("--distil", action="store_false", default=True,
                   help="TSLib's Informer: given, the encoder does not distil (TSLib's inverted flag)")
    g.add_argument("--expand", type=positive_int, default=2, help="TSLib's Mamba: expansion factor")
    g.add_argument("--d_conv", type=positive_int, default=4, help="TSLib's Mamba: convolution kernel size")
    for name in ("tv_dt", "tv_B", "tv_C", "use_D"):
        g.add_argument(f"--{name}", type=flag_int, default=0, help="TSLib's MambaSingleLayer: 0 or 1")
    g.add_argument("--p_hidden_dims", type=positive_int, nargs="+", default=[128, 128],
                   help="TSLib's Non-stationary Transformer: the projector's hidden sizes")
    g.add_argument("--p_hidden_layers", type=positive_int, default=2, help="TSLib's Non-stationary Transformer")
    g.add_argument("--node_dim", type=positive_int, default=10, help="TSLib's graph models (MSGNet): node embedding size")
    g.add_argument("--gcn_depth", type=positive_int, default=2, help="TSLib's graph models")
    g.add_argument("--gcn_dropout", type=probability, default=0.3, help="TSLib's graph models")
    g.add_argument("--propalpha", type=non_negative_float, default=0.3, help="TSLib's graph models")
    g.add_argument("--conv_channel", type=positive_int, default=32, help="TSLib's graph models")
    g.add_argument("--skip_channel", type=positive_int, default=32, help="TSLib's graph models")
    g.add_argument("--alpha", type=non_negative_float, default=0.1, help="TSLib's TimeFilter: KNN of its graph")
    g.add_argument("--top_p", type=non_negative_float, default=0.5, help="TSLib's TimeFilter: dynamic routing")
    g.add_argument("--pos", type=flag_int, default=1, help="TSLib's TimeFilter: positional embedding, 0 or 1")

    g = p.add_argument_group("optimisation")
    g.add_argument("--train_epochs", type=positive_int, default=10)
    g.add_argument("--train_steps", type=non_negative_int, default=0,
                   help="train for this many optimizer steps, epochs going on as needed (0: --train_epochs decides)")
    g.add_argument("--eval_steps", type=non_negative_int, default=0,
                   help="validate (early stopping, best checkpoint) every N optimizer steps and after the last, "
                        "instead of at epoch ends; --patience then counts evaluations")
    g.add_argument("--batch_size", type=positive_int, default=32,
                   help="per process; the global batch is batch_size x world size x accumulation_steps")
    g.add_argument("--global_batch_size", dest="global_batch", type=positive_int, default=None,
                   help="windows per optimizer step over every process and accumulation step, split as evenly as "
                        "possible (32 on 3 processes: 10, 11 and 11); replaces --batch_size, so a recipe keeps its "
                        "steps on any number of processes")
    g.add_argument("--accumulation_steps", type=positive_int, default=1,
                   help="micro-batches per optimizer step (gradients add up; DDP all-reduces once per step)")
    g.add_argument("--lr_scaling", default="none",
                   help="scale --learning_rate by global batch / --base_batch_size: none, linear or sqrt")
    g.add_argument("--base_batch_size", type=positive_int, default=32, help="the global batch --learning_rate was tuned for")
    g.add_argument("--train_drop_last", action="store_true",
                   help="skip each epoch's last, short training batch, as Informer's loader and its copies "
                        "(LTSF-Linear, PatchTST, official TimeMixer, earlier TSLib) do; ETTh1 at horizon 96 "
                        "and batch 32 or 128 ends every epoch on a one-window step; "
                        "validation and test always score every window")
    g.add_argument("--eval_batch_size", type=positive_int, default=None,
                   help="per process, validation and test (default 4 x batch_size: no gradients are kept, "
                        "and metrics are exact sums, so it only changes speed; a model that reads its batch-mates "
                        "scores alike on any number of processes at the same --eval_batch_size)")
    g.add_argument("--patience", type=positive_int, default=3)
    g.add_argument("--learning_rate", type=non_negative_float, default=1e-4, help="0 keeps the initial weights (a baseline run)")
    g.add_argument("--lradj", default="type1", help="type1 (halve from epoch 3), type2, cosine, constant, TST (one-cycle per step, pct_start 0.2)")
    g.add_argument("--cosine", action="store_true",
                   help="OpenLTM's schedule instead of --lradj: cosine annealing from the learning rate to 1e-8 "
                        "over --tmax epochs (torch's CosineAnnealingLR, stepped once an epoch)")
    g.add_argument("--tmax", type=positive_int, default=10, help="--cosine: epochs of one half cosine period")
    g.add_argument("--weight_decay", type=non_negative_float, default=0.0)
    g.add_argument("--warmup_steps", type=non_negative_int, default=0,
                   help="linear learning-rate warm-up over the first N optimizer steps, on top of --lradj")
    g.add_argument("--clip_grad", type=non_negative_float, default=0.0,
                   help="clip the global gradient norm to this value (0: no clipping); the norm is logged")
    g.add_argument("--loss", default="MSE",
                   help="MSE or MAE (point forecasts); quantile (pinball loss at --quantiles), studentt or normal "
                        "(negative log-likelihood): probabilistic forecasts, scored by WQL, MASE and coverage too; "
                        "SMAPE or MAPE: TSLib's M4 losses (--data m4 only)")
    g.add_argument("--quantiles", default="0.05,0.1,0.2,0.25,0.3,0.4,0.5,0.6,0.7,0.75,0.8,0.9,0.95",
                   help="probabilistic losses: the quantile levels forecast and scored, comma-separated, increasing, "
                        "with 0.5 (default: GIFT-Eval's 0.1..0.9 and the ends of the 50 / 90 %% intervals)")
    g.add_argument("--num_samples", type=positive_int, default=None,
                   help="--loss studentt / normal: score quantiles of N samples a window (keyed by the window, "
                        "identical on any number of processes) instead of the exact inverse CDF")
    g.add_argument("--sampling_steps", type=positive_int, default=None,
                   help="a flow-matching release's sampler: Euler steps a sample (default: its config.json's "
                        "num_sampling_steps; docs/foundation.md)")
    g.add_argument("--decode_block_size", type=positive_int, default=None,
                   help="Toto 2.0: forecast the horizon in blocks of this many steps (whole patches), each block's "
                        "median fed back as observed (the package's decode_block_size; default: one forward, the "
                        "leaderboard setting; docs/foundation.md)")
    g.add_argument("--num_workers", type=non_negative_int, default=0, help="loader workers (batches are gathered in one op; 0 is fastest)")
    g.add_argument("--data_on_device", default="auto", choices=("auto", "always", "never"),
                   help="GPU: keep the splits in GPU memory (auto: without --num_workers, when they take at most "
                        "a quarter of the free memory)")
    g.add_argument("--use_amp", action="store_true", help="mixed precision: bf16 autocast (CPU and GPU)")
    g.add_argument("--amp_dtype", default="bf16", choices=["bf16", "fp16"], help="fp16 (GPU only) adds loss scaling")
    g.add_argument("--compile", action="store_true", help="torch.compile the training model")
    g.add_argument("--tf32", action="store_true",
                   help="GPU: TF32 matmuls and convolutions (faster on Ampere+, ~1e-3 relative error); off: exact fp32, as the CPU")
    g.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels only (torch.use_deterministic_algorithms, cuBLAS workspace, cuDNN): "
                        "bit-identical repeats on GPU, somewhat slower")
    g.add_argument("--num_threads", type=non_negative_int, default=0, help="torch threads per process (0: the cores it may use / local processes; docs/performance.md#threads)")
    g.add_argument("--keep_freed_memory", type=str2bool, nargs="?", const=True, default=True,
                   help="Linux: malloc keeps freed memory for reuse, so no step pays page faults on fresh memory "
                        "(TimeMixer's CPU step ~20%% shorter); false: glibc's defaults, which return memory sooner")

    g = p.add_argument_group("fine-tuning (OpenLTM)")
    g.add_argument("--adaptation", action="store_true", help="start training from --pretrain_model_path's weights")
    g.add_argument("--pretrain_model_path", default=None, help="checkpoint.pth of a pre-training run (same model arguments)")
    g.add_argument("--subset_rand_ratio", type=fraction, default=1.0,
                   help="few-shot: train on this random fraction of the training windows (from --seed; val/test whole)")

    g = p.add_argument_group(LORA_GROUP)
    g.add_argument("--lora_rank", type=non_negative_int, default=0,
                   help="LoRA adapters of this rank (peft; 0: full fine-tuning); only the adapters train (docs/fine_tuning.md)")
    g.add_argument("--lora_alpha", type=positive_float, default=16.0, help="LoRA scaling: adapters add alpha / rank times their product")
    g.add_argument("--lora_dropout", type=probability, default=0.0, help="dropout on the adapters' input, keyed by the sample")
    g.add_argument("--lora_targets", nargs="+", default=None,
                   help="nn.Linear modules to adapt, shell patterns of their names (default: the attention and MLP projections)")

    # TSLib's run.py's arguments of its other tasks and of its experiment's extras: a TSLib script or model
    # finds them; what would change a forecast here (augmentation, the DTW metric) is named in the warning line
    g = p.add_argument_group(TSLIB_OTHER_GROUP)
    g.add_argument("--mask_rate", type=probability, default=0.25, help="TSLib's imputation: mask ratio")
    g.add_argument("--anomaly_ratio", type=non_negative_float, default=0.25, help="TSLib's anomaly detection (%%)")
    g.add_argument("--use_dtw", action="store_true", help="TSLib's DTW metric: not computed here")
    g.add_argument("--augmentation_ratio", type=non_negative_int, default=0,
                   help="TSLib's training-data augmentation: not done here")
    for name in TSLIB_AUGMENTATIONS:
        g.add_argument(f"--{name}", action="store_true", help="TSLib's augmentation preset: not done here")
    g.add_argument("--extra_tag", default="", help="TSLib's augmentation tag")

    g = p.add_argument_group("devices and DDP")
    add_device_arguments(g)
    g.add_argument("--gpu_type", default="cuda", choices=("cuda", "mps"),
                   help="TSLib's: cuda (GPUs, or the CPU without one); mps is refused (DDP has no MPS backend)")
    g.add_argument("--ddp", action="store_true", help="DistributedDataParallel (torchrun, or local workers)")
    g.add_argument("--use_multi_gpu", action="store_true",
                   help="TSLib's DataParallel: here DDP, one process per --devices entry (started by run.py), "
                        "--batch_size split between them as DataParallel splits it")
    g.add_argument("--dp", action="store_true", help="OpenLTM's DataParallel: the same as --use_multi_gpu")
    g.add_argument("--devices", type=device_list, default=None,
                   help="with --use_multi_gpu or --dp: the GPUs, as numbered among the visible ones (default: "
                        "every visible GPU, or 2 processes on the CPU)")
    g.add_argument("--nproc_per_node", type=positive_int, default=None, help="workers --ddp starts without torchrun (default: GPUs, or 2 on CPU)")
    g.add_argument("--dist_timeout", type=positive_int, default=600, help="seconds a collective may wait")
    g.add_argument("--local_rank", "--local-rank", type=non_negative_int, default=None, help="legacy torch.distributed.launch; unused")
    g.add_argument("--sync_bn", action="store_true", help="DDP: BatchNorm statistics over the global batch (GPU only)")
    g.add_argument("--zero", action="store_true", help="DDP: shard the optimizer state between ranks (ZeRO stage 1)")
    g.add_argument("--fsdp", action="store_true",
                   help="instead of DDP: FSDP2 shards the weights, gradients and Adam state between ranks, each "
                        "repeated block apart (docs/ddp.md)")
    g.add_argument("--fsdp_mixed_precision", default="none", choices=("none", "bf16"),
                   help="--fsdp: bf16 weights and computation, float32 master weights, Adam and gradient reduction")
    g.add_argument("--activation_checkpointing", action="store_true",
                   help="recompute each repeated block's activations in backward instead of keeping them: less "
                        "memory for about one more forward, the same numbers; with or without --fsdp (docs/fine_tuning.md)")

    g = p.add_argument_group("results, pictures and forecasts")
    g.add_argument("--checkpoints", default="./checkpoints/", help="folder of each setting's checkpoint.pth and last.pth")
    g.add_argument("--results_dir", default="./results", help="folder of results.jsonl and each setting's outputs")
    g.add_argument("--quiet", action="store_true", help="print nothing but the final results (no progress, no epoch lines)")
    g.add_argument("--checkpoint", default=None, help="weights evaluated when --is_training 0")
    g.add_argument("--test_dir", default=None,
                   help="OpenLTM's: with --is_training 0, evaluate <checkpoints>/<test_dir>/<test_file_name>")
    g.add_argument("--test_file_name", default=None,
                   help="OpenLTM's: the file in --test_dir (default checkpoint.pth; without --test_dir, in this "
                        "setting's folder)")
    g.add_argument("--resume", nargs="?", const="auto", default=None,
                   help="continue the setting's last.pth (or the given training-state file)")
    g.add_argument("--inverse", action="store_true", help="also report test metrics on the original scale (mse_orig, ...)")
    g.add_argument("--do_predict", action="store_true",
                   help="forecast past the data file's last row into <results_dir>/<setting>/forecast.csv")
    g.add_argument("--no_plots", action="store_true", help="skip forecast.png and training_curves.png")
    g.add_argument("--visualize", dest="no_plots", action="store_false", default=argparse.SUPPRESS,
                   help="OpenLTM's: draw the test forecasts (drawn unless --no_plots; the later of the two wins)")
    g.add_argument("--save_steps", type=non_negative_int, default=0,
                   help="also write last.pth every N optimizer steps, mid-epoch included (--resume continues "
                        "from that step exactly)")
    g.add_argument("--log_steps", type=non_negative_int, default=0,
                   help="every N optimizer steps: the global train loss, learning rate, gradient norm and "
                        "samples/s in the log, in <results_dir>/<setting>/steps.csv and with --tensorboard")
    g.add_argument("--tensorboard", nargs="?", const="auto", default=None,
                   help="TensorBoard scalars (needs the tensorboard package) in <results_dir>/<setting>/tensorboard, "
                        "or in DIR/<setting> when a DIR is given")
    return p


@functools.lru_cache(maxsize=1)
def parser_defaults():
    """Every argument's default (name -> value), as build_parser gives it to a command line without it."""
    return vars(build_parser().parse_args([]))


class _Ungiven:
    """The value every argument holds until the command line gives it one (parse_args)."""

    def __repr__(self):
        return "<not given>"


_UNGIVEN = _Ungiven()


def parse_args(argv=None):
    """The command line's arguments, each default filled in, with `given`: the names (dest) of those the command
    line gave, whatever their value, as the parse itself saw them.

    OpenLTM's scripts pass arguments of its models that are not here (--gpt_layers, --flash_attention, ...):
    they are kept aside for one warning instead of failing. Any other unknown argument is an error naming the
    closest one: a misspelt --learning_rate must not train the default. Our own arguments keep their type checks."""
    parser = build_parser()
    defaults = {}
    for action in parser._actions:
        if action.dest != argparse.SUPPRESS and action.default is not argparse.SUPPRESS:
            defaults.setdefault(action.dest, action.default)
    # argparse fills a default only where the namespace holds nothing: what still holds _UNGIVEN was not given
    args, unknown = parser.parse_known_args(argv, argparse.Namespace(**dict.fromkeys(defaults, _UNGIVEN)))
    given = frozenset(name for name, value in vars(args).items() if value is not _UNGIVEN)
    for name, default in defaults.items():
        if getattr(args, name) is _UNGIVEN:
            setattr(args, name, default)
    problem = unknown_argument_problem(unknown, [o for action in parser._actions for o in action.option_strings])
    if problem:
        parser.fail(problem)
    args.ignored_args = unknown + _unused_here(args)
    args.given = given
    return args  # exp.settings.resolve_args settles the run: what other arguments and the data decide


def _unused_here(args):
    """Our arguments that these others leave unread, as TSLib and OpenLTM leave them: for the warning line."""
    unused = []
    if args.devices is not None and not (args.use_multi_gpu or args.dp):
        unused += ["--devices", ",".join(map(str, args.devices))]
    if args.is_training:  # OpenLTM's scripts pass them to training runs too, which test what they trained
        unused += [token for name in ("test_dir", "test_file_name") if getattr(args, name) is not None
                   for token in (f"--{name}", getattr(args, name))]
    # TSLib's extras that would change its results, accepted as TSLib's but not done here
    if args.use_dtw:
        unused += ["--use_dtw"]
    if args.augmentation_ratio:
        unused += ["--augmentation_ratio", str(args.augmentation_ratio)]
        unused += [f"--{name}" for name in TSLIB_AUGMENTATIONS if getattr(args, name)]
    return unused


# Every argument of OpenLTM's run.py (thuml/OpenLTM at 0b30050) that is not one of ours, and why it changes
# nothing here. Only these are accepted and ignored (named in one warning line): OpenLTM's scripts pass them,
# and OpenLTM's run.py would accept them. Every argument of TSLib's run.py (4e938a1) is one of ours
# (tests/test_arguments.py). The values say what the warning line says of them.
_OPENLTM_MODELS_NOT_HERE = "OpenLTM's, read by its GPT4TS, TTM, Time-LLM and AutoTimes, which are not models here"
OPENLTM_ONLY = {
    "--test_flag": "OpenLTM's, read by its Era5_Pretrain_Test data set only",
    "--node_num": "OpenLTM's, read by none of its models", "--node_list": "OpenLTM's, read by none of its models",
    "--kernel_size": "OpenLTM's, read by none of its models",
    "--output_attention": "no model here returns attention maps",
    "--flash_attention": "attention here always runs through PyTorch's fused scaled_dot_product_attention",
    **dict.fromkeys(("--gpt_layers", "--patch_size", "--n_vars", "--mode", "--AP_levels", "--use_decoder", "--d_mode",
                     "--layers", "--hidden_dim", "--ts_vocab_size", "--domain_des", "--llm_model", "--llm_layers"),
                    _OPENLTM_MODELS_NOT_HERE),
}
OPENLTM_SWITCHES = ("--output_attention", "--flash_attention", "--use_decoder")  # store_true there: no value
# Our own arguments that a command line may give to no effect (_unused_here), and why.
WHY_IGNORED = {
    "--devices": "it is read with --use_multi_gpu or --dp only, as in TSLib and OpenLTM",
    "--test_dir": "read with --is_training 0 only; a training run tests what it trained, as in OpenLTM",
    "--test_file_name": "read with --is_training 0 only",
    "--use_dtw": "TSLib's DTW metric is not computed here",
    "--augmentation_ratio": "TSLib's training-data augmentation is not done here: training sees the data as it is",
}


def _is_value(token):
    """A token argparse leaves as a value, not an option: no leading '-', or a negative number."""
    return not token.startswith("-") or re.fullmatch(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+([eE][-+]?\d+)?", token)


def unknown_argument_problem(tokens, ours):
    """The one line refusing the first token argparse did not take, or None when every one is an OpenLTM
    argument of OPENLTM_ONLY (or its value): a misspelt flag names the closest argument."""
    takes_value = False
    for token in tokens:
        if _is_value(token) and takes_value:
            takes_value = False
            continue
        name = token.split("=", 1)[0]
        if name in OPENLTM_ONLY:
            takes_value = name not in OPENLTM_SWITCHES and "=" not in token
            continue
        if _is_value(token):
            return (f"unexpected value '{token}' with no argument before it that takes it (one value too many?); "
                    "python run.py --help lists every argument")
        close = difflib.get_close_matches("--" + name.lstrip("-"), list(ours) + list(OPENLTM_ONLY), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        return (f"unknown argument {name}{hint} (run.py takes its own arguments and those of TSLib's and OpenLTM's "
                "run.py: python run.py --help)")
    return None


def describe_ignored(tokens):
    """'--gpt_layers 6 --devices 0,1 (--gpt_layers: OpenLTM's, ...; --devices: it is read with ...)'."""
    reasons = {}
    for token in tokens:
        name = token.split("=")[0]
        why = OPENLTM_ONLY.get(name) or WHY_IGNORED.get(name)
        if why:
            reasons.setdefault(why, []).append(name)
    hints = [f"{', '.join(names)}: {why}" for why, names in reasons.items()]
    return " ".join(tokens) + (f" ({'; '.join(hints)})" if hints else "")


def group_names(group_title):
    """The dest of every argument in the parser group `group_title`, in parser order."""
    for group in build_parser()._action_groups:
        if group.title == group_title:
            return tuple(action.dest for action in group._group_actions)
    raise KeyError(group_title)


DATA_ARGS = group_names(DATA_GROUP)
# "mark_dim" is derived from the data (time features per step) and changes the embedding's shape.
# "loss" and "quantiles" decide a probabilistic model's output width (utils.probabilistic).
MODEL_SHAPING_ARGS = (("model", "features") + group_names(WINDOW_GROUP) + group_names(MODEL_GROUP) + ("mark_dim",)
                      + ("loss", "quantiles"))
