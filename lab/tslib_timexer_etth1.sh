#!/usr/bin/env bash
# TSLib's OWN code running its TimeXer ETTh1 lines (TimeXer_ETTh1.sh's settings), on the CPU, to compare with
# ours (docs/reproducing.md#timexer): does TSLib's script reproduce the published figures on this machine?
#   bash lab/tslib_timexer_etth1.sh /path/to/Time-Series-Library /path/to/ETT-small [horizons...]
#   SEED=2024 bash lab/tslib_timexer_etth1.sh ...   # another seed: TSLib's run.py fixes 2021; a copy of it
#                                                          # in the temporary folder reads SEED instead
# Run from a copy of TSLib outside this repository (nothing is copied in). TSLib's data_provider imports
# packages its long-term path never uses (patool, datasets, reformer_pytorch, sktime); empty stand-ins for the
# first three are written to a temporary folder, and sktime must be importable (PYTHON=/path/to/venv/bin/python:
# python -m venv --system-site-packages V && V/bin/pip install sktime).
set -euo pipefail
TSLIB=$(cd "$1" && pwd); DATA=$(cd "$2" && pwd); shift 2
PYTHON=${PYTHON:-python}
SHIMS=$(mktemp -d)
trap 'rm -rf "$SHIMS"' EXIT
touch "$SHIMS/patoolib.py"
printf 'def load_dataset(*args, **kwargs):\n    raise RuntimeError("not used by long-term forecasting")\n' > "$SHIMS/datasets.py"
printf 'class LSHSelfAttention:\n    pass\n' > "$SHIMS/reformer_pytorch.py"
sed 's/fix_seed = 2021/fix_seed = int(os.environ.get("SEED", 2021))/' "$TSLIB/run.py" > "$SHIMS/run_seeded.py"
grep -q 'os.environ.get("SEED"' "$SHIMS/run_seeded.py" || { echo "error: TSLib's run.py has no 'fix_seed = 2021' line to seed" >&2; exit 2; }
cd "$TSLIB"
for h in ${@:-96 192 336 720}; do  # unquoted: the default is four words
  case $h in  # TSLib's TimeXer_ETTh1.sh, per horizon
    96) el=1 dm=256 dff=2048 bs=4 ;; 192) el=2 dm=128 dff=2048 bs=4 ;; 336) el=1 dm=512 dff=1024 bs=16 ;; *) el=1 dm=256 dff=1024 bs=16 ;;
  esac
  PYTHONPATH="$SHIMS:$TSLIB" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$PYTHON" -u "$SHIMS/run_seeded.py" \
    --task_name long_term_forecast --is_training 1 --root_path "$DATA/" --data_path ETTh1.csv \
    --model_id "ETTh1_96_${h}_seed${SEED:-2021}" --model TimeXer --data ETTh1 \
    --features M --seq_len 96 --label_len 48 --pred_len "$h" --e_layers $el --factor 3 --enc_in 7 --dec_in 7 --c_out 7 \
    --d_model $dm --d_ff $dff --batch_size $bs --des Exp --itr 1 --no_use_gpu --num_workers 0
done
