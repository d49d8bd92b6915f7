#!/usr/bin/env bash
# DDP training with PyTorch's own launcher (torchrun). Works as-is on a CPU-only machine
# with the built-in data; extra arguments pass through to run.py.
# `python -m utils.launch` is torchrun itself (same arguments, elastic agent and c10d
# rendezvous) that ends a failed run with one line instead of a launcher traceback.
#
#   bash scripts/ddp_forecast.sh                                    # 2 local processes, DLinear
#   NPROC_PER_NODE=4 MODEL=TimerXL bash scripts/ddp_forecast.sh --train_epochs 5
#   MAX_RESTARTS=3 bash scripts/ddp_forecast.sh      # survive worker crashes: restart and resume
#   # two machines: run on each, NODE_RANK=0 on the one at MASTER_ADDR
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 bash scripts/ddp_forecast.sh
set -euo pipefail
cd "$(dirname "$0")/.."

NPROC_PER_NODE=${NPROC_PER_NODE:-2}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
MODEL=${MODEL:-DLinear}
MAX_RESTARTS=${MAX_RESTARTS:-0}  # torchrun restarts the whole group this often; workers resume from last.pth

exec python -m utils.launch \
  --nproc_per_node="$NPROC_PER_NODE" \
  --nnodes="$NNODES" \
  --node_rank="$NODE_RANK" \
  --rdzv_backend=c10d \
  --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \
  --rdzv_id="${RDZV_ID:-tsl-ddp}" \
  --max_restarts="$MAX_RESTARTS" \
  run.py --ddp --model "$MODEL" "$@"
