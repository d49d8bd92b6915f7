#!/usr/bin/env bash
# TimeXer on Exchange (8 daily exchange rates, 70/10/20 split), input 96, horizons 96/192/336/720, every
# column endogenous (--features M). Neither TSLib nor the TimeXer paper has an Exchange script or figure:
# the settings of TSLib's TimeXer_ETTh1.sh per horizon (e_layers / d_model / d_ff / batch = 1 / 256 / 2048 / 4
# at 96, 2 / 128 / 2048 / 4 at 192, 1 / 512 / 1024 / 16 at 336, 1 / 256 / 1024 / 16 at 720), the rest at
# TSLib's defaults (patch 16, 8 heads, dropout 0.1, lr 1e-4, 10 epochs, patience 3). No published target.
#   ROOT_PATH=../shared/datasets/exchange_rate/ bash scripts/long_term_forecast/Exchange_script/TimeXer_Exchange.sh
#   PRED_LENS="96 336" bash ...TimeXer_Exchange.sh --seed 1   # a subset of horizons; extra flags override
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/exchange_rate/}  # folder of exchange_rate.txt.gz (TSLib's layout, docs/data.md); the benchmark data here: ../shared/datasets/exchange_rate/

for pred_len in ${PRED_LENS:-96 192 336 720}; do
  case "$pred_len" in
    96) e_layers=1 d_model=256 d_ff=2048 batch_size=4 ;;
    192) e_layers=2 d_model=128 d_ff=2048 batch_size=4 ;;
    336) e_layers=1 d_model=512 d_ff=1024 batch_size=16 ;;
    *) e_layers=1 d_model=256 d_ff=1024 batch_size=16 ;;
  esac
  python run.py \
    --task_name long_term_forecast \
    --is_training 1 \
    --root_path "$ROOT_PATH" \
    --data_path exchange_rate.txt.gz \
    --model_id "Exchange_96_${pred_len}" \
    --model TimeXer \
    --data custom \
    --features M \
    --seq_len 96 \
    --label_len 48 \
    --pred_len "$pred_len" \
    --e_layers "$e_layers" \
    --factor 3 \
    --n_heads 8 \
    --d_model "$d_model" \
    --d_ff "$d_ff" \
    --patch_len 16 \
    --dropout 0.1 \
    --batch_size "$batch_size" \
    --learning_rate 0.0001 \
    --train_epochs 10 \
    --patience 3 \
    --des Exp \
    --itr 1 \
    "$@"
done
