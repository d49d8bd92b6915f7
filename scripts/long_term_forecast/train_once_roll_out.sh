# Shared by the protocol-C scripts (sourced, not run): train ONE token model with the caller's
# `common` arguments and --pred_len 96, then roll its best checkpoint out to each horizon in PRED_LENS.
# The caller defines `common` (an array of run.py arguments) and `DATA_NAME` (the model_id prefix, e.g.
# ETTh1) and sources this file with its own "$@" (extra flags for every run); TRAIN=0 only evaluates.

# One parse by run.py's own parser (utils.arguments), so flags in "$@" count exactly as in the runs: the
# input length really used names the runs (protocol A's --seq_len 96 overrides common's 672), and the training
# run's setting (exp.settings.setting_name: --checkpoints, --d_model, --des, ...) locates its best weights.
# A --model_id in "$@" still wins.
read -r ID checkpoint < <(python -c 'import os, sys
from exp.settings import setting_name
from utils.arguments import parse_args
prefix = sys.argv[1]
args = parse_args(["--model_id", "", *sys.argv[2:]])
run_id = f"{prefix}_{args.seq_len}"
args.model_id = args.model_id or f"{run_id}_96"
args.autoregressive = True
print(run_id, os.path.join(args.checkpoints, setting_name(args, 0), "checkpoint.pth"))' \
  "$DATA_NAME" --is_training 1 "${common[@]}" --pred_len 96 "$@")

if [ "${TRAIN:-1}" = 1 ]; then
  python run.py --is_training 1 "${common[@]}" --model_id "${ID}_96" --pred_len 96 "$@"
fi

for pred_len in ${PRED_LENS:-96 192 336 720}; do
  # pred_len only names the result here: the horizon a token model rolls out to is --test_pred_len.
  python run.py \
    --is_training 0 \
    "${common[@]}" \
    --model_id "${ID}_${pred_len}_rollout" \
    --pred_len "$pred_len" \
    --test_pred_len "$pred_len" \
    --checkpoint "$checkpoint" \
    "$@"
done
