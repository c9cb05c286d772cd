"""Benchmark of the linear kind: PPMA-linear-T backbone, chunked op vs reference, vs PPMA-T.

A script (not installed with ``ppma.kernels``). Rows, per input size (batch 1, square images):

- ``ppma_linear_tiny``: the backbone (``features_only=True``) through
  :func:`ppma.ops.polyline_linear_attention` (the chunked path; backend per ``PPMA_BACKEND``);
- ``ppma_linear_tiny (tiled)``: the same weights with the op replaced by
  :func:`~ppma.ops.polyline_linear_attention_impl.tiled.polyline_linear_attention_tiled` (row strips,
  matmuls inside a strip, per-column states between strips; not yet a registered backend);
- ``ppma_linear_tiny (reference)``: the same weights with the op replaced by its reference
  (every token's ``d*d + d``-channel state at once, the path before the chunked op);
- ``ppma_tiny``: the released kinds (criss-cross, then vanilla masked attention), for scale.

Columns: median inference time, peak memory of an inference forward and (``--train``) of a
forward + backward, beyond the model and the input. CUDA: the caching allocator's peak; CPU:
the running sum of the allocations the profiler records (:func:`ppma.kernels.common.timing.peak_memory`).

First, a bytes model of the op's forward at PPMA-linear-T's four stages (224 x 224, batch
``--batch``, bf16 inputs): the bytes that must move (read ``q``, ``k``, ``v`` and the two decays,
write the output) against what the chunked path moves. It forms the ``d * (dv + 1)`` state
channels of every token in fp32 (written once), scans them with the fused 2-D polyline-scan
kernel (read twice, written once) and contracts them with ``q`` (read once): 20 bytes a state
channel and token, before the scan's carried states and decays.

    python kernels/bench/polyline_linear_attention.py                 # CUDA if present
    python kernels/bench/polyline_linear_attention.py --device cpu --threads 1 --sizes 224 512
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import platform

import timm
import torch

import ppma  # noqa: F401  (registers the models)
import ppma.layers.polyline_attention as layer
from ppma.kernels.common.timing import median_seconds, peak_memory
from ppma.ops.polyline_linear_attention_impl import polyline_linear_attention_reference
from ppma.ops.polyline_linear_attention_impl.tiled import polyline_linear_attention_tiled

SIZES = (224, 512, 768, 1024, 1280)
# PPMA-linear-T at 224 x 224: (heads, H, W, head dim) of its four stages.
STAGES = [(4, 56, 56, 16), (4, 28, 28, 32), (8, 14, 14, 32), (16, 7, 7, 32)]
STATE_BYTES = 4 + 3 * 4 + 4  # per fp32 state element: formed, scanned (read twice, written), contracted
MODELS = {
    "ppma_linear_tiny": ("ppma_linear_tiny", None),
    "ppma_linear_tiny (tiled)": ("ppma_linear_tiny", polyline_linear_attention_tiled),
    "ppma_linear_tiny (reference)": ("ppma_linear_tiny", polyline_linear_attention_reference),
    "ppma_tiny": ("ppma_tiny", None),
}


@contextlib.contextmanager
def swapped_op(replacement):
    """While it runs, the layers' linear kind runs ``replacement`` (same contract as the op), if given."""
    saved = layer.polyline_linear_attention
    if replacement is not None:
        layer.polyline_linear_attention = lambda *args, eps: replacement(*args, eps=eps)
    try:
        yield
    finally:
        layer.polyline_linear_attention = saved


def traffic_model(batch: int, itemsize: int = 2) -> list[str]:
    """Markdown rows: per stage, the bytes that must move against the chunked path's (module docstring)."""
    rows = ["| stage (B, heads, H, W, d) | must move (MB) | chunked path (MB) | ratio |", "|---|---:|---:|---:|"]
    for heads, hh, ww, d in STAGES:
        tokens = batch * heads * hh * ww
        minimum = tokens * (4 * d * itemsize + 2 * 4)  # q, k, v, out; two fp32 decays
        chunked = tokens * (3 * d * itemsize + 2 * 4) + tokens * d * (d + 1) * STATE_BYTES + tokens * d * itemsize
        rows.append(f"| {(batch, heads, hh, ww, d)} | {minimum / 1e6:.1f} | {chunked / 1e6:.1f} | {chunked / minimum:.0f}x |")
    return rows


def measure(model, size, device, replacement, train, repeat):
    """``{'ms', 'infer_mib', 'train_mib'}`` of one row (a ``note`` instead when it runs out of memory)."""
    x = torch.randn(1, 3, size, size, device=device)

    def infer():
        model.eval()
        with torch.no_grad():
            model(x)

    def step():
        model.train()
        sum(f.float().square().mean() for f in model(x)).backward()

    row = {}
    with swapped_op(replacement):
        try:
            row["infer_mib"] = peak_memory(infer, device) / 2**20
            row["ms"] = median_seconds(infer, device, 1, repeat) * 1e3
            if train:
                row["train_mib"] = peak_memory(step, device) / 2**20
                model.zero_grad(set_to_none=True)
        except torch.OutOfMemoryError:
            row["note"] = "out of memory"
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--train", action="store_true", help="also the peak memory of forward + backward")
    parser.add_argument("--repeat", type=int, default=None, help="timed runs per row (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--batch", type=int, default=64, help="batch of the bytes model")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    repeat = args.repeat or (10 if device.type == "cuda" else 1)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU {platform.processor() or platform.machine()}, torch threads: {torch.get_num_threads()}"
    print(f"# linear kind benchmark, {datetime.date.today()}, {name}, torch {torch.__version__}")
    print("# bytes model of the op's forward, PPMA-linear-T at 224, bf16 inputs\n")
    print("\n".join(traffic_model(args.batch)) + "\n")
    print(f"# backbones (features_only), batch 1, fp32; median of {repeat} run(s) after 1 warm-up\n")
    print("| size | model | time (ms) | inference peak MiB | training peak MiB |")
    print("|---:|---|---:|---:|---:|")
    for size in args.sizes:
        for label in args.models:
            preset, replacement = MODELS[label]
            model = timm.create_model(preset, features_only=True).to(device)
            row = measure(model, size, device, replacement, args.train, repeat)
            if "note" in row:
                print(f"| {size} | {label} | {row['note']} | | |", flush=True)
                continue
            train = f"{row['train_mib']:.0f}" if "train_mib" in row else "-"
            print(f"| {size} | {label} | {row['ms']:.0f} | {row['infer_mib']:.0f} | {train} |", flush=True)
            del model


if __name__ == "__main__":
    main()
