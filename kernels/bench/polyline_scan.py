"""Benchmark of ``polyline_scan``: Triton kernel vs PyTorch reference vs materialized mask.

A script (not installed with ``ppma.kernels``): it compares the kernel with the references of
``ppma.ops``, which kernels themselves never import.

For every shape and dtype, forward and forward+backward (``order='both'``): median time, achieved
bandwidth over the bytes that must move, as a fraction of the measured device-to-device copy
bandwidth, peak memory beyond the inputs, the speed-up over the PyTorch reference, and the
relative error of the output and every gradient against the fp32 reference on the same inputs.

Bytes that must move: forward reads ``x`` and the decays and writes ``y``; forward+backward adds
reading ``dy`` and ``x`` (and the decays again), writing ``dx`` and the decay gradients.

Bytes the kernels move (``model`` column, Triton rows of grids that run the fused kernels of
``ppma.kernels.polyline_scan.plane_scan``, with the tiling the autotuner chose), as a multiple of
that minimum: each kernel reads its inputs twice (two sweeps) and writes its outputs once, plus
the carried states (fp32, one row of ``BLOCK_T x BLOCK_W x BLOCK_C`` per tile of ``TILE_H`` rows,
written and read back; two forward, four for the decay gradients) and the decays (seven tile
loads a tile, eleven on 3-D grids, whose frame scans load two more in each sweep; once per
channel block; L2 may serve the repeats). The decay-gradient kernel also writes one fp32 partial
sum per channel block and decay, which ``torch.sum`` reads back. The backward is the forward
kernel on ``dy`` (``dx``) and the decay-gradient kernel.

    python kernels/bench/polyline_scan.py                      # CUDA, the shapes PPMA meets
    TRITON_INTERPRET=1 python kernels/bench/polyline_scan.py --quick --device cpu --threads 1

``--quick`` runs reduced shapes (the CPU smoke test; Triton then runs in its interpreter, so its
CPU times say nothing about GPU speed, nor its bf16 errors: the interpreter has no bf16
arithmetic).
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
from ppma.kernels.common.timing import copy_bandwidth, median_seconds, peak_memory
from ppma.kernels.polyline_scan import plane_scan
from ppma.ops import polyline_mask, polyline_scan, polyline_scan_reference

# (B, heads, H, W, C) and, 3-D, (B, heads, T, H, W, C); the last 3-D one runs 1-D passes (16 frames
# of 64-token rows do not fit a tile).
FULL_SHAPES = [(64, 4, 56, 56, 256), (64, 4, 28, 28, 1024), (64, 8, 14, 14, 1024), (2, 4, 256, 256, 64),
               (8, 4, 8, 14, 14, 256), (16, 8, 4, 14, 14, 256), (2, 4, 16, 56, 56, 64)]
QUICK_SHAPES = [(2, 4, 14, 14, 32), (2, 4, 28, 28, 64), (1, 2, 64, 64, 16), (1, 2, 4, 7, 7, 16)]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def materialized(x, log_alpha, log_beta, order="both", log_gamma=None):
    """``L x`` with the ``(B, heads, N, N)`` mask formed explicitly (fp32 product)."""
    b, h = x.shape[:2]
    mask = polyline_mask(log_alpha, log_beta, order, log_gamma)
    return (mask @ x.reshape(b, h, -1, x.shape[-1]).float()).reshape(x.shape).to(x.dtype)


# triton: the op on its Triton backend; torch: autograd through the plain reference.
IMPLS = {
    "triton": functools.partial(polyline_scan, backend="triton"),
    "torch": polyline_scan_reference,
    "mask": materialized,
}


def make_inputs(shape, dtype, device, requires_grad):
    """``[x, log_alpha, log_beta(, log_gamma)]`` and an output gradient, seeded."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(device, dtype)
    decays = [(-torch.rand(shape[:-1], generator=gen) * 2).to(device) for _ in shape[2:-1]]
    inputs = [x, *decays]
    for t in inputs:
        t.requires_grad_(requires_grad)
    return inputs, torch.randn(x.shape, generator=gen).to(device, dtype)


def must_move(x, n_decays, backward):
    x_bytes, d_bytes = x.numel() * x.element_size(), x[..., 0].numel() * 4 * n_decays
    return 5 * x_bytes + 3 * d_bytes if backward else 2 * x_bytes + d_bytes


def _fused_kernel_bytes(shape, itemsize, config, tensors_in, tensors_out, states):
    """Bytes one fused kernel moves (module docstring) for ``x`` of ``shape`` with ``config``."""
    b, heads, *grid, c = shape
    frames, hh, ww = ([1] + grid)[-3:]
    tile_h, block_c = config.kwargs["TILE_H"], config.kwargs["BLOCK_C"]
    planes, tiles, blocks = b * heads, -(-hh // tile_h), -(-c // block_c)
    tile_row = plane_scan.pow2(frames) * plane_scan.pow2(ww)  # BLOCK_T x BLOCK_W
    elements = planes * frames * hh * ww * c
    carried = states * planes * tiles * tile_row * blocks * block_c * 4 * 2
    decays = (7 if frames == 1 else 11) * 4 * planes * tiles * tile_h * tile_row * blocks
    return (2 * tensors_in + tensors_out) * elements * itemsize + carried + decays


def kernel_bytes(shape, itemsize, backward):
    """Bytes the fused kernels move for one forward (and backward), with the tilings chosen."""
    forward = _fused_kernel_bytes(shape, itemsize, plane_scan._plane_fwd_kernel.best_config, 1, 1, 2)
    if not backward:
        return forward
    grads_config = plane_scan._plane_bwd_kernel.best_config
    tokens, blocks = math.prod(shape[:-1]), -(-shape[-1] // grads_config.kwargs["BLOCK_C"])
    n_decays = len(shape) - 3
    partial_sums = n_decays * 4 * tokens * (2 * blocks + 3)  # written, read by torch.sum, summed, copied out
    decay_grads = _fused_kernel_bytes(shape, itemsize, grads_config, 2, 0, 4) + partial_sums
    return 2 * forward + decay_grads  # forward, then dx (the forward kernel on dy) and the decay gradients


def mask_bytes(shape):
    return shape[0] * shape[1] * math.prod(shape[2:-1]) ** 2 * 4


def reference_outcome(shape, dtype, device, backward):
    """The fp32 reference's output (and every gradient) on the inputs of a row."""
    inputs, grad = make_inputs(shape, dtype, device, backward)
    x, log_alpha, log_beta, *log_gamma = fp32_copies(inputs)
    return outcome(lambda *ts: polyline_scan_reference(*ts[:3], "both", *ts[3:]), [x, log_alpha, log_beta, *log_gamma],
                   grad.float(), backward)


def run_case(impl, shape, dtype, device, backward, warmup, repeat, mask_limit, want):
    """One table row as a dict (``time_ms`` None with a ``note`` when skipped); ``error``: its
    output's and gradients' relative error against ``want`` (:func:`reference_outcome`)."""
    if impl == "mask" and mask_bytes(shape) * (3 if backward else 1) > mask_limit:
        return {"note": f"skipped: mask needs {mask_bytes(shape) / 2**30:.1f} GiB"}
    if impl == "triton" and triton_unavailable_reason(device) is not None:
        return {"note": "skipped: Triton unavailable (CPU needs TRITON_INTERPRET=1)"}
    inputs, grad = make_inputs(shape, dtype, device, backward)
    x = inputs[0]

    def scan(x, log_alpha, log_beta, *log_gamma):
        return IMPLS[impl](x, log_alpha, log_beta, "both", *log_gamma)

    if backward:
        def step():
            torch.autograd.grad(scan(*inputs), inputs, grad)
    else:
        def step():
            with torch.no_grad():
                scan(*inputs)
    try:
        seconds = median_seconds(step, device, warmup, repeat)
        peak = peak_memory(step, device)
    except torch.OutOfMemoryError:
        return {"note": "out of memory"}
    minimum = must_move(x, len(inputs) - 1, backward)
    row = {"time_ms": seconds * 1e3, "gbps": minimum / seconds / 1e9, "peak": peak,
           "error": relative_error(outcome(scan, inputs, grad, backward), want)}
    if impl == "triton" and plane_scan.fits(shape[-2], shape[2] if len(shape) == 6 else 1):
        row["model"] = kernel_bytes(shape, x.element_size(), backward) / minimum
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="reduced shapes and repeats (CPU smoke test)")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["bf16", "fp32"])
    parser.add_argument("--impls", nargs="+", choices=sorted(IMPLS), default=list(IMPLS))
    parser.add_argument("--repeat", type=int, default=None, help="timed runs per case (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
    repeat = args.repeat or (3 if args.quick else 20)
    warmup = 1 if args.quick else 3
    if device.type == "cuda":
        copy_bw = copy_bandwidth(device, 1 << 30, repeat)
        mask_limit = torch.cuda.mem_get_info(device)[0] // 2
        name = torch.cuda.get_device_name(device)
    else:
        copy_bw = copy_bandwidth(device, 1 << 27, repeat)
        mask_limit = 4 << 30
        name = f"CPU {platform.processor() or platform.machine()}, torch threads: {torch.get_num_threads()}"
    print(f"# polyline_scan benchmark, {datetime.date.today()}, {name}, torch {torch.__version__}")
    print(f"# order='both'; copy bandwidth {copy_bw / 1e9:.1f} GB/s; median of {repeat} runs\n")
    print("| shape (B, heads, [T,] H, W, C) | dtype | pass | impl | time (ms) | GB/s | % copy BW | peak MiB | vs torch |"
          " model | error vs fp32 |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in shapes:
        for dname in args.dtypes:
            for backward in (False, True):
                want = reference_outcome(shape, DTYPES[dname], device, backward)
                rows = {impl: run_case(impl, shape, DTYPES[dname], device, backward, warmup, repeat, mask_limit, want)
                        for impl in args.impls}
                ref_ms = rows.get("torch", {}).get("time_ms")
                for impl, row in rows.items():
                    head = f"| {shape} | {dname} | {'fwd+bwd' if backward else 'fwd'} | {impl} |"
                    if "time_ms" not in row:
                        print(f"{head} {row['note']} | | | | | | |")
                        continue
                    peak = f"{row['peak'] / 2**20:.1f}"
                    speedup = f"{ref_ms / row['time_ms']:.3g}x" if ref_ms else "n/a"
                    model = f"{row['model']:.2f}x" if "model" in row else ""
                    print(f"{head} {row['time_ms']:.4g} | {row['gbps']:.3g} | {100 * row['gbps'] * 1e9 / copy_bw:.3g} |"
                          f" {peak} | {speedup} | {model} | {row['error']:.1e} |")


if __name__ == "__main__":
    main()
