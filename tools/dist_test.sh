#!/usr/bin/env bash
# Distributed evaluation with torchrun: NPROC processes on this node (GPUs, or CPUs over gloo).
#   bash tools/dist_test.sh CONFIG CHECKPOINT NPROC [tools/test.py options...]
# Several nodes: set NNODES, NODE_RANK, MASTER_ADDR (and PORT) as for dist_train.sh.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: bash tools/dist_test.sh CONFIG CHECKPOINT NPROC [test.py options...]" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
shift 3
exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
    --nproc_per_node="$NPROC" \
    "$(dirname "$0")/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
