"""The depthwise conv's benchmark script (``kernels/bench/depthwise_conv.py``, not an installed
module), run in its quick mode on the CPU so that a GPU session finds it working: every row
compares with the fp32 reference, and the bytes model counts the backward's partial sums."""
import os
import re

import pytest
import torch

from ppma.bench.gpu.kernel_tables import load_bench

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1",
                    reason="Triton kernels need a CUDA device or TRITON_INTERPRET=1")
def test_quick_mode_rows_and_errors(capsys):
    bench = load_bench("depthwise_conv.py")
    bench.main(["--quick", "--device", "cpu", "--threads", "1", "--repeat", "1", "--dtypes", "fp32"])
    rows = re.findall(r"^\| (\(.*?\)) \| fp32 \| (fwd|fwd\+bwd) \| (triton|torch) \| ([\d.e+-]+) \|.*\| ([\d.]*)x? \| "
                      r"([\d.e+-]+) \|$", capsys.readouterr().out, re.MULTILINE)
    assert len(rows) == len(bench.QUICK_SHAPES) * 2 * 2, rows
    for shape, step, impl, ms, model, error in rows:
        assert float(ms) > 0 and float(error) <= 1e-5, (shape, step, impl, error)
        assert (model != "") == (impl == "triton"), (shape, impl)


def test_bytes_model():
    """Forward: ``x`` read, ``y`` written; the backward adds ``x`` and ``dy`` read, ``dx`` written, and
    two passes over the partial sums (``C * (K*K + 1)`` fp32 values per tile of 64 pixels)."""
    bench = load_bench("depthwise_conv.py")
    x = torch.empty(2, 7, 9, 24)  # rows of 16 columns, 4 rows a tile: 2 bands an image
    assert bench.must_move(x, False) == 2 * x.numel() * 4
    assert bench.kernel_bytes(x, 3, False) == bench.must_move(x, False)
    assert bench.kernel_bytes(x, 3, True) == 5 * x.numel() * 4 + 2 * (2 * 2) * 24 * 10 * 4
