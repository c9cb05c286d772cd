"""The command line and table of the benchmarks that time one op's Triton kernels against its
PyTorch reference (``kernels/bench/polyline_decays.py``, ``depthwise_conv.py``): for every shape,
dtype and pass, one row per implementation with its median time, launches, bandwidth over the
bytes that must move, the fraction of copy bandwidth that is, the speed-up over the reference,
the kernels' bytes model and the error against the fp32 reference computed in the same run."""
from __future__ import annotations

import argparse
import datetime
import platform
from typing import Callable, Sequence

import torch

from .timing import copy_bandwidth


def run(doc: str, title: str, shape_label: str, shapes: tuple[Sequence, Sequence], dtypes: dict[str, torch.dtype],
        impls: Sequence[str], reference: Callable, run_case: Callable, argv=None) -> None:
    """Parse ``argv`` (``--device``, ``--quick``, ``--dtypes``, ``--repeat``, ``--threads``) and print
    the table. ``shapes``: (full, quick); ``reference(shape, dtype, device, backward)``: the fp32
    reference's outcome; ``run_case(impl, shape, dtype, device, backward, warmup, repeat, want)``: a
    row's dict (``time_ms``, ``launches``, ``gbps``, ``error``, for the kernels ``model``; or a
    ``note`` alone). The last of ``impls`` is the reference the speed-ups divide."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="reduced shapes and repeats (CPU smoke test)")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(dtypes), default=list(dtypes))
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
    print(f"# {title} benchmark, {datetime.date.today()}, {name}, torch {torch.__version__}")
    print(f"# copy bandwidth {copy_bw / 1e9:.1f} GB/s; median of {repeat} runs\n")
    print(f"| shape {shape_label} | dtype | pass | impl | time (ms) | launches | GB/s | % copy BW | vs torch | model |"
          " error vs fp32 |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in shapes[1] if args.quick else shapes[0]:
        for dname in args.dtypes:
            for backward in (False, True):
                want = reference(shape, dtypes[dname], device, backward)
                rows = {impl: run_case(impl, shape, dtypes[dname], device, backward, 1 if args.quick else 3, repeat,
                                       want) for impl in impls}
                ref_ms = rows[impls[-1]].get("time_ms")
                for impl, row in rows.items():
                    head = f"| {shape} | {dname} | {'fwd+bwd' if backward else 'fwd'} | {impl} |"
                    if "time_ms" not in row:
                        print(f"{head} {row['note']} | | | | | | |")
                        continue
                    model = f"{row['model']:.2f}x" if "model" in row else ""
                    print(f"{head} {row['time_ms']:.4g} | {row['launches']} | {row['gbps']:.3g} |"
                          f" {100 * row['gbps'] * 1e9 / copy_bw:.3g} | {ref_ms / row['time_ms']:.3g}x | {model} |"
                          f" {row['error']:.1e} |")
