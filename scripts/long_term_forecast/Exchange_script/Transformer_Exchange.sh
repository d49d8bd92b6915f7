#!/usr/bin/env bash
# Vanilla encoder-decoder Transformer on Exchange (8 daily exchange rates, 70/10/20 split), input 96
# (decoder start token 48), horizons 96/192/336/720. TSLib's Exchange_script/Transformer.sh: e_layers 2,
# d_layers 1, factor 3 (unused by full attention), other flags at the defaults; that script trains
# horizon 336 for a single epoch, kept here as published.
#   ROOT_PATH=../shared/datasets/exchange_rate/ bash scripts/long_term_forecast/Exchange_script/Transformer_Exchange.sh
#   PRED_LENS="96 336" bash ...Transformer_Exchange.sh --seed 1   # a subset of horizons; extra flags override
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/exchange_rate/}  # folder of exchange_rate.txt.gz (TSLib's layout, docs/data.md); the benchmark data here: ../shared/datasets/exchange_rate/

for pred_len in ${PRED_LENS:-96 192 336 720}; do
  case $pred_len in
    336) epochs=1 ;;
    *) epochs=10 ;;
  esac
  python run.py \
    --task_name long_term_forecast \
    --is_training 1 \
    --root_path "$ROOT_PATH" \
    --data_path exchange_rate.txt.gz \
    --model_id "Exchange_96_${pred_len}" \
    --model Transformer \
    --data custom \
    --features M \
    --seq_len 96 \
    --label_len 48 \
    --pred_len "$pred_len" \
    --e_layers 2 \
    --d_layers 1 \
    --factor 3 \
    --train_epochs "$epochs" \
    --des Exp \
    --itr 1 \
    "$@"
done
