#!/usr/bin/env bash
# DLinear on Exchange (8 daily exchange rates, 70/10/20 split), input 96, horizons 96/192/336/720
# (protocol A of ../shared/reference/targets.md). TSLib has no DLinear Exchange script, so batch size and
# learning rate per horizon are the DLinear paper's own Exchange script (LTSF-Linear,
# scripts/EXP-LongForecasting/DLinear/exchange_rate.sh): batch 8 / lr 5e-4 for 96 and 192, batch 32 /
# lr 5e-4 for 336, batch 32 / lr 5e-3 for 720; moving-average kernel 25, other flags default. The paper
# used input 336; input 96 is the unified protocol the published table A figures assume.
#   ROOT_PATH=../shared/datasets/exchange_rate/ bash scripts/long_term_forecast/Exchange_script/DLinear_Exchange.sh
#   PRED_LENS="96 336" bash ...DLinear_Exchange.sh --seed 1   # a subset of horizons; extra flags override
#   ... DLinear_Exchange.sh --ddp       # same runs on 2 local DDP workers (halve --batch_size to keep the global batch)
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/exchange_rate/}  # folder of exchange_rate.txt.gz (TSLib's layout, docs/data.md); the benchmark data here: ../shared/datasets/exchange_rate/

for pred_len in ${PRED_LENS:-96 192 336 720}; do
  case "$pred_len" in
    96|192) batch_size=8; learning_rate=0.0005 ;;
    336) batch_size=32; learning_rate=0.0005 ;;
    *) batch_size=32; learning_rate=0.005 ;;
  esac
  python run.py \
    --task_name long_term_forecast \
    --is_training 1 \
    --root_path "$ROOT_PATH" \
    --data_path exchange_rate.txt.gz \
    --model_id "Exchange_96_${pred_len}" \
    --model DLinear \
    --data custom \
    --features M \
    --seq_len 96 \
    --label_len 48 \
    --pred_len "$pred_len" \
    --moving_avg 25 \
    --batch_size "$batch_size" \
    --learning_rate "$learning_rate" \
    --des Exp \
    --itr 1 \
    "$@"
done
