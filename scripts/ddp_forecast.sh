#!/usr/bin/env bash
# DDP training with PyTorch's own launcher (torchrun). Works as-is on a CPU-only machine
# with the built-in data; extra arguments pass through to run.py.
# `python -m utils.launch` is torchrun itself (same arguments, elastic agent and c10d
# rendezvous) that ends a failed run with one line instead of a launcher traceback.
#
#   bash scripts/ddp_forecast.sh                       # one process per GPU (2 without CUDA), DLinear
#   NPROC_PER_NODE=4 MODEL=TimerXL bash scripts/ddp_forecast.sh --train_epochs 5
#   MAX_RESTARTS=3 bash scripts/ddp_forecast.sh      # survive worker crashes: restart and resume
#   # two machines: run on each, NODE_RANK=0 on the one at MASTER_ADDR (docs/scaling.md)
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 bash scripts/ddp_forecast.sh
#
# NODE_RANK=0 hosts the c10d rendezvous store at MASTER_ADDR:MASTER_PORT; the other nodes
# connect to it. c10d numbers nodes itself, so global rank 0 may live on any node.
# Each process takes cores / NPROC_PER_NODE threads; several "nodes" on one machine would each
# take every core, so pass --num_threads (cores / all processes on the machine) there.
# RDZV_TIMEOUT: seconds to wait for every node to join (and at most 60 to reach the store).
set -euo pipefail
cd "$(dirname "$0")/.."

# default: one process per visible GPU, or 2 on a machine without CUDA
NPROC_PER_NODE=${NPROC_PER_NODE:-$(python -c "import torch; print(torch.cuda.device_count() or 2)")}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
MODEL=${MODEL:-DLinear}
MAX_RESTARTS=${MAX_RESTARTS:-0}  # torchrun restarts the whole group this often; workers resume from last.pth
RDZV_TIMEOUT=${RDZV_TIMEOUT:-600}

MAX_NODES=${NNODES##*:}  # NNODES may be an elastic range MIN:MAX
if ! [[ "$MAX_NODES" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: NNODES must be a positive number of machines (or MIN:MAX), got '$NNODES'" >&2
  exit 2
fi
if ! [[ "$NODE_RANK" =~ ^[0-9]+$ ]] || (( NODE_RANK >= MAX_NODES )); then
  echo "error: NODE_RANK=$NODE_RANK does not fit NNODES=$NNODES: NODE_RANK is 0 on the machine at" \
       "MASTER_ADDR and 1 to NNODES-1 on the others, with the same NNODES everywhere" >&2
  exit 2
fi
if ! [[ "$RDZV_TIMEOUT" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: RDZV_TIMEOUT must be a positive number of seconds, got '$RDZV_TIMEOUT'" >&2
  exit 2
fi

exec python -m utils.launch \
  --nproc_per_node="$NPROC_PER_NODE" \
  --nnodes="$NNODES" \
  --rdzv_backend=c10d \
  --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \
  --rdzv_conf="is_host=$(( NODE_RANK == 0 )),join_timeout=$RDZV_TIMEOUT,read_timeout=$(( RDZV_TIMEOUT < 60 ? RDZV_TIMEOUT : 60 ))" \
  --rdzv_id="${RDZV_ID:-tsl-ddp}" \
  --max_restarts="$MAX_RESTARTS" \
  run.py --ddp --model "$MODEL" "$@"
