#!/usr/bin/env bash
# GPU check for tsl-ddp on a machine with NVIDIA GPUs (docs/performance.md#checking-a-gpu-machine).
# Run from the project root:
#
#   OUT=/path/to/empty/folder bash scripts/gpu_check.sh               # a GPU machine, every part in turn
#   OUT=... bash scripts/gpu_check.sh --part releases                 # one part under its own 8 minutes:
#                                                                     # releases, rest, tier, amp, finetune
#                                                                     # (GPU_CHECK_PART)
#   OUT=/path/to/empty/folder bash scripts/gpu_check.sh --cpu-smoke   # (or GPU_CHECK_CPU_SMOKE=1) this script's
#                                                                     # steps at toy size on a CPU
#
# Each step runs under `timeout` inside one deadline (GPU_CHECK_LIMIT_S, default 445 s, so a run ends inside 8
# minutes whatever hangs). --part all (the default) runs the parts in the order below under that one deadline,
# each step leaving time for the ones after it, the tier taking what is left: the releases are always measured.
# A machine lent by the command runs the parts one by one, each under its own deadline.
#   versions: nvidia-smi (GPU, driver), torch / CUDA / cuDNN / NCCL, Triton, a C compiler, key packages; then
#      the install: torch with CUDA only if the importable torch has none (README: "install the CUDA build of
#      your choice first"), the project (pip install -e . offline when its dependencies are there, else -e ".[test]")
#   part releases (what users run, first):
#   1. every release zero-shot and one fine-tuning step, fp32 and bf16, on 1 GPU (scripts/gpu_probe.py --only
#      releases): one summary line per release (ms per eval batch and per step, peak memory, host syncs, the fp32
#      forecast against the CPU's); a release whose package (chronos, timesfm, tirex ...) is missing: one line
#   2. where 2 GPUs are present, every release under NCCL (torchrun, 2 processes) against 1 process at equal
#      --eval_batch_size, and a bf16 fine-tuning step on 2 (tests/gpu/test_gpu_releases.py); else one line
#   3. fine-tuning Chronos-2 at its released shape with FSDP2 in bf16 (--fsdp --fsdp_mixed_precision bf16) and
#      with LoRA, each run.py --ddp on 1 GPU (benchmarks/fine_tuning_table.py's cells): samples/s and peak memory
#      a line each (fine_tuning.log)
#   part rest:
#   4. the README's main job: bash scripts/ddp_forecast.sh (DLinear, 10 epochs, one process per GPU, nccl)
#   5. scripts/gpu_probe.py --only others: host syncs per training step (torch.cuda.set_sync_debug_mode) for table
#      and O(1)-order data; hashed dropout masks against the CPU's; keyed vs plain dropout step time and peak
#      memory; TimesNet per-window evaluation; pinned worker batches
#   6. benchmarks/bench_models.py --device cuda: 4 models, eager / unkeyed masks / bf16 AMP
#   part tier:
#   7. the GPU test tier: python -m pytest -m gpu, one line per test (pytest.log; cheap files first)
#   part amp:
#   8. every zoo model one epoch under bf16 and fp16 autocast (tests/gpu/test_gpu_amp.py; pytest_amp.log)
#   part finetune (under --part all only when 150 s are left at its turn):
#   9. the fine-tuning table: Chronos-2, TimesFM 2.5, Time-MoE-200M and Toto-2.0-2.5B (GPU_CHECK_FT_RELEASES,
#      --model names; the first is step 3's) at their released shapes under DDP, FSDP2 and LoRA, samples/s and peak memory per GPU
#      (python -m benchmarks.fine_tuning_table --write): stored in $OUT as fine_tuning_table.json + .csv (copy both
#      to benchmarks/results/, then python -m benchmarks.results_page write); fine_tuning_table.log
#   then every log in $OUT: summary.txt, releases.log, fine_tuning.log, main_job.log, metrics.json, probe.log,
#   bench.log, pytest.log, pytest_amp.log, fine_tuning_table.log, extras.tar.gz (junit XML, the benchmark table,
#   install logs, pip list, the main job's results)
# Without CUDA (and without the smoke flag) it says so in one line and exits 3. The smoke skips the install, runs
# the releases on the CPU (their syncs counted on the meta device), the main job for one epoch, dry-runs the
# probe's code paths and a two-step benchmark of DLinear, checks that the GPU tier refuses to pass without CUDA
# (exit 4), and says what a GPU would measure; GPU_CHECK_SMOKE_LIGHT=1 runs one release (TimerBase) and leaves out
# the main job, the benchmark and the fine-tuning table (tests/test_gpu_path.py). The smoke's fine-tuning steps and
# table are a dry run at tiny shapes (each line says "CPU dry run, not a figure"; the table is never stored). Exit
# status: 0 when every step ended 0 (gpu_probe.py ends 1 on SYNCS, MISMATCH, ERROR or SLOW; fine_tuning_table.py on
# a cell that failed or timed out), else 1; 2 for a usage error.
set -uo pipefail

PART=${GPU_CHECK_PART:-all}
while (( $# )); do
  case $1 in
    --cpu-smoke) GPU_CHECK_CPU_SMOKE=1 ;;
    --part) PART=${2-}; shift ;;
    *) echo "gpu_check: unknown argument $1 (takes --cpu-smoke and --part releases|rest|tier|amp|finetune|all)" >&2; exit 2 ;;
  esac
  shift
done
case $PART in
  all|releases|rest|tier|amp|finetune) ;;
  *) echo "gpu_check: --part $PART: give releases, rest, tier, amp, finetune or all" >&2; exit 2 ;;
esac
SMOKE=${GPU_CHECK_CPU_SMOKE:-0}
# the releases of the fine-tuning steps (the first) and of the table (benchmarks/fine_tuning_table.py's --releases)
FT_RELEASES=${GPU_CHECK_FT_RELEASES:-Chronos2,TimesFM25,TimeMoE,Toto2}
LIGHT=${GPU_CHECK_SMOKE_LIGHT:-0}
FAILED=0
part() { [[ $PART == all || $PART == "$1" ]]; }

START=$(date +%s)
LIMIT=${GPU_CHECK_LIMIT_S:-445}
: "${OUT:?set OUT to an empty folder: OUT=/path bash gpu_check.sh}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=${PROJECT_ROOT:-$PWD}
cd "$ROOT" || exit 2
if [[ ! -f run.py || ! -d tests/gpu ]]; then
  echo "error: run from the project root (run.py and tests/gpu/ not found in $PWD)" >&2
  exit 2
fi
PY=$(command -v python3 || command -v python)
# no GPU to find and a torch without CUDA: nothing to check (one line); with a GPU, step 1 may install CUDA torch
if [[ $SMOKE != 1 ]] && ! { command -v nvidia-smi >/dev/null && timeout 15 nvidia-smi -L >/dev/null 2>&1; } \
   && [[ $(timeout 120 "$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null) != 1 ]]; then
  echo "gpu_check: no CUDA device here (no GPU for nvidia-smi, torch without CUDA): run it on a GPU machine, or with --cpu-smoke to try this script on the CPU" >&2
  exit 3
fi
WORK=$(mktemp -d)
SUMMARY=$OUT/summary.txt
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg NCCL_DEBUG=${NCCL_DEBUG:-WARN} MASTER_PORT=${MASTER_PORT:-29611}
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=30
: >"$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
# seconds a step may take: at most $1, leaving $2 for the steps after it (at least 5)
budget() { local want=$1 keep=$2 l; l=$(( $(left) - keep )); (( l < want )) && want=$l; (( want < 5 )) && want=5; echo "$want"; }
# run_step NAME SECONDS LOG CMD...: the command under timeout (SIGKILL 5 s after SIGTERM), rc and time in summary
run_step() {
  local name=$1 secs=$2 log=$3 t0 rc; shift 3
  t0=$(date +%s)
  say "== $name: up to ${secs}s ($(left)s left overall) -> $(basename "$log")"
  timeout -k 5 "$secs" "$@" >>"$log" 2>&1
  rc=$?
  local note=""
  (( rc == 124 || rc == 137 )) && note=" (TIMED OUT after ${secs}s)"
  say "== $name: exit $rc$note in $(( $(date +%s) - t0 ))s"
  (( rc == 0 )) || FAILED=1
  return $rc
}

# ------------------------------------------------------------------ 0. environment
if ! command -v python >/dev/null; then  # the project's scripts call `python`
  mkdir -p "$WORK/bin" && ln -s "$PY" "$WORK/bin/python" && export PATH="$WORK/bin:$PATH"
fi
say "# tsl-ddp GPU check (part $PART), $(date -u +%FT%TZ), project $(git rev-parse --short HEAD 2>/dev/null || echo '?') in $ROOT"
say "# python $PY ($("$PY" -V 2>&1)), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM"
GPU_PRESENT=0
if command -v nvidia-smi >/dev/null; then
  timeout 30 nvidia-smi >>"$SUMMARY" 2>&1
  timeout 15 nvidia-smi -L >/dev/null 2>&1 && GPU_PRESENT=1
else
  say "nvidia-smi: not found"
fi
say "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}; C compiler for Triton: $(command -v gcc || command -v cc || echo NONE)"
torch_info() {
  timeout 120 "$PY" - <<'EOF' 2>&1
import torch
cuda = torch.cuda.is_available()
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, cuda available {cuda}, "
      f"cuDNN {torch.backends.cudnn.version() if cuda else None}, "
      f"NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if cuda else None}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.1f} GiB, sm_{p.major}{p.minor}, bf16 {torch.cuda.is_bf16_supported()}")
try:
    import triton
    print(f"triton {triton.__version__}")
except ImportError:
    print("triton: not installed (--compile on GPU needs it)")
EOF
}

# ------------------------------------------------------------------ 1. install
INSTALL_LOG=$WORK/install.log
TORCH_STATE=$(timeout 120 "$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else ('cpu-build' if torch.version.cuda is None else 'no-device'))" 2>/dev/null || echo missing)
say "torch before install: $TORCH_STATE"
if (( GPU_PRESENT )) && [[ $TORCH_STATE == missing || $TORCH_STATE == cpu-build ]]; then
  # the default index's Linux wheel is a CUDA build; a CPU build in place would satisfy `pip install torch`
  [[ $TORCH_STATE == cpu-build ]] && timeout 60 "$PY" -m pip uninstall -y torch >>"$INSTALL_LOG" 2>&1
  run_step "pip install torch (CUDA build)" "$(budget 210 250)" "$INSTALL_LOG" "$PY" -m pip install --retries 1 torch
fi
torch_info | tee -a "$SUMMARY"
CUDA_OK=0
[[ $TORCH_STATE == cuda ]] && CUDA_OK=1
if [[ -s $INSTALL_LOG ]]; then  # torch was installed above: ask the new one
  CUDA_OK=$(timeout 120 "$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
fi
if (( ! CUDA_OK )) && [[ $SMOKE != 1 ]]; then
  echo "gpu_check: torch sees no CUDA device here ($TORCH_STATE; nvidia-smi lists a GPU: $GPU_PRESENT): run it on a GPU machine, or with --cpu-smoke to try the script on the CPU; details in $SUMMARY" >&2
  exit 3
fi
DEPS_OK=0
[[ $SMOKE == 1 ]] || DEPS_OK=$(timeout 120 "$PY" -c "import einops, pandas, sklearn, matplotlib, tqdm, pytest; print(1)" 2>/dev/null || echo 0)
INSTALLED=1
if [[ $SMOKE == 1 ]]; then  # the smoke checks this script, not an install: the tree runs as it is
  DEPS_OK=0 INSTALLED=0
  say "install: skipped (CPU smoke)"
elif (( DEPS_OK )); then  # offline-safe: no build isolation (no setuptools download), dependencies already there
  run_step "pip install -e . (deps present: --no-build-isolation --no-deps)" "$(budget 90 250)" "$INSTALL_LOG" \
    "$PY" -m pip install --no-build-isolation --no-deps -e . || INSTALLED=0
fi
if (( ! DEPS_OK && SMOKE != 1 )); then  # the README's install, which needs the package index
  run_step "pip install -e .[test]" "$(budget 200 250)" "$INSTALL_LOG" "$PY" -m pip install --retries 1 -e ".[test]" \
    || say "pip install -e .[test] failed (install.log in extras.tar.gz): the steps below may fail on missing packages"
elif (( ! INSTALLED && SMOKE != 1 )); then
  say "project not installed (install.log in extras.tar.gz; no network retry, its dependencies are all there): run.py and the tests run from the project root anyway"
fi
[[ $SMOKE == 1 ]] || "$PY" -m pip list 2>/dev/null | grep -i -E '^(torch|triton|numpy|pandas|scikit-learn|einops|pytest|pytest-timeout|pyarrow|tensorboard|safetensors|nvidia-nccl|nvidia-cudnn)' >"$WORK/pip_list.txt"
cat "$WORK/pip_list.txt" >>"$SUMMARY" 2>/dev/null
GPUS=0
(( CUDA_OK )) && GPUS=$(timeout 120 "$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
say "CUDA usable by torch: $CUDA_OK ($GPUS GPUs)"

# ------------------------------------------------------------------ part releases: what users run, first
RELEASES_LOG=$OUT/releases.log
if part releases; then
  if (( CUDA_OK )); then
    run_step "releases: zero-shot and a fine-tuning step, fp32 and bf16, 1 GPU (gpu_probe.py --only releases)" \
      "$(budget 150 230)" "$RELEASES_LOG" "$PY" scripts/gpu_probe.py --only releases
  else  # the smoke: the same code on the CPU, syncs counted on meta; the light smoke one release
    releases=()
    (( LIGHT )) && releases=(--releases TimerBase)
    run_step "releases on the CPU (smoke; a GPU measures ms, peak memory and syncs with torch.cuda)" \
      "$(budget 150 200)" "$RELEASES_LOG" "$PY" scripts/gpu_probe.py --cpu --only releases ${releases[@]+"${releases[@]}"}
  fi
  grep -E "^release |^# probe" "$RELEASES_LOG" >>"$SUMMARY"
  if (( GPUS >= 2 )); then
    run_step "releases under NCCL: 2 processes against 1 (tests/gpu/test_gpu_releases.py)" "$(budget 240 200)" \
      "$RELEASES_LOG" "$PY" -m pytest -m gpu -v -rfEs -p no:cacheprovider tests/gpu/test_gpu_releases.py
    grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$RELEASES_LOG" | grep test_gpu_releases | tail -n 20 >>"$SUMMARY"
  else
    say "== releases under NCCL: left out ($GPUS GPUs here; tests/gpu/test_gpu_releases.py needs 2)"
  fi
  # full fine-tuning sharded by FSDP2 in bf16, and LoRA: run.py --ddp on 1 GPU (without CUDA: a dry run, tiny)
  FT_LOG=$OUT/fine_tuning.log
  for mode in FSDP2 LoRA; do
    secs=$(budget 75 190)
    run_step "fine-tuning ${FT_RELEASES%%,*}, $mode, run.py --ddp on 1 GPU (benchmarks/fine_tuning_table.py)" \
      "$secs" "$FT_LOG" "$PY" -m benchmarks.fine_tuning_table --releases "${FT_RELEASES%%,*}" --modes $mode \
      --cell_timeout "$(( secs > 20 ? secs - 10 : 10 ))"
  done
  grep -E "^fine-tuning " "$FT_LOG" >>"$SUMMARY" 2>/dev/null
fi

# ------------------------------------------------------------------ part rest: the README's main job
MAIN_LOG=$OUT/main_job.log
if part rest; then
extra=()
(( CUDA_OK )) || extra=(--train_epochs 1)
if (( LIGHT )); then  # the suite's test of this script: its cheap steps only
  say "== main job: left out (GPU_CHECK_SMOKE_LIGHT=1)"
else
run_step "main job: bash scripts/ddp_forecast.sh" "$(budget 90 190)" "$MAIN_LOG" \
  bash scripts/ddp_forecast.sh --checkpoints "$WORK/main/checkpoints" --results_dir "$WORK/main/results" ${extra[@]+"${extra[@]}"}
metrics=$(find "$WORK/main/results" -name metrics.json 2>/dev/null | head -n1)
if [[ -n $metrics ]]; then
  cp "$metrics" "$OUT/metrics.json"
  "$PY" - "$metrics" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, sys
m = json.load(open(sys.argv[1]))
keys = ("mse", "mae", "vali_loss", "test_windows", "world_size", "stopped_epoch", "peak_gpu_mib")
print("main job metrics: " + ", ".join(f"{k}={m.get(k)}" for k in keys)
      + f", epochs={len(m.get('history', []))}, use_gpu={m.get('args', {}).get('use_gpu')}")
EOF
else
  say "main job: no metrics.json written"
fi
grep -E "data (on|off) the GPU|error|Traceback|peak GPU memory" "$MAIN_LOG" | head -n 8 >>"$SUMMARY"
fi
fi

# ------------------------------------------------------------------ part rest: the probe's other checks
PROBE_LOG=$OUT/probe.log
if part rest; then
if (( CUDA_OK )); then
  run_step "probe (host syncs, hashed masks, keyed-dropout cost, TimesNet eval, pinned workers)" "$(budget 90 130)" \
    "$PROBE_LOG" "$PY" scripts/gpu_probe.py --only others
else
  run_step "probe (CPU dry run of its code paths)" "$(budget 90 100)" "$PROBE_LOG" "$PY" scripts/gpu_probe.py --cpu --only others
fi
grep -E '^\{' "$PROBE_LOG" | cut -c1-400 >>"$SUMMARY"

# ------------------------------------------------------------------ part rest: speed benchmark
BENCH_LOG=$OUT/bench.log
if (( CUDA_OK )); then
  run_step "bench_models --device cuda" "$(budget 110 60)" "$BENCH_LOG" \
    "$PY" benchmarks/bench_models.py --device cuda --models DLinear iTransformer PatchTST TimeMixer \
    --variants eager,unkeyed,amp --steps 10 --rounds 2 --no_shares --out "$WORK/bench_models_gpu.md" --overwrite
elif (( LIGHT )); then
  say "== bench_models: left out (GPU_CHECK_SMOKE_LIGHT=1)"
else
  run_step "bench_models --device cpu (smoke)" "$(budget 60 40)" "$BENCH_LOG" \
    "$PY" benchmarks/bench_models.py --device cpu --models DLinear --variants eager,unkeyed --steps 2 --rounds 1 \
    --no_shares --out "$WORK/bench_models_gpu.md" --overwrite
fi
if [[ -f $WORK/bench_models_gpu.md ]]; then
  grep -E '^\|' "$WORK/bench_models_gpu.md" >>"$SUMMARY"
fi
fi

# ------------------------------------------------------------------ part tier: the GPU test tier, last (what is left)
PYTEST_LOG=$OUT/pytest.log
# cheap files first, so a time-out still leaves most tests with a known outcome (the releases ran in their own
# part, test_gpu_releases.py; the zoo's AMP runs, test_gpu_amp.py, are the part after); -v: one line per test
FILES=(test_gpu_dropout.py test_gpu_placement.py test_gpu_records.py test_gpu_sync_bn.py test_gpu_resume.py
       test_gpu_compile.py test_gpu_evaluation.py test_gpu_failing_rank.py)
PYTEST_ARGS=(-m gpu -v -rfEs -p no:cacheprovider --maxfail=8 --durations=12 --junitxml="$WORK/pytest_gpu_junit.xml")
if "$PY" -c "import pytest_timeout" 2>/dev/null; then PYTEST_ARGS+=(--timeout=180); fi
if part tier; then
if (( CUDA_OK )); then
  say "pytest collects $("$PY" -m pytest -m gpu --collect-only -q -p no:cacheprovider tests/gpu 2>/dev/null | tail -n1)"
  run_step "pytest -m gpu (tests/gpu)" "$(budget 420 10)" "$PYTEST_LOG" \
    "$PY" -m pytest "${PYTEST_ARGS[@]}" "${FILES[@]/#/tests/gpu/}"
  grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed|skipped|error)" "$PYTEST_LOG" | tail -n 40 >>"$SUMMARY"
  say "per test: $(grep -cE ' PASSED' "$PYTEST_LOG") passed, $(grep -cE ' FAILED' "$PYTEST_LOG") failed, $(grep -cE ' SKIPPED' "$PYTEST_LOG") skipped, $(grep -cE ' ERROR' "$PYTEST_LOG") errors (from -v lines)"
else  # the smoke: without CUDA the tier must refuse (a usage error, exit 4), never pass by skipping
  say "== pytest -m gpu without CUDA (smoke): expecting the tier's one-line refusal, exit 4"
  timeout -k 5 "$(budget 60 10)" "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_gpu_placement.py >>"$PYTEST_LOG" 2>&1
  rc=$?
  grep -E "^ERROR" "$PYTEST_LOG" | head -n 1 >>"$SUMMARY"
  if (( rc == 4 )); then say "== pytest -m gpu without CUDA: refused (exit 4), as it must"; else say "== pytest -m gpu without CUDA: exit $rc, expected 4"; FAILED=1; fi
fi
fi

# ------------------------------------------------------------------ part amp: every zoo model under bf16 and fp16
AMP_LOG=$OUT/pytest_amp.log
if part amp; then
  if (( CUDA_OK )); then
    run_step "pytest -m gpu tests/gpu/test_gpu_amp.py (the zoo under AMP)" "$(budget 420 10)" "$AMP_LOG" \
      "$PY" -m pytest "${PYTEST_ARGS[@]/--junitxml=*/--junitxml=$WORK/pytest_amp_junit.xml}" tests/gpu/test_gpu_amp.py
    grep -E "[0-9]+ (passed|failed|skipped|error)" "$AMP_LOG" | tail -n 1 >>"$SUMMARY"
    say "per test: $(grep -cE ' PASSED' "$AMP_LOG") passed, $(grep -cE ' FAILED' "$AMP_LOG") failed (from -v lines)"
  else
    say "== the zoo under AMP (tests/gpu/test_gpu_amp.py): needs CUDA; its refusal without CUDA is the tier's"
  fi
fi
# ------------------------------------------------------------------ part finetune: the fine-tuning table
TABLE_LOG=$OUT/fine_tuning_table.log
if [[ $PART == finetune ]] || { [[ $PART == all ]] && (( $(left) >= 150 )); }; then
  if (( CUDA_OK )); then  # stored in $OUT (copy fine_tuning_table.json + .csv to benchmarks/results/)
    secs=$(budget 420 10)
    run_step "fine-tuning table: 3 releases x DDP, FSDP2, LoRA, 1 GPU (benchmarks/fine_tuning_table.py --write)" \
      "$secs" "$TABLE_LOG" "$PY" -m benchmarks.fine_tuning_table --releases "$FT_RELEASES" --write \
      --results_dir "$OUT" --deadline_s "$(( secs > 35 ? secs - 15 : 20 ))"
  elif (( LIGHT )); then
    say "== fine-tuning table: left out (GPU_CHECK_SMOKE_LIGHT=1)"
  else  # never stored: the CPU's figures are not the GPU table
    secs=$(budget 150 10)
    run_step "fine-tuning table (CPU dry run at tiny shapes, not stored)" "$secs" "$TABLE_LOG" \
      "$PY" -m benchmarks.fine_tuning_table --releases "$FT_RELEASES" --deadline_s "$(( secs > 35 ? secs - 15 : 20 ))"
  fi
  grep -E "^fine-tuning " "$TABLE_LOG" >>"$SUMMARY" 2>/dev/null
elif [[ $PART == all ]]; then
  say "== fine-tuning table: left out ($(left)s left; --part finetune runs it under its own deadline)"
fi
(( CUDA_OK )) || say "# on a GPU this check measures, per release: ms per eval batch and per fine-tuning step in fp32 and bf16, peak memory (torch.cuda.max_memory_allocated), host syncs (torch.cuda.set_sync_debug_mode), the fp32 forecast against the CPU's, and 1 against 2 processes under NCCL where 2 GPUs are present; fine-tuning samples/s and peak memory under FSDP2 bf16 and LoRA (the table: DDP, FSDP2, LoRA of 3 releases)"

# ------------------------------------------------------------------ pack the rest
rm -rf "$WORK/inductor" "$WORK/main/checkpoints" "$WORK/bin"
timeout 20 tar -czf "$OUT/extras.tar.gz" -C "$WORK" . 2>/dev/null
say "# done in $(( $(date +%s) - START ))s; $( ((FAILED)) && echo 'a step FAILED' || echo 'every step ended 0'); outputs: $(cd "$OUT" && ls | tr '\n' ' ')"
exit $FAILED
