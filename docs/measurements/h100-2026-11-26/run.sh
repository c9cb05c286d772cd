#!/usr/bin/env bash
# One call on the GPU machine: install, GPU report (with the officials), kernel tests on the GPU,
# the linear kind's backward. Everything goes to $OUT.
set -u
export PYTHONUNBUFFERED=1
log() { echo "== $(date +%T) $*"; }
log setup
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
python3 -c "import torch, triton, timm; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__)"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | grep -v WARNING | tail -3
python3 -c "import ppma, ppma.kernels; print('ppma ok')" || exit 1
log report
timeout 385 python3 tools/gpu_report.py --output $OUT/gpu_report.md \
  --official-ppma .official/ppma --official-mlla .official/mlla > $OUT/gpu_report.log 2>&1
echo "report rc=$?"; tail -5 $OUT/gpu_report.log
log pytest
timeout 105 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels tests/ops/test_cross_scan_selective.py tests/ops/test_registry.py \
  > $OUT/pytest_gpu.log 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest_gpu.log | cut -c1-300 | tail -25
log linear-backward
timeout 40 python3 kernels/bench/polyline_linear_attention.py --backward --batch 64 --repeat 5 --sizes > $OUT/linear_backward.log 2>&1
echo "bench rc=$?"; cat $OUT/linear_backward.log | cut -c1-200 | tail -20
log done
