"""The polyline attention benchmark script (``kernels/bench/polyline_attention.py``, not an
installed module): what it reports beside the timings, checked on the CPU so that a GPU session
finds it working: the configuration each kernel ran, and the vanilla cost model's loop tiles."""
import os

import pytest
import torch
from kernel_configs import run_config

from ppma.bench.gpu.kernel_tables import load_bench

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1",
                    reason="Triton kernels need a CUDA device or TRITON_INTERPRET=1")
@pytest.mark.parametrize("backward", [False, True])
def test_kept_configs_name_what_each_kernel_ran(backward, monkeypatch):
    """A vanilla call names its forward's configuration, and with the backward both passes'; a
    kernel swapped to another configuration is named by it."""
    from ppma.kernels.polyline_attention import vanilla

    bench = load_bench("polyline_attention.py")
    run_config(monkeypatch, (vanilla._bwd_dq_kernel,), LROWS=2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs, grad = bench.make_inputs((1, 2, 7, 9, 16), torch.float32, torch.device(device), backward)
    fn = bench.attend("triton", "vanilla", "official", torch.device(device))

    def step():
        out = fn(*inputs)
        if backward:
            torch.autograd.grad(out, inputs, grad)

    kept = bench.kept_configs("vanilla", step)
    names = [part.split(" ", 1)[0] for part in kept.split("; ")]
    assert names == (["fwd", "dk/dv", "dq"] if backward else ["fwd"]), kept
    if backward:
        assert kept.endswith("dq BLOCK=64 LROWS=2 w8 s1"), kept


def test_vanilla_model_counts_the_loop_tiles():
    """At 14 x 14 (one 16-column block), a program takes 14 one-row loop tiles, 7 two-row and 4
    four-row ones; four rows pad the loop side to 16 rows (16 / 14 the products)."""
    bench = load_bench("polyline_attention.py")
    shape = (64, 8, 14, 14, 32)
    models = {rows: bench.vanilla_model(shape, "official", 2, loop_rows=rows) for rows in (1, 2, 4)}
    assert [models[rows]["fwd"]["iterations"] for rows in (1, 2, 4)] == [14, 7, 4]
    assert models[2]["fwd"]["tensor"] == models[1]["fwd"]["tensor"]
    assert models[4]["fwd"]["tensor"] * 14 == models[1]["fwd"]["tensor"] * 16
