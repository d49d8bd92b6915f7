# Shared by the protocol-C scripts (sourced, not run): train ONE token model with the caller's
# `common` arguments and --pred_len 96, then roll its best checkpoint out to each horizon in PRED_LENS.
# The caller defines `common` (an array of run.py arguments) and `DATA_NAME` (the model_id prefix, e.g.
# ETTh1) and sources this file with its own "$@" (extra flags for every run); TRAIN=0 only evaluates.

# model_id names the input length really used: a --seq_len in "$@" (protocol A's 96) overrides common's 672.
seq_len=$(python -c 'import sys, run; print(run.parse_args(sys.argv[1:]).seq_len)' "${common[@]}" "$@")
ID="${DATA_NAME}_${seq_len}"
train=(--model_id "${ID}_96" --pred_len 96)

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
    --model_id "${ID}_${pred_len}_rollout" \
    --pred_len "$pred_len" \
    --test_pred_len "$pred_len" \
    --checkpoint "$checkpoint" \
    "$@"
done
