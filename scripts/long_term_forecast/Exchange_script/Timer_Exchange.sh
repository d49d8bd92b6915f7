#!/usr/bin/env bash
# Timer on Exchange (8 daily exchange rates, 70/10/20 split) under protocol C of
# ../shared/reference/targets.md: ONE model trained 672 -> 96 (7 input tokens of 96 steps, every token
# predicting the next 96), then its checkpoint rolled out autoregressively to each horizon
# (--is_training 0 --test_pred_len H --checkpoint ...). Neither OpenLTM nor the Timer papers publish an
# Exchange setting, so this reuses OpenLTM's ETTh1 one (scripts/supervised/rolling_forecast/timer_etth1.sh):
# d_model 1024, d_ff 2048, e_layers 1, 8 heads, relu, dropout 0.1, instance norm, lr 1e-4, batch 32,
# 10 epochs, patience 3, validation on the last token only (--valid_last). No published target to compare.
# --lradj type1: OpenLTM's type1 divides the lr by 10 after every epoch, a schedule run.py does not have;
# our type1 (full lr for epochs 1-2, then halved each epoch) is the closest (see Timer_ETTh1.sh).
#   ROOT_PATH=../shared/datasets/exchange_rate/ bash scripts/long_term_forecast/Exchange_script/Timer_Exchange.sh
#   PRED_LENS="96 336" bash ...Timer_Exchange.sh --seed 1   # horizons to evaluate; extra flags go to every run
#   TRAIN=0 bash ...Timer_Exchange.sh   # only evaluate the checkpoint an earlier run trained
#   ... Timer_Exchange.sh --ddp         # 2 local DDP workers (use --batch_size 16 to keep 32 globally)
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/exchange_rate/}

common=(
  --task_name long_term_forecast
  --root_path "$ROOT_PATH"
  --data_path exchange_rate.txt.gz
  --model Timer
  --data custom
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
train=(--model_id Exchange_672_96 --pred_len 96)

if [ "${TRAIN:-1}" = 1 ]; then
  python run.py --is_training 1 "${common[@]}" "${train[@]}" "$@"
fi

# Where that training run saved its best weights, resolved by run.py's own parser so that flags in "$@"
# (--checkpoints, --d_model, --des, ...) are honoured exactly as in the run itself.
checkpoint=$(python -c 'import os, sys, run
args = run.parse_args(sys.argv[1:])
args.autoregressive = True
print(os.path.join(args.checkpoints, run.setting_name(args, 0), "checkpoint.pth"))' \
  --is_training 1 "${common[@]}" "${train[@]}" "$@")

for pred_len in ${PRED_LENS:-96 192 336 720}; do
  # pred_len only names the result here: the horizon a token model rolls out to is --test_pred_len.
  python run.py \
    --is_training 0 \
    "${common[@]}" \
    --model_id "Exchange_672_${pred_len}_rollout" \
    --pred_len "$pred_len" \
    --test_pred_len "$pred_len" \
    --checkpoint "$checkpoint" \
    "$@"
done
