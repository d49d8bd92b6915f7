#!/usr/bin/env bash
# TimesNet on Exchange (8 daily exchange rates, 70/10/20 split), input 96, horizons 96/192/336/720
# (protocol A of ../shared/reference/targets.md). TSLib's Exchange_script/TimesNet.sh: 2 TimesBlocks,
# top_k 5, 6 Inception kernels (default), batch 32, lr 1e-4; d_model = d_ff = 64 for horizons 96/192
# (10 epochs, patience 3) and 32 for 336/720, which TSLib trains for a single epoch (kept as published).
# --d_layers 1 and --factor 3 are carried over from TSLib; TimesNet ignores them. Our file has no dates,
# so the embedding has no time-feature term (TSLib's exchange_rate.csv adds calendar features).
# TimesNet trains on the periods of its batch's mean spectrum (TSLib). In evaluation it takes each
# window's own (--times_eval_periods window, the default): every window is scored as if alone, as TSLib's
# test loader did when TimesNet was published (batch 1, so that later windows cannot leak into a
# forecast: thuml/Time-Series-Library#87, #269), and the metrics depend on neither the evaluation batch
# nor the number of processes, at the batch's speed. `--times_eval_periods batch` is TSLib's code at batch > 1.
#   ROOT_PATH=../shared/datasets/exchange_rate/ bash scripts/long_term_forecast/Exchange_script/TimesNet_Exchange.sh
#   PRED_LENS="96 336" bash ...TimesNet_Exchange.sh --seed 1   # a subset of horizons; extra flags override
#   ... TimesNet_Exchange.sh --ddp       # same runs on 2 local DDP workers (use --batch_size 16 to keep 32 globally)
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT_PATH=${ROOT_PATH:-./dataset/exchange_rate/}  # folder of exchange_rate.txt.gz (TSLib's layout, docs/data.md); the benchmark data here: ../shared/datasets/exchange_rate/

for pred_len in ${PRED_LENS:-96 192 336 720}; do
  case "$pred_len" in
    96|192) width=64; train_epochs=10 ;;
    *) width=32; train_epochs=1 ;;
  esac
  python run.py \
    --task_name long_term_forecast \
    --is_training 1 \
    --root_path "$ROOT_PATH" \
    --data_path exchange_rate.txt.gz \
    --model_id "Exchange_96_${pred_len}" \
    --model TimesNet \
    --data custom \
    --features M \
    --seq_len 96 \
    --label_len 48 \
    --pred_len "$pred_len" \
    --e_layers 2 \
    --d_layers 1 \
    --factor 3 \
    --d_model "$width" \
    --d_ff "$width" \
    --top_k 5 \
    --num_kernels 6 \
    --batch_size 32 \
    --learning_rate 0.0001 \
    --train_epochs "$train_epochs" \
    --patience 3 \
    --des Exp \
    --itr 1 \
    "$@"
done
