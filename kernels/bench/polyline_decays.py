"""Benchmark of ``polyline_decays`` (PPMA's decay generator): Triton kernels vs the PyTorch reference.

A script (not installed with ``ppma.kernels``). For every shape and dtype of the tokens, forward
and forward+backward: median time, launches (Triton kernels and PyTorch ops, counted by the
profiler on CUDA), bandwidth over the bytes that must move as a fraction of the measured
device-to-device copy bandwidth, the speed-up over the reference and the relative error of the
output and every gradient against the fp32 reference on the same inputs.

Bytes that must move (``x`` ``(B, *grid, C)``, ``n`` axes, ``heads``): forward reads ``x`` and
writes ``n * B * heads * N`` fp32 decays; forward+backward adds reading ``x`` and the decays'
gradient and writing ``dx``. The kernels move that (each reads ``x`` once per token tile) plus the
backward's partial sums: ``n * d + 2 * heads`` fp32 values per tile of ``BLOCK_T`` tokens, written
and read back by three sums (the ``model`` column, as a multiple of the minimum). The reference
runs a GEMM, a layout copy and four elementwise passes forward, about a dozen kernels backward.

    python kernels/bench/polyline_decays.py                      # CUDA, PPMA-T's stages at batch 64
    TRITON_INTERPRET=1 python kernels/bench/polyline_decays.py --quick --device cpu --threads 1
"""
from __future__ import annotations

import functools
import math

import torch

from ppma.kernels.common import op_bench
from ppma.kernels.common.accuracy import fp32_copies, outcome, relative_error
from ppma.kernels.common.runtime import triton_unavailable_reason
from ppma.kernels.common.timing import cuda_launches, median_seconds
from ppma.kernels.polyline_decays import projection
from ppma.ops import polyline_decays
from ppma.ops.polyline_decays_impl import polyline_decays_reference

# (B, H, W, C, heads): PPMA-T's four stages at 224 x 224, two axes (2-D); the last, a 3-D grid.
FULL_SHAPES = [(64, 56, 56, 64, 4), (64, 28, 28, 128, 4), (64, 14, 14, 256, 8), (64, 7, 7, 512, 16),
               (8, 8, 14, 14, 256, 8)]
QUICK_SHAPES = [(2, 7, 9, 64, 4), (1, 2, 3, 4, 32, 2)]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
IMPLS = {"triton": functools.partial(polyline_decays, backend="triton"), "torch": polyline_decays_reference}


def make_inputs(shape, dtype, device, requires_grad):
    """``[x, weight, dt_bias, A_log]`` and an output gradient, seeded."""
    *tokens, c, heads = shape
    gen = torch.Generator().manual_seed(0)
    axes, d = len(tokens) - 1, c // heads
    inputs = [torch.randn(*tokens, c, generator=gen).to(device, dtype),
              (torch.randn(axes, d, generator=gen) / d**0.5).to(device),
              (torch.rand(heads, generator=gen) * 4 - 6).to(device), (torch.rand(heads, generator=gen) * 0.5).to(device)]
    for t in inputs:
        t.requires_grad_(requires_grad)
    return inputs, torch.randn(axes, tokens[0], heads, *tokens[1:], generator=gen).to(device)


def must_move(x, heads, backward):
    x_bytes, decays = x.numel() * x.element_size(), (x.dim() - 2) * x[..., 0].numel() * heads * 4
    return 3 * x_bytes + 2 * decays if backward else x_bytes + decays


def kernel_bytes(x, heads, backward):
    """Bytes the kernels move (module doc): the minimum plus the backward's partial sums."""
    minimum = must_move(x, heads, backward)
    if not backward:
        return minimum
    d, axes = x.shape[-1] // heads, x.dim() - 2
    tiles = x.shape[0] * -(-math.prod(x.shape[1:-1]) // projection.block_tokens(projection.BACKWARD_TILE, heads, d))
    return minimum + 2 * tiles * (axes * d + 2 * heads) * 4


def run_case(impl, shape, dtype, device, backward, warmup, repeat, want):
    """One table row as a dict (``time_ms`` None with a ``note`` when skipped)."""
    if impl == "triton" and triton_unavailable_reason(device) is not None:
        return {"note": "skipped: Triton unavailable (CPU needs TRITON_INTERPRET=1)"}
    inputs, grad = make_inputs(shape, dtype, device, backward)

    if backward:
        def step():
            torch.autograd.grad(IMPLS[impl](*inputs), inputs, grad)
    else:
        def step():
            with torch.no_grad():
                IMPLS[impl](*inputs)
    seconds = median_seconds(step, device, warmup, repeat)
    minimum = must_move(inputs[0], shape[-1], backward)
    row = {"time_ms": seconds * 1e3, "gbps": minimum / seconds / 1e9, "launches": cuda_launches(step, device),
           "error": relative_error(outcome(IMPLS[impl], inputs, grad, backward), want)}
    if impl == "triton":
        row["model"] = kernel_bytes(inputs[0], shape[-1], backward) / minimum
    return row


def reference(shape, dtype, device, backward):
    """The fp32 reference's output (and gradients) on the inputs of ``shape`` in ``dtype``."""
    inputs, grad = make_inputs(shape, dtype, device, backward)
    return outcome(polyline_decays_reference, fp32_copies(inputs), grad, backward)


def main(argv=None):
    op_bench.run(__doc__, "polyline_decays", "(B, [T,] H, W, C, heads)", (FULL_SHAPES, QUICK_SHAPES), DTYPES,
                 list(IMPLS), reference, run_case, argv)


if __name__ == "__main__":
    main()
