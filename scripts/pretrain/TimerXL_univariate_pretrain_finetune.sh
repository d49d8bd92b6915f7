#!/usr/bin/env bash
# The large-model workflow of OpenLTM with Timer-XL, both stages under DDP:
#   1. pre-train on every channel of every file in a folder, each channel a univariate series of its own
#      (--data univariate; --data_path is a glob under --root_path, '**' recurses); its final test scores
#      TEST_WINDOWS windows of the corpus' test split, a seeded subset (--test_windows), not all of them;
#   2. fine-tune from that checkpoint on ETTh1 (--adaptation --pretrain_model_path), few-shot on a random
#      RATIO of ETTh1's training windows (--subset_rand_ratio); validation and test use every window.
# ETTh1 is read channel-independently, as OpenLTM's UnivariateDatasetBenchmark does: --data univariate on
# the single file ETTh1.csv, which keeps the ETT borders (12/4/4 months) because of its name. Timer-XL's
# weights do not depend on the number of channels, so `--data ETTh1 --features M` fine-tunes as well.
#   CORPUS=/data/utsd/ GLOB='**/*.csv' ROOT_PATH=../shared/datasets/ETT-small/ \
#     bash scripts/pretrain/TimerXL_univariate_pretrain_finetune.sh
#   RATIO=0.05 NPROC=4 bash ...sh --batch_size 16      # extra flags go to both stages
#   TEST_WINDOWS=100000 bash ...sh                     # a larger test subset for the pre-training run
#   PRETRAIN=0 bash ...sh                              # only fine-tune from an earlier pre-training run
set -euo pipefail
cd "$(dirname "$0")/../.."
CORPUS=${CORPUS:-./dataset/pretrain/}  # the pre-training corpus (e.g. UTSD), searched with GLOB
GLOB=${GLOB:-*.csv}
ROOT_PATH=${ROOT_PATH:-./dataset/ETT-small/}  # folder of ETTh1.csv (TSLib's layout, docs/data.md); the benchmark data here: ../shared/datasets/ETT-small/
RATIO=${RATIO:-0.1}
TEST_WINDOWS=${TEST_WINDOWS:-20000}  # a corpus' whole test split can take hours to score
NPROC=${NPROC:-2}

# Shape arguments must agree between the stages: the fine-tuning load is strict.
model=(
  --task_name long_term_forecast
  --model TimerXL
  --features S
  --seq_len 672
  --label_len 48
  --pred_len 96
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
  --des Exp
)
pretrain=(--data univariate --root_path "$CORPUS" --data_path "$GLOB" --model_id pretrain
          --learning_rate 0.0001 --lradj cosine --train_epochs 10 --patience 3 --test_windows "$TEST_WINDOWS")

if [ "${PRETRAIN:-1}" = 1 ]; then
  python run.py --ddp --nproc_per_node "$NPROC" "${model[@]}" "${pretrain[@]}" "$@"
fi

# Where the pre-training run saved its best weights, resolved by run.py's own parser (utils.arguments) and
# run name (exp.settings.setting_name) so that flags in "$@" (--checkpoints, --d_model, --des, ...) are
# honoured exactly as in the run itself.
checkpoint=$(python -c 'import os, sys
from exp.settings import setting_name
from utils.arguments import parse_args
args = parse_args(sys.argv[1:])
args.autoregressive = True
print(os.path.join(args.checkpoints, setting_name(args, 0), "checkpoint.pth"))' \
  "${model[@]}" "${pretrain[@]}" "$@")

python run.py --ddp --nproc_per_node "$NPROC" "${model[@]}" \
  --data univariate --root_path "$ROOT_PATH" --data_path ETTh1.csv \
  --model_id "ETTh1_few_shot_${RATIO}" \
  --adaptation --pretrain_model_path "$checkpoint" --subset_rand_ratio "$RATIO" \
  --learning_rate 0.00005 --lradj cosine --train_epochs 10 --patience 3 \
  "$@"
