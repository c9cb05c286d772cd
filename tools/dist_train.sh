#!/usr/bin/env bash
# Distributed training with torchrun: NPROC processes on this node (one per GPU; on a machine
# without CUDA, CPU processes talking over gloo).
#   bash tools/dist_train.sh CONFIG NPROC [tools/train.py options...]
# Several nodes: run it on each with NNODES, NODE_RANK, MASTER_ADDR (and PORT) set, e.g.
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash tools/dist_train.sh CONFIG 8
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: bash tools/dist_train.sh CONFIG NPROC [train.py options...]" >&2
    exit 2
fi
CONFIG=$1
NPROC=$2
shift 2
exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
    --nproc_per_node="$NPROC" \
    "$(dirname "$0")/train.py" "$CONFIG" --launcher pytorch "$@"
