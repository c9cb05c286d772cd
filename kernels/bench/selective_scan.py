"""Benchmark of ``selective_scan``: Triton kernel vs chunked PyTorch path vs sequential reference.

For the shapes VMamba-T and Vim-T meet, forward and forward+backward: median time, achieved
bandwidth over the bytes that must move, as a fraction of the measured copy bandwidth, peak
memory beyond the inputs, the speed-up over the sequential reference, and the relative error of
the output and every gradient against the fp32 sequential reference on the same inputs.

The bytes model (:func:`ppma.kernels.selective_scan.scan.modelled_bytes`): the minimum any
implementation must move (forward: read ``u``, ``delta``, ``B``, ``C``, ``z``, write ``y``;
forward+backward: those again with ``dy``, and a gradient written per input), and what the Triton
kernels move (the minimum plus their tile-start states, per-tile sums, adjoint carries and the
fp32 per-slice ``dB``/``dC``). ``--model`` prints the model alone (no device needed).

    python kernels/bench/selective_scan.py                   # CUDA: the full shapes
    python kernels/bench/selective_scan.py --small --device cpu --threads 1
    python kernels/bench/selective_scan.py --model                   # the bytes model, bf16 and fp32

``--small`` runs the same channel layouts at batch 2 (and the stage-1 map at 28x28), a couple of
minutes on a CPU. On the CPU the Triton rows are skipped: its interpreter's times say nothing
about GPU speed.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import platform

import torch

from ppma.kernels.common.accuracy import fp32_copies, outcome, relative_error
from ppma.kernels.common.runtime import triton_unavailable_reason
from ppma.kernels.common.timing import copy_bandwidth, median_seconds, peak_memory
from ppma.kernels.selective_scan.scan import modelled_bytes
from ppma.ops import selective_scan
from ppma.ops.selective_scan_impl import selective_scan_reference
from ppma.ops.selective_scan_impl.reference import random_inputs

# name: (batch, routes G, channels per route, N, L, options). VMamba-T: four routes of one map as
# four groups, D and delta_bias with softplus; Vim-T: one direction, D, z and delta_bias.
VMAMBA = dict(D=True, delta_bias=True, delta_softplus=True)
VIM = dict(D=True, z=True, delta_bias=True, delta_softplus=True)
FULL_SHAPES = {
    "VMamba-T stage 1 (56x56)": (64, 4, 192, 1, 56 * 56, VMAMBA),
    "VMamba-T stage 3 (14x14)": (64, 4, 768, 1, 14 * 14, VMAMBA),
    "Vim-T (197 tokens)": (64, 1, 384, 16, 197, VIM),
}
SMALL_SHAPES = {
    "VMamba-T stage 1 (28x28), batch 2": (2, 4, 192, 1, 28 * 28, VMAMBA),
    "VMamba-T stage 3 (14x14), batch 2": (2, 4, 768, 1, 14 * 14, VMAMBA),
    "Vim-T (197 tokens), batch 2": (2, 1, 384, 16, 197, VIM),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")


def _reference(*args, delta_softplus):
    return selective_scan_reference(*args, delta_softplus=delta_softplus)[0]


IMPLS = {
    "triton": lambda *args, delta_softplus: selective_scan(*args, delta_softplus=delta_softplus, backend="triton"),
    "torch": lambda *args, delta_softplus: selective_scan(*args, delta_softplus=delta_softplus, backend="torch"),
    "reference": _reference,
}


def bytes_model(shape, dtype, backward) -> dict[str, int]:
    """``{'minimum': bytes, 'triton': bytes}`` for a table shape (:func:`modelled_bytes`)."""
    batch, groups, per_route, n_state, length, options = shape
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return modelled_bytes(batch, groups * per_route, n_state, length, groups, itemsize, options.get("z", False),
                          backward)


def make_inputs(shape, dtype, device, backward):
    """The arguments (:data:`NAMES`' order, None where a shape's options leave one out), seeded,
    requiring grad with ``backward``, and an output gradient."""
    batch, groups, per_route, n_state, length, options = shape
    torch.manual_seed(0)
    inputs = random_inputs(batch, groups * per_route, n_state, length, groups, dtype, device, **options)
    args = [inputs[k] if inputs[k] is None else inputs[k].requires_grad_(backward) for k in NAMES]
    return args, torch.randn(batch, groups * per_route, length, device=device).to(dtype)


def reference_outcome(shape, dtype, device, backward):
    """The fp32 reference's output (and every gradient) on the inputs of a row."""
    args, grad = make_inputs(shape, dtype, device, backward)
    fn = functools.partial(_reference, delta_softplus=shape[-1]["delta_softplus"])
    return outcome(fn, fp32_copies(args), grad.float(), backward)


def run_case(impl, shape, dtype, device, backward, warmup, repeat, want):
    """One table row as a dict (``time_ms`` None with a ``note`` when skipped); ``error``: its
    output's and gradients' relative error against ``want`` (:func:`reference_outcome`)."""
    if impl == "triton" and (device.type != "cuda" or triton_unavailable_reason(device) is not None):
        return {"note": "skipped: needs a CUDA GPU"}
    args, grad = make_inputs(shape, dtype, device, backward)
    leaves = [a for a in args if a is not None]
    fn, softplus = IMPLS[impl], shape[-1]["delta_softplus"]
    if backward:
        def step():
            torch.autograd.grad(fn(*args, delta_softplus=softplus), leaves, grad)
    else:
        def step():
            with torch.no_grad():
                fn(*args, delta_softplus=softplus)
    try:
        seconds = median_seconds(step, device, warmup, repeat)
        peak = peak_memory(step, device)
    except torch.OutOfMemoryError:
        return {"note": "out of memory"}
    moved = bytes_model(shape, dtype, backward)["minimum"]
    error = relative_error(outcome(functools.partial(fn, delta_softplus=softplus), args, grad, backward), want)
    return {"time_ms": seconds * 1e3, "gbps": moved / seconds / 1e9, "peak": peak, "error": error}


def print_model(shapes, dtypes):
    """The bytes model's table: MB the Triton kernels move against the minimum."""
    print("| shape | (batch, dim, N, L, G) | dtype | pass | minimum MB | triton MB | triton / minimum |")
    print("|---|---|---|---|---:|---:|---:|")
    for label, shape in shapes.items():
        batch, groups, per_route, n_state, length, _ = shape
        for dname in dtypes:
            for backward in (False, True):
                model = bytes_model(shape, DTYPES[dname], backward)
                print(f"| {label} | {(batch, groups * per_route, n_state, length, groups)} | {dname} |"
                      f" {'fwd+bwd' if backward else 'fwd'} | {model['minimum'] / 1e6:.1f} |"
                      f" {model['triton'] / 1e6:.1f} | {model['triton'] / model['minimum']:.3f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="batch 2 and smaller maps (CPU, a couple of minutes)")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=None,
                        help="default: bf16 and fp32 on CUDA, fp32 on the CPU")
    parser.add_argument("--impls", nargs="+", choices=sorted(IMPLS), default=list(IMPLS))
    parser.add_argument("--repeat", type=int, default=None, help="timed runs per case (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--model", action="store_true", help="print the bytes model only (no timing)")
    args = parser.parse_args(argv)
    if args.model:
        print_model(SMALL_SHAPES if args.small else FULL_SHAPES, args.dtypes or ["bf16", "fp32"])
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shapes = SMALL_SHAPES if args.small else FULL_SHAPES
    dtypes = args.dtypes or (["bf16", "fp32"] if device.type == "cuda" else ["fp32"])
    repeat = args.repeat or (3 if args.small else 20)
    warmup = 1 if args.small else 3
    if device.type == "cuda":
        copy_bw = copy_bandwidth(device, 1 << 30, repeat)
        name = torch.cuda.get_device_name(device)
    else:
        copy_bw = copy_bandwidth(device, 1 << 27, repeat)
        name = f"CPU {platform.processor() or platform.machine()}, torch threads: {torch.get_num_threads()}"
    print(f"# selective_scan benchmark, {datetime.date.today()}, {name}, torch {torch.__version__}")
    print(f"# copy bandwidth {copy_bw / 1e9:.1f} GB/s; median of {repeat} runs\n")
    print("| shape | (batch, dim, N, L, G) | dtype | pass | impl | time (ms) | GB/s | % copy BW | peak MiB |"
          " vs reference | modelled bytes / minimum | error vs fp32 |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, shape in shapes.items():
        batch, groups, per_route, n_state, length, _ = shape
        dims = (batch, groups * per_route, n_state, length, groups)
        for dname in dtypes:
            for backward in (False, True):
                want = reference_outcome(shape, DTYPES[dname], device, backward)
                rows = {impl: run_case(impl, shape, DTYPES[dname], device, backward, warmup, repeat, want)
                        for impl in args.impls}
                ref_ms = rows.get("reference", {}).get("time_ms")
                model = bytes_model(shape, DTYPES[dname], backward)
                for impl, row in rows.items():
                    head = f"| {label} | {dims} | {dname} | {'fwd+bwd' if backward else 'fwd'} | {impl} |"
                    ratio = f"{model[impl] / model['minimum']:.3f}" if impl in model else "not modelled"
                    if "time_ms" not in row:
                        print(f"{head} {row['note']} | | | | | {ratio} | |", flush=True)
                        continue
                    speedup = f"{ref_ms / row['time_ms']:.3g}x" if ref_ms else "n/a"
                    print(f"{head} {row['time_ms']:.4g} | {row['gbps']:.3g} | {100 * row['gbps'] * 1e9 / copy_bw:.3g} |"
                          f" {row['peak'] / 2**20:.1f} | {speedup} | {ratio} | {row['error']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
