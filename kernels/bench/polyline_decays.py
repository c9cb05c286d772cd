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

import argparse
import datetime
import functools
import math
import platform

import torch

from ppma.kernels.common.accuracy import fp32_copies, outcome, relative_error
from ppma.kernels.common.runtime import triton_unavailable_reason
from ppma.kernels.common.timing import copy_bandwidth, median_seconds
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


def launches(step, device) -> str:
    """Kernels one call of ``step`` runs on CUDA (profiled), else ``''``."""
    if device.type != "cuda":
        return ""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    return str(sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA))


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
    row = {"time_ms": seconds * 1e3, "gbps": minimum / seconds / 1e9, "launches": launches(step, device),
           "error": relative_error(outcome(IMPLS[impl], inputs, grad, backward), want)}
    if impl == "triton":
        row["model"] = kernel_bytes(inputs[0], shape[-1], backward) / minimum
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="reduced shapes and repeats (CPU smoke test)")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["bf16", "fp32"])
    parser.add_argument("--repeat", type=int, default=None, help="timed runs per case (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    repeat = args.repeat or (3 if args.quick else 20)
    copy_bw = copy_bandwidth(device, 1 << (30 if device.type == "cuda" else 27), repeat)
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"CPU {platform.processor() or platform.machine()}, torch threads: {torch.get_num_threads()}")
    print(f"# polyline_decays benchmark, {datetime.date.today()}, {name}, torch {torch.__version__}")
    print(f"# copy bandwidth {copy_bw / 1e9:.1f} GB/s; median of {repeat} runs\n")
    print("| shape (B, [T,] H, W, C, heads) | dtype | pass | impl | time (ms) | launches | GB/s | % copy BW | vs torch |"
          " model | error vs fp32 |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in QUICK_SHAPES if args.quick else FULL_SHAPES:
        for dname in args.dtypes:
            for backward in (False, True):
                inputs, grad = make_inputs(shape, DTYPES[dname], device, backward)
                want = outcome(polyline_decays_reference, fp32_copies(inputs), grad, backward)
                rows = {impl: run_case(impl, shape, DTYPES[dname], device, backward, 1 if args.quick else 3, repeat,
                                       want) for impl in IMPLS}
                ref_ms = rows["torch"].get("time_ms")
                for impl, row in rows.items():
                    head = f"| {shape} | {dname} | {'fwd+bwd' if backward else 'fwd'} | {impl} |"
                    if "time_ms" not in row:
                        print(f"{head} {row['note']} | | | | | | |")
                        continue
                    model = f"{row['model']:.2f}x" if "model" in row else ""
                    print(f"{head} {row['time_ms']:.4g} | {row['launches']} | {row['gbps']:.3g} |"
                          f" {100 * row['gbps'] * 1e9 / copy_bw:.3g} | {ref_ms / row['time_ms']:.3g}x | {model} |"
                          f" {row['error']:.1e} |")


if __name__ == "__main__":
    main()
