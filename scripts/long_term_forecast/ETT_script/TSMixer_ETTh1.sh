#!/usr/bin/env bash
# TSMixer on ETTh1, input 96, horizons 96/192/336/720 (protocol A of ../shared/reference/targets.md).
# TSLib's ETTh1 script: e_layers 2, everything else at the defaults (d_model 512, dropout 0.1,
# lr 1e-4, batch 32, 10 epochs). Instance normalisation (the paper's RevIN) is on; TSLib's TSMixer
# has none, which --use_norm 0 reproduces (test MSE 0.57 vs 0.43 after one epoch at horizon 96).
#   ROOT_PATH=../shared/datasets/ETT-small/ bash scripts/long_term_forecast/ETT_script/TSMixer_ETTh1.sh
#   PRED_LENS="96 336" bash ...TSMixer_ETTh1.sh --seed 1   # a subset of horizons; extra flags override
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
    --model TSMixer \
    --data ETTh1 \
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
