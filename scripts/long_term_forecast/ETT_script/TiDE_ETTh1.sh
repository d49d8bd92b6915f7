#!/usr/bin/env bash
# TiDE on ETTh1, input 96, horizons 96/192/336/720 (protocol A of ../shared/reference/targets.md).
# TSLib's ETTh1 script: e_layers 2, d_layers 2, d_model 256, d_ff 256 (temporal decoder), dropout 0.3,
# batch 512, lr 0.1, patience 5, 10 epochs, and --c_out 8, which TiDE reads as the width of each
# step's decoded vector (the paper's decoderOutputDim): the output keeps one column per channel.
#   ROOT_PATH=../shared/datasets/ETT-small/ bash scripts/long_term_forecast/ETT_script/TiDE_ETTh1.sh
#   PRED_LENS="96 336" bash ...TiDE_ETTh1.sh --seed 1   # a subset of horizons; extra flags override
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
    --model TiDE \
    --data ETTh1 \
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
