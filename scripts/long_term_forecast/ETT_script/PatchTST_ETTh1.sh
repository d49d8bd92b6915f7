#!/usr/bin/env bash
# PatchTST on ETTh1, input 96, horizons 96/192/336/720 (protocol A of ../shared/reference/targets.md).
# TSLib's PatchTST_ETTh1.sh: 1 encoder layer, d_model 512, d_ff 2048, patch 16 / stride 8, heads 2 at
# horizon 96 and 8 / 8 / 16 beyond; everything else at TSLib's defaults (batch 32, lr 1e-4, dropout 0.1,
# 10 epochs, patience 3). --factor 3 is carried over from TSLib; full attention ignores it.
#   ROOT_PATH=../shared/datasets/ETT-small/ bash scripts/long_term_forecast/ETT_script/PatchTST_ETTh1.sh
#   PRED_LENS="96 336" bash ...PatchTST_ETTh1.sh --seed 1   # a subset of horizons; extra flags override
#   ... PatchTST_ETTh1.sh --ddp          # same runs on 2 local DDP workers (use --batch_size 16 to keep 32 globally)
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/ETT-small/}  # folder of ETTh1.csv (TSLib's layout, docs/data.md); the benchmark data here: ../shared/datasets/ETT-small/

for pred_len in ${PRED_LENS:-96 192 336 720}; do
  case "$pred_len" in
    96) n_heads=2 ;;
    192|336) n_heads=8 ;;
    *) n_heads=16 ;;
  esac
  python run.py \
    --task_name long_term_forecast \
    --is_training 1 \
    --root_path "$ROOT_PATH" \
    --data_path ETTh1.csv \
    --model_id "ETTh1_96_${pred_len}" \
    --model PatchTST \
    --data ETTh1 \
    --features M \
    --seq_len 96 \
    --label_len 48 \
    --pred_len "$pred_len" \
    --e_layers 1 \
    --d_layers 1 \
    --factor 3 \
    --n_heads "$n_heads" \
    --d_model 512 \
    --d_ff 2048 \
    --patch_len 16 \
    --stride 8 \
    --dropout 0.1 \
    --batch_size 32 \
    --learning_rate 0.0001 \
    --train_epochs 10 \
    --patience 3 \
    --des Exp \
    --itr 1 \
    "$@"
done
