#!/usr/bin/env bash
# TimeXer on ETTh1, input 96, horizons 96/192/336/720, every column endogenous (--features M, the
# paper's long-term multivariate table; docs/reproducing.md#timexer). TSLib's TimeXer_ETTh1.sh, per
# horizon: e_layers / d_model / d_ff / batch = 1 / 256 / 2048 / 4 at 96, 2 / 128 / 2048 / 4 at 192,
# 1 / 512 / 1024 / 16 at 336, 1 / 256 / 1024 / 16 at 720; everything else at TSLib's defaults (patch 16,
# 8 heads, dropout 0.1, lr 1e-4, 10 epochs, patience 3). --factor 3 is carried over; full attention ignores it.
# With the other columns as exogenous variables of the target OT: --features MS (TSLib's exogenous_forecast).
#   ROOT_PATH=../shared/datasets/ETT-small/ bash scripts/long_term_forecast/ETT_script/TimeXer_ETTh1.sh
#   PRED_LENS="96 336" bash ...TimeXer_ETTh1.sh --seed 1   # a subset of horizons; extra flags override
#   ... TimeXer_ETTh1.sh --ddp          # same runs on 2 local DDP workers (halve --batch_size to keep the global one)
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/ETT-small/}  # folder of ETTh1.csv (TSLib's layout, docs/data.md); the benchmark data here: ../shared/datasets/ETT-small/

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
    --data_path ETTh1.csv \
    --model_id "ETTh1_96_${pred_len}" \
    --model TimeXer \
    --data ETTh1 \
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
