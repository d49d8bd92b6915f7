#!/usr/bin/env bash
# TimeMixer on Exchange, input 96, horizons 96/192/336/720 (protocol A of ../shared/reference/targets.md).
# Neither TSLib nor the official TimeMixer repository publishes an Exchange script at input 96 (the paper
# does not report Exchange), so this uses the published ETTh1 settings unchanged: label_len 0, e_layers 2,
# d_model 16, d_ff 32, lr 0.01, batch 128, 10 epochs, patience 10, 3 average-pooling down-sampling layers
# of window 2. The data file has no header and no dates, so the model gets no time features.
#   ROOT_PATH=../shared/datasets/exchange_rate/ bash scripts/long_term_forecast/Exchange_script/TimeMixer_Exchange.sh
#   PRED_LENS="96 336" bash ...TimeMixer_Exchange.sh --seed 1   # a subset of horizons; extra flags override
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
    --model TimeMixer \
    --data custom \
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
