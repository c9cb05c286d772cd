"""The linear kind's benchmark script (``kernels/bench/polyline_linear_attention.py``, not an
installed module): its ``--backward``, ``--step`` and ``--chunks`` rows on the CPU, so that a GPU
session does not find the tables broken (every form it times agrees with the first, and the route
column is the op's), and its forward kernels' cost models."""

import torch

from ppma.bench.gpu.kernel_tables import load_bench


def test_stages_follow_the_input_size():
    bench = load_bench("polyline_linear_attention.py")
    assert bench.stages_at(224) == bench.STAGES
    assert bench.stages_at(64) == [(4, 16, 16, 16), (4, 8, 8, 32), (8, 4, 4, 32), (16, 2, 2, 32)]


def test_backward_rows_on_the_cpu():
    torch.manual_seed(0)
    bench = load_bench("polyline_linear_attention.py")
    header, rule, *rows = bench.backward_rows(1, torch.device("cpu"), 1, size=64)
    assert "fused quadratic" in header and rule.startswith("|---")
    assert len(rows) == 4
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        chunked_ms, quadratic_ms, fused_ms, taken, gap = cells[2], cells[3], cells[4], cells[5], float(cells[6])
        assert float(chunked_ms) > 0 and float(quadratic_ms) > 0 and fused_ms == "-"  # no fused passes off CUDA
        assert taken == "quadratic" and gap < 1e-5  # these small grids take the quadratic form


def test_step_and_chunk_rows_on_the_cpu():
    """``--step`` compares the same gradients both ways; ``--chunks`` counts a chunk's ops and
    its peak in chunk-sized tensors (the quadratic form's and the chunked one's, a few each)."""
    torch.manual_seed(0)
    bench = load_bench("polyline_linear_attention.py")
    *_, now, chunked = bench.step_rows(1, 64, torch.device("cpu"), 1)
    assert now.split("|")[1].strip() == "the op's backward now" and float(now.split("|")[3]) == 1.0
    assert float(chunked.split("|")[4]) < 1e-5
    *_, eight, one, quadratic = bench.chunk_rows(torch.device("cpu"))
    cells = {name: [float(c) for c in row.split("|")[2:7]] for name, row in
             (("eight", eight), ("one", one), ("quadratic", quadratic))}
    assert [cells[name][0] for name in cells] == [8, 1, 8]
    assert cells["eight"][1] > cells["one"][1] > 0  # every chunk dispatches its own ops
    assert all(1 < tensors < 20 for *_, tensors in cells.values())


def test_forward_cost_models():
    """The fused kernel's model on a grid its tiles cover without padding (32 x 32, d = 32: tiles of
    two rows of 32 columns), and against the strip kernels' where both are the quadratic form over
    one strip (stages 2 to 4): one ``q k^T`` for both masks, so half their FLOPs."""
    bench = load_bench("polyline_linear_attention.py")
    pairs = 1024 * 1024
    fused = bench.fused_model(1, 1, 32, 32, 32)
    assert fused["flops"] == 2 * pairs * 64 and fused["exps"] == 2 * pairs
    assert fused["unique"] < fused["requested"]
    for heads, hh, ww, d in bench.STAGES[1:]:
        strips, fused = bench.strip_model(2, heads, hh, ww, d), bench.fused_model(2, heads, hh, ww, d)
        assert fused["flops"] == strips["flops"] / 2 and fused["unique"] < strips["unique"]
    header, rule, *rows = bench.forward_model_rows(64)
    assert len(rows) == len(bench.STAGES) and header.count("|") == rule.count("|")
