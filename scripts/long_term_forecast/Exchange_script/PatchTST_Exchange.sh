#!/usr/bin/env bash
# PatchTST on Exchange (8 daily exchange rates, 70/10/20 split), input 96, horizons 96/192/336/720
# (protocol A of ../shared/reference/targets.md). TSLib's Exchange_script/PatchTST.sh: 2 encoder layers,
# 8 heads, d_model 512, d_ff 2048, patch 16 / stride 8, batch 32, lr 1e-4, dropout 0.1, 10 epochs,
# patience 3 -- except horizon 336, which TSLib trains for a single epoch (kept as published).
# --factor 3 is carried over from TSLib; full attention ignores it.
#   ROOT_PATH=../shared/datasets/exchange_rate/ bash scripts/long_term_forecast/Exchange_script/PatchTST_Exchange.sh
#   PRED_LENS="96 336" bash ...PatchTST_Exchange.sh --seed 1   # a subset of horizons; extra flags override
#   ... PatchTST_Exchange.sh --ddp       # same runs on 2 local DDP workers (use --batch_size 16 to keep 32 globally)
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/exchange_rate/}  # folder of exchange_rate.txt.gz (TSLib's layout, docs/data.md); the benchmark data here: ../shared/datasets/exchange_rate/

for pred_len in ${PRED_LENS:-96 192 336 720}; do
  case "$pred_len" in
    336) train_epochs=1 ;;
    *) train_epochs=10 ;;
  esac
  python run.py \
    --task_name long_term_forecast \
    --is_training 1 \
    --root_path "$ROOT_PATH" \
    --data_path exchange_rate.txt.gz \
    --model_id "Exchange_96_${pred_len}" \
    --model PatchTST \
    --data custom \
    --features M \
    --seq_len 96 \
    --label_len 48 \
    --pred_len "$pred_len" \
    --e_layers 2 \
    --d_layers 1 \
    --factor 3 \
    --n_heads 8 \
    --d_model 512 \
    --d_ff 2048 \
    --patch_len 16 \
    --stride 8 \
    --dropout 0.1 \
    --batch_size 32 \
    --learning_rate 0.0001 \
    --train_epochs "$train_epochs" \
    --patience 3 \
    --des Exp \
    --itr 1 \
    "$@"
done
