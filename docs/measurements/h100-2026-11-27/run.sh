#!/usr/bin/env bash
# One call on the GPU machine: install, GPU report (with the officials), then the attention kernels'
# benchmark (vanilla, criss-cross) on the warm Triton cache. Everything goes to $OUT.
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
log vanilla
timeout 100 python3 kernels/bench/polyline_attention.py --repeat 5 > $OUT/attention_vanilla.log 2>&1
echo "vanilla rc=$?"; cut -c1-220 $OUT/attention_vanilla.log | tail -30
log criss-cross
timeout 60 python3 kernels/bench/polyline_attention.py --kind criss_cross --repeat 5 > $OUT/attention_criss_cross.log 2>&1
echo "criss-cross rc=$?"; cut -c1-220 $OUT/attention_criss_cross.log | tail -30
log done
