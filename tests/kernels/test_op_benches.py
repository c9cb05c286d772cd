"""The benchmark scripts of single ops (``kernels/bench/polyline_decays.py``, ``depthwise_conv.py``;
not installed modules), run in their quick mode on the CPU so that a GPU session finds them
working: every row compares with the fp32 reference, and the bytes models count the backward's
partial sums."""
import os
import re

import pytest
import torch

from ppma.bench.gpu.kernel_tables import load_bench

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1",
                    reason="Triton kernels need a CUDA device or TRITON_INTERPRET=1")
@pytest.mark.parametrize("script", ["polyline_decays.py", "depthwise_conv.py"])
def test_quick_mode_rows_and_errors(script, capsys):
    bench = load_bench(script)
    bench.main(["--quick", "--device", "cpu", "--threads", "1", "--repeat", "1", "--dtypes", "fp32"])
    rows = re.findall(r"^\| (\(.*?\)) \| fp32 \| (fwd|fwd\+bwd) \| (triton|torch) \| ([\d.e+-]+) \|.*\| ([\d.]*)x? \| "
                      r"([\d.e+-]+) \|$", capsys.readouterr().out, re.MULTILINE)
    assert len(rows) == len(bench.QUICK_SHAPES) * 2 * 2, rows
    for shape, step, impl, ms, model, error in rows:
        assert float(ms) > 0 and float(error) <= 1e-5, (shape, step, impl, error)
        assert (model != "") == (impl == "triton"), (shape, impl)


def test_decays_bytes_model():
    """Forward: ``x`` read, the decays written; the backward adds ``x``, the decays' gradient, ``dx``
    and two passes over the partial sums (one row of ``n * d + 2 * heads`` per token tile)."""
    bench = load_bench("polyline_decays.py")
    x = torch.empty(2, 7, 9, 64)  # 4 heads of 16: backward tiles of 2,048 / (4 * 16) = 32 tokens, two an image
    decays = 2 * 2 * 63 * 4 * 4
    assert bench.must_move(x, 4, False) == x.numel() * 4 + decays
    assert bench.kernel_bytes(x, 4, False) == bench.must_move(x, 4, False)
    assert bench.kernel_bytes(x, 4, True) == 3 * x.numel() * 4 + 2 * decays + 2 * (2 * 2) * (2 * 16 + 2 * 4) * 4


def test_depthwise_conv_bytes_model():
    """Forward: ``x`` read, ``y`` written; the backward adds ``x`` and ``dy`` read, ``dx`` written, and
    two passes over the partial sums (``C * (K*K + 1)`` fp32 values per tile of 64 pixels)."""
    bench = load_bench("depthwise_conv.py")
    x = torch.empty(2, 7, 9, 24)  # rows of 16 columns, 4 rows a tile: 2 bands an image
    assert bench.must_move(x, False) == 2 * x.numel() * 4
    assert bench.kernel_bytes(x, 3, False) == bench.must_move(x, False)
    assert bench.kernel_bytes(x, 3, True) == 5 * x.numel() * 4 + 2 * (2 * 2) * 24 * 10 * 4
