#!/usr/bin/env bash
# TiDE on Exchange (8 daily exchange rates, 70/10/20 split), input 96, horizons 96/192/336/720.
# TSLib has no TiDE Exchange script (nor does the paper report Exchange): the settings of its ETTh1
# script, e_layers 2, d_layers 2, d_model 256, d_ff 256, dropout 0.3, batch 512, lr 0.1, patience 5,
# 10 epochs, --c_out 8 (the decoded width per step). The data are undated, so TiDE runs without
# time-feature covariates.
#   ROOT_PATH=../shared/datasets/exchange_rate/ bash scripts/long_term_forecast/Exchange_script/TiDE_Exchange.sh
#   PRED_LENS="96 336" bash ...TiDE_Exchange.sh --seed 1   # a subset of horizons; extra flags override
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/exchange_rate/}  # folder of exchange_rate.txt.gz (TSLib's layout, docs/data.md); the benchmark data here: ../shared/datasets/exchange_rate/

for pred_len in ${PRED_LENS:-96 192 336 720}; do
  python run.py \
    --task_name long_term_forecast \
    --is_training 1 \
    --root_path "$ROOT_PATH" \
    --data_path exchange_rate.txt.gz \
    --model_id "Exchange_96_${pred_len}" \
    --model TiDE \
    --data custom \
    --features M \
    --seq_len 96 \
    --label_len 48 \
    --pred_len "$pred_len" \
    --e_layers 2 \
    --d_layers 2 \
    --c_out 8 \
    --d_model 256 \
    --d_ff 256 \
    --dropout 0.3 \
    --batch_size 512 \
    --learning_rate 0.1 \
    --patience 5 \
    --train_epochs 10 \
    --des Exp \
    --itr 1 \
    "$@"
done
