#!/usr/bin/env bash
# Timer on ETTh1 under protocol C of ../shared/reference/targets.md: ONE model trained 672 -> 96 (7 input
# tokens of 96 steps, every token predicting the next 96), then its checkpoint rolled out autoregressively
# to each horizon (--is_training 0 --test_pred_len H --checkpoint ...).
# Settings are OpenLTM's scripts/supervised/rolling_forecast/timer_etth1.sh: d_model 1024, d_ff 2048,
# e_layers 1, 8 heads, relu, dropout 0.1, instance norm, lr 1e-4, batch 32, 10 epochs, patience 3,
# validation on the last token only (--valid_last).
# --lradj type1: OpenLTM's type1 divides the lr by 10 after every epoch, a schedule run.py does not have.
# Our type1 (full lr for epochs 1-2, then halved each epoch) is the closest: a per-epoch decay like
# OpenLTM's, and over 10 epochs the least summed lr of the choices (type1 3.0, type2 3.3, cosine 5.5,
# constant 10 x 1e-4; OpenLTM 1.1); early stopping on validation keeps the best epoch either way.
#   ROOT_PATH=../shared/datasets/ETT-small/ bash scripts/long_term_forecast/ETT_script/Timer_ETTh1.sh
#   PRED_LENS="96 336" bash ...Timer_ETTh1.sh --seed 1   # horizons to evaluate; extra flags go to every run
#   TRAIN=0 bash ...Timer_ETTh1.sh      # only evaluate the checkpoint an earlier run trained
#   ... Timer_ETTh1.sh --ddp            # 2 local DDP workers (use --batch_size 16 to keep 32 globally)
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/ETT-small/}  # folder of ETTh1.csv (TSLib's layout, docs/data.md); the benchmark data here: ../shared/datasets/ETT-small/

common=(
  --task_name long_term_forecast
  --root_path "$ROOT_PATH"
  --data_path ETTh1.csv
  --model Timer
  --data ETTh1
  --features M
  --seq_len 672
  --label_len 48
  --input_token_len 96
  --output_token_len 96
  --d_model 1024
  --d_ff 2048
  --n_heads 8
  --e_layers 1
  --activation relu
  --dropout 0.1
  --use_norm 1
  --valid_last
  --batch_size 32
  --learning_rate 0.0001
  --lradj type1
  --train_epochs 10
  --patience 3
  --des Exp
  --itr 1
)
DATA_NAME=ETTh1
source scripts/long_term_forecast/train_once_roll_out.sh "$@"
