#!/usr/bin/env bash
# TimeMixer on ETTh1, input 96, horizons 96/192/336/720 (protocol A of ../shared/reference/targets.md).
# Hyperparameters are TSLib's TimeMixer_ETTh1.sh, the same for every horizon: label_len 0 (the model
# reads no decoder input), e_layers 2, d_model 16, d_ff 32, lr 0.01, batch 128, 10 epochs, patience 10,
# 3 average-pooling down-sampling layers of window 2; channel independence, moving-average decomposition
# (kernel 25) and instance normalisation are run.py's defaults. The schedule is TSLib's type1: the
# official repository's one-cycle `--lradj TST` was tried (seed 2021, horizon 96) and overfits here
# (test MSE 0.414 against 0.395 with type1); pass `--lradj TST` to use it. Also tried at 96:
# the authors' advice in kwuking/TimeMixer#52, `--learning_rate 0.001 --batch_size 16 --train_epochs 50`
# (seed 2021: 0.392 with type1, 0.417 with TST), `--embed none --des no_calendar` (5 seeds: 0.381)
# and the official code's calendar pairing, `--mark_pairing tiled --eval_batch_size 128 --des tiled_marks`
# (5 seeds: 0.382; it gives each channel's series another window's calendar, see
# benchmarks/results/reproduce_summary.md), and skipping the epoch's last, one-window training batch
# as the official loader does, `--train_drop_last` (2 seeds: 0.393, as without). This script: 0.401
# (5 seeds; at 336 0.506, where the two variants give 0.483 and 0.487). The validation loss is
# lowest with these settings (seed 2021: 0.676, against 0.680, 0.684, 0.680, 0.679 and 0.686 for
# the last five), so they stay.
#   ROOT_PATH=../shared/datasets/ETT-small/ bash scripts/long_term_forecast/ETT_script/TimeMixer_ETTh1.sh
#   PRED_LENS="96 336" bash ...TimeMixer_ETTh1.sh --seed 1   # a subset of horizons; extra flags override
#   ... TimeMixer_ETTh1.sh --ddp          # same runs on 2 local DDP workers (use --batch_size 64 to keep 128 globally)
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/ETT-small/}

for pred_len in ${PRED_LENS:-96 192 336 720}; do
  python run.py \
    --task_name long_term_forecast \
    --is_training 1 \
    --root_path "$ROOT_PATH" \
    --data_path ETTh1.csv \
    --model_id "ETTh1_96_${pred_len}" \
    --model TimeMixer \
    --data ETTh1 \
    --features M \
    --seq_len 96 \
    --label_len 0 \
    --pred_len "$pred_len" \
    --e_layers 2 \
    --d_model 16 \
    --d_ff 32 \
    --down_sampling_layers 3 \
    --down_sampling_method avg \
    --down_sampling_window 2 \
    --learning_rate 0.01 \
    --train_epochs 10 \
    --patience 10 \
    --batch_size 128 \
    --des Exp \
    --itr 1 \
    "$@"
done
