#!/usr/bin/env bash
# NLinear on ETTh1, input 96, horizons 96/192/336/720 (protocol A of ../shared/reference/targets.md).
# TSLib has no NLinear: batch 32 and learning rate 0.005 are the paper's own ETTh1 script for its
# Linear/NLinear/DLinear models (LTSF-Linear, scripts/EXP-LongForecasting/Linear/etth1.sh), the same
# settings as DLinear_ETTh1.sh; other flags at the defaults. The paper used input 336 (table B).
#   ROOT_PATH=../shared/datasets/ETT-small/ bash scripts/long_term_forecast/ETT_script/NLinear_ETTh1.sh
#   PRED_LENS="96 336" bash ...NLinear_ETTh1.sh --seed 1   # a subset of horizons; extra flags override
#   ... NLinear_ETTh1.sh --individual   # NLinear-I: one linear head per channel
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/ETT-small/}  # folder of ETTh1.csv (TSLib's layout, docs/data.md); the benchmark data here: ../shared/datasets/ETT-small/

for pred_len in ${PRED_LENS:-96 192 336 720}; do
  python run.py \
    --task_name long_term_forecast \
    --is_training 1 \
    --root_path "$ROOT_PATH" \
    --data_path ETTh1.csv \
    --model_id "ETTh1_96_${pred_len}" \
    --model NLinear \
    --data ETTh1 \
    --features M \
    --seq_len 96 \
    --label_len 48 \
    --pred_len "$pred_len" \
    --batch_size 32 \
    --learning_rate 0.005 \
    --des Exp \
    --itr 1 \
    "$@"
done
