"""Benchmark of ``depthwise_conv`` (PPMA's and MILA's depthwise convs and their residual): Triton
kernels vs the PyTorch reference (cuDNN's depthwise conv on the channels-first view on a GPU).

A script (not installed with ``ppma.kernels``). For every shape and dtype, forward and
forward+backward: median time, launches (counted by the profiler on CUDA), bandwidth over the
bytes that must move as a fraction of the measured device-to-device copy bandwidth, the speed-up
over the reference and the relative error of the output and every gradient against the fp32
reference on the same inputs. ``bf16`` runs both under bf16 autocast with fp32 weights, as a
training step does; ``fp32`` without autocast.

Bytes that must move (``x`` ``(N, H, W, C)``): forward reads ``x`` and writes ``y``;
forward+backward adds reading ``x`` and ``dy`` and writing ``dx`` (the weights are negligible).
The kernels move that plus the backward's partial sums, ``C * (K*K + 1)`` fp32 values per tile of
64 pixels, written and read back by two sums (the ``model`` column, a multiple of the minimum).

    python kernels/bench/depthwise_conv.py                      # CUDA, PPMA-T's convs at batch 64
    TRITON_INTERPRET=1 python kernels/bench/depthwise_conv.py --quick --device cpu --threads 1
"""
from __future__ import annotations

import contextlib
import functools

import torch

from ppma.kernels.common import op_bench
from ppma.kernels.common.accuracy import fp32_copies, outcome, relative_error
from ppma.kernels.common.runtime import triton_unavailable_reason
from ppma.kernels.common.timing import cuda_launches, median_seconds
from ppma.kernels.depthwise_conv import conv
from ppma.ops import depthwise_conv
from ppma.ops.depthwise_conv_impl import depthwise_conv_reference

# (N, H, W, C, K, add_input): PPMA-T at 224 x 224, batch 64: stage 1's positional conv, FFN conv and
# LePE, stage 3's the same.
FULL_SHAPES = [(64, 56, 56, 64, 3, True), (64, 56, 56, 192, 3, True), (64, 56, 56, 64, 5, False),
               (64, 14, 14, 256, 3, True), (64, 14, 14, 768, 3, True), (64, 14, 14, 256, 5, False)]
QUICK_SHAPES = [(2, 7, 9, 24, 3, True), (1, 5, 6, 16, 5, False)]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
IMPLS = {"triton": functools.partial(depthwise_conv, backend="triton"), "torch": depthwise_conv_reference}


def make_inputs(shape, dtype, device, requires_grad):
    """``[x, weight, bias, add_input]`` (the weights fp32, as a model's under autocast) and an
    output gradient, seeded."""
    n, h, w, c, k, add_input = shape
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(n, h, w, c, generator=gen).to(device, dtype),
              (torch.randn(c, 1, k, k, generator=gen) / k).to(device), torch.randn(c, generator=gen).to(device)]
    for t in inputs:
        t.requires_grad_(requires_grad)
    return [*inputs, add_input], torch.randn(n, h, w, c, generator=gen).to(device)


def must_move(x, backward):
    x_bytes = x.numel() * x.element_size()
    return 5 * x_bytes if backward else 2 * x_bytes


def kernel_bytes(x, k, backward):
    """Bytes the kernels move (module doc): the minimum plus the backward's partial sums."""
    minimum = must_move(x, backward)
    if not backward:
        return minimum
    tiles, _ = conv.grid(*x.shape)
    return minimum + 2 * tiles * x.shape[-1] * (k * k + 1) * 4


def precision(dtype, device):
    """bf16: the step under bf16 autocast (the weights stay fp32); fp32: as it is."""
    if dtype == torch.bfloat16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run_case(impl, shape, dtype, device, backward, warmup, repeat, want):
    """One table row as a dict (``time_ms`` None with a ``note`` when skipped)."""
    if impl == "triton" and triton_unavailable_reason(device) is not None:
        return {"note": "skipped: Triton unavailable (CPU needs TRITON_INTERPRET=1)"}
    inputs, grad = make_inputs(shape, dtype, device, backward)

    def forward():
        with precision(dtype, device):
            return IMPLS[impl](*inputs)

    if backward:
        def step():
            torch.autograd.grad(forward(), inputs[:3], grad)
    else:
        def step():
            with torch.no_grad():
                forward()
    seconds = median_seconds(step, device, warmup, repeat)
    minimum = must_move(inputs[0], backward)
    row = {"time_ms": seconds * 1e3, "gbps": minimum / seconds / 1e9, "launches": cuda_launches(step, device),
           "error": relative_error(outcome(lambda *a: forward(), inputs, grad, backward), want)}
    if impl == "triton":
        row["model"] = kernel_bytes(inputs[0], shape[4], backward) / minimum
    return row


def reference(shape, dtype, device, backward):
    """The fp32 reference's output (and gradients) on the inputs of ``shape`` in ``dtype``."""
    inputs, grad = make_inputs(shape, dtype, device, backward)
    return outcome(depthwise_conv_reference, [*fp32_copies(inputs[:3]), inputs[3]], grad, backward)


def main(argv=None):
    op_bench.run(__doc__, "depthwise_conv", "(N, H, W, C, K, add_input)", (FULL_SHAPES, QUICK_SHAPES), DTYPES,
                 list(IMPLS), reference, run_case, argv)


if __name__ == "__main__":
    main()
