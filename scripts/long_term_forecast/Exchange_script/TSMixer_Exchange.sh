#!/usr/bin/env bash
# TSMixer on Exchange (8 daily exchange rates, 70/10/20 split), input 96, horizons 96/192/336/720.
# TSLib has no TSMixer Exchange script (nor does the paper report Exchange): the settings of its
# ETTh1 script, e_layers 2 and the defaults (d_model 512, dropout 0.1, lr 1e-4, batch 32), with
# instance normalisation on (the paper's RevIN; TSLib's TSMixer has none: --use_norm 0).
#   ROOT_PATH=../shared/datasets/exchange_rate/ bash scripts/long_term_forecast/Exchange_script/TSMixer_Exchange.sh
#   PRED_LENS="96 336" bash ...TSMixer_Exchange.sh --seed 1   # a subset of horizons; extra flags override
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
    --model TSMixer \
    --data custom \
    --features M \
    --seq_len 96 \
    --label_len 48 \
    --pred_len "$pred_len" \
    --e_layers 2 \
    --use_norm 1 \
    --des Exp \
    --itr 1 \
    "$@"
done
