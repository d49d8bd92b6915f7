#!/usr/bin/env bash
# iTransformer on Exchange (8 daily exchange rates, 70/10/20 split), input 96, horizons 96/192/336/720.
# Settings of iTransformer's own Exchange script: e_layers 2, d_model = d_ff = 128, instance
# normalisation on, other flags at the defaults. That script (like TSLib's Transformer one) trains
# horizon 336 for a single epoch; kept, since the published number comes from it.
#   ROOT_PATH=../shared/datasets/exchange_rate/ bash scripts/long_term_forecast/Exchange_script/iTransformer_Exchange.sh
#   PRED_LENS="96 336" bash ...iTransformer_Exchange.sh --seed 1   # a subset of horizons; extra flags override
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
    --model iTransformer \
    --data custom \
    --features M \
    --seq_len 96 \
    --label_len 48 \
    --pred_len "$pred_len" \
    --e_layers 2 \
    --d_model 128 \
    --d_ff 128 \
    --use_norm 1 \
    --train_epochs "$epochs" \
    --des Exp \
    --itr 1 \
    "$@"
done
