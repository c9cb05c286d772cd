"""Benchmark of ``polyline_attention`` per layer: Triton kernel vs PyTorch reference vs FlexAttention
(vanilla kind), with unmasked flash attention (``F.scaled_dot_product_attention``) as the floor.

A script (not installed with ``ppma.kernels``). For every shape (8 heads of 32 channels by
default) and dtype, forward and forward+backward: median time, peak memory beyond the inputs,
attention TFLOP/s (``QK^T`` and ``PV``, two FLOPs per multiply-add as flash-attention papers
count, the backward as 2.5 forwards), the speed relative to the unmasked SDPA floor, and the error
against the fp32 reference on the same inputs (:func:`reference_outcome`). Then the
recompilation check: the kernels on 20 grid sizes and batch sizes, with the number of compiled
variants before and after (CUDA only; the interpreter compiles nothing).

    python kernels/bench/polyline_attention.py                  # CUDA, the shapes of the issue
    python kernels/bench/polyline_attention.py --form paper --kind criss_cross
    TRITON_INTERPRET=1 python kernels/bench/polyline_attention.py --quick --device cpu

``--quick`` runs reduced shapes (the CPU smoke test: Triton then runs in its interpreter, so its
CPU times say nothing about GPU speed, nor its bf16 errors: the interpreter has no bf16
arithmetic; FlexAttention has no CPU backward). Whole models:
``tools/benchmark.py --model``.

Before the timings, the cost model of the kernels per shape. Vanilla kind (:func:`vanilla_model`):
tensor-core FLOPs, exponentials and other elementwise operations per pass, with the padding of
the grid-aligned tiles, against the minimum (unmasked attention on the same ``q``, ``k``, ``v``:
FlashAttention-2's products and one exponential per weight), and the bytes each pass must move
through DRAM against the bytes its tiles stream through L2. Criss-cross kind
(:func:`criss_cross_model`): the products and exponentials of the padded line tiles against one
pass over the unpadded lines, and the DRAM bytes of the launches against the op's own inputs and
outputs.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import math
import platform
import random

import torch
import torch.nn.functional as F

from ppma.kernels.common.accuracy import fp32_copies, outcome, relative_error
from ppma.kernels.common.runtime import triton_unavailable_reason
from ppma.kernels.common.timing import median_seconds, peak_memory
from ppma.ops import polyline_attention, polyline_attention_reference
from ppma.ops.polyline_attention_impl.flex import polyline_attention_flex

# (B, heads, H, W, head dim): the layer shapes
FULL_SHAPES = [(64, 8, 14, 14, 32), (1, 8, 32, 32, 32), (1, 8, 64, 64, 32), (1, 8, 80, 80, 32), (1, 8, 128, 128, 32)]
# the criss-cross kind adds PPMA-T's criss-cross stages (4 heads of 16 and 32 channels) at 224 x 224,
# batch 64 (whole lines), and on a detector's 1333 x 800 inputs, batch 2 (tiled lines)
CRISS_CROSS_SHAPES = [(64, 4, 56, 56, 16), (64, 4, 28, 28, 32), (2, 4, 200, 333, 16), (2, 4, 100, 166, 32),
                      *FULL_SHAPES]
QUICK_SHAPES = [(1, 2, 7, 9, 16)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
IMPLS = ("torch", "triton", "flex", "sdpa")


def make_inputs(shape, dtype, device, requires_grad):
    b, heads, hh, ww, d = shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, heads, hh, ww, d, generator=gen).to(device, dtype) for _ in range(3))
    k = k * d**-0.5
    decays = [(-torch.rand(b, heads, hh, ww, generator=gen) * 0.5).to(device) for _ in range(2)]
    inputs = [q, k, v, *decays]
    for t in inputs:
        t.requires_grad_(requires_grad)
    return inputs, torch.randn(v.shape, generator=gen).to(device, dtype)


@functools.cache
def compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # one graph per shape and grad mode: 10 at the default shapes, past dynamo's default limit of
    # 8, beyond which flex_attention ran eager and unfused (H100, 2026-11-27: 63 ms at 64 x 64)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(flex_attention, dynamic=False)


def attend(impl, kind, form, device):
    """``fn(q, k, v, log_alpha, log_beta) -> out`` of one implementation (FlexAttention compiled
    on CUDA, eager on the CPU)."""
    if impl == "torch":
        return lambda *ts: polyline_attention_reference(*ts, kind=kind, form=form)
    if impl == "triton":
        return lambda *ts: polyline_attention(*ts, kind=kind, form=form, backend="triton")
    if impl == "flex":
        options = {"attend": compiled_flex()} if device.type == "cuda" else {}
        return lambda *ts: polyline_attention_flex(*ts, form=form, **options)

    def sdpa(q, k, v, *_):  # the unmasked floor, same logits (scale 1: k is pre-scaled)
        out = F.scaled_dot_product_attention(q.flatten(2, -2), k.flatten(2, -2), v.flatten(2, -2), scale=1.0)
        return out.unflatten(2, q.shape[2:-1])

    return sdpa


def vanilla_model(shape, form, element_size, block=64, loop_rows=1):
    """Cost model of the vanilla kernels for one ``(B, heads, H, W, d)`` shape (``d = dv``) with
    fixed tiles of ``block`` tokens and loop tiles of ``loop_rows`` image rows: per pass (``fwd``,
    ``bwd``) ``{'tensor': FLOPs of the products (two per multiply-add), 'exp': exponentials,
    'other': other elementwise operations, 'dram': bytes that must cross DRAM, 'l2': bytes the
    loop tiles stream, 'iterations': loop tiles a program takes, one after the other}``, counted
    on the padded tiles, and the minimum (``'min_tensor'``, ``'min_exp'``: FlashAttention-2's
    products and one exponential per weight, without padding)."""
    from ppma.kernels.polyline_attention.vanilla import columns

    b, heads, hh, ww, d = shape
    n, bh = hh * ww, b * heads
    official = form == "official"
    io = bh * n * (2 * d * element_size + 3 * 4)  # q and k (or v), three cumulative sums
    # other elementwise operations per weight, counted by hand from the kernels' source: forward,
    # the two masks' broadcasts (6) and per softmax add, select, max, subtract, sum, convert (7
    # each; paper: one softmax, the masks' exponentials' sum and product); backward, per pass the
    # masks (6), the probabilities (6), the softmax gradient (7), the decay terms (3), converts
    passes = {
        # products per weight: QK^T + PV (two PV official) | dk/dv pass: QK^T, dO V^T, P^T dO,
        # dS^T Q; dq pass: QK^T, dO V^T, dS K
        "fwd": dict(products=3 if official else 2, exp=2 if official else 3, other=20 if official else 13,
                    streams=1, dram=io + bh * n * (d * element_size + 4 * (d + 2)), min_products=2),
        "bwd": dict(products=7, exp=4 if official else 6, other=48, streams=2,
                    dram=2 * io + bh * n * (4 * d * element_size + 4 * 12), min_products=5),
    }
    model = {}
    for name, p in passes.items():
        cols = columns(ww, backward=name == "bwd", fp32=element_size == 4, head=d)
        rows, col_blocks = block // cols, -(-ww // cols)
        fixed = -(-hh // rows) * rows * col_blocks * cols  # padded tokens, fixed side
        loop_row_groups = -(-hh // loop_rows)
        loop = loop_row_groups * loop_rows * col_blocks * cols  # padded tokens, loop side
        pairs = bh * fixed * loop
        model[name] = {"tensor": 2 * pairs * d * p["products"], "exp": pairs * p["exp"], "other": pairs * p["other"],
                       "dram": p["dram"], "l2": p["streams"] * bh * (fixed // block) * loop * 2 * d * element_size,
                       "iterations": loop_row_groups * col_blocks,
                       "min_tensor": 2 * bh * n * n * d * p["min_products"], "min_exp": bh * n * n}
    return model


def criss_cross_model(shape, form, element_size, tile=64):
    """Cost model of the criss-cross kind's kernels for one ``(B, heads, H, W, d)`` shape
    (``d = dv``): per pass (``fwd``, ``bwd``) ``{'tensor': FLOPs of the products of the padded
    tiles, 'exp': their exponentials, 'dram': bytes the launches move, 'min_tensor', 'min_exp':
    the products and exponentials of one pass over the unpadded lines, 'min_dram': the op's own
    inputs and outputs}``. Lines of at most 64 tokens run the whole-line kernels (one padded
    ``BLOCK x BLOCK`` tile a line), longer ones the tiled kernels (``tile x tile`` tiles, every
    pair of a line's tiles; their backward computes the weights three times: twice in the query
    pass, once in the key pass, with 9 products where the whole-line backward has 5).

    Each of the four applications (two per axis) reads ``q``, ``k``, its input and the axis'
    log-decays and writes (the second order's last adds to) its output; the forward writes two
    intermediates, which the backward reads. The backward's application reads ``q``, ``k``, its
    input, the log-decays and ``dO``, writes ``dy`` and the axis' decay gradient and adds to the
    fp32 ``dq``, ``dk`` (read-modify-write after the first); on tiled lines its key pass reads
    the five again, and the query pass's three fp32 values a token (log-sum-exp, delta, decay
    term) go through DRAM. A line's tiles are read again from L2, not counted."""
    from ppma.kernels.common.strided import pow2
    from ppma.kernels.polyline_attention.whole_line import MAX_LINE

    b, heads, hh, ww, d = shape
    bh, n = b * heads, hh * ww
    rows, decays, fp32_rows = bh * n * d * element_size, bh * n * 4, bh * n * d * 4
    exps = 1 if form == "official" else 2
    model = {"fwd": dict(tensor=0, exp=0, min_tensor=0, min_exp=0, dram=5 * rows, min_dram=4 * rows + 2 * decays),
             "bwd": dict(tensor=0, exp=0, min_tensor=0, min_exp=0, dram=2 * 7 * fp32_rows + 2 * decays,
                         min_dram=7 * rows + 4 * decays)}
    for line in (hh, ww, ww, hh):  # the four applications
        lines, whole = bh * n // line, line <= MAX_LINE
        block = max(16, pow2(line)) if whole else tile
        weights = lines * block * block * (1 if whole else math.ceil(line / tile) ** 2)
        tiled_reads = 0 if whole else 4 * rows + 7 * decays
        for name, products, least_products, passes, dram in (
                ("fwd", 2, 2, 1, 3 * rows + decays),
                ("bwd", 5 if whole else 9, 5, 1 if whole else 3, 5 * rows + 2 * decays + tiled_reads)):
            row = model[name]
            row["tensor"] += 2 * weights * d * products
            row["exp"] += weights * exps * passes
            row["min_tensor"] += 2 * lines * line * line * d * least_products
            row["min_exp"] += lines * line * line * exps
            row["dram"] += dram
    return model


def print_model(shapes, kind, form, dtype):
    """The :func:`vanilla_model` or :func:`criss_cross_model` table (GFLOP, G exponentials, MB),
    one row per shape and pass."""
    size = torch.tensor([], dtype=dtype).element_size()
    if kind == "vanilla":
        print("| shape (B, heads, H, W, d) | pass | tensor GFLOP (min) | exp G (min) | other G ops | DRAM MB | L2 MB"
              " | loop tiles a program (2-, 4-row tiles) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for shape in shapes:
            several = [vanilla_model(shape, form, size, loop_rows=rows) for rows in (2, 4)]
            for name, row in vanilla_model(shape, form, size).items():
                print(f"| {shape} | {name} | {row['tensor'] / 1e9:.3g} ({row['min_tensor'] / 1e9:.3g}) |"
                      f" {row['exp'] / 1e9:.3g} ({row['min_exp'] / 1e9:.3g}) | {row['other'] / 1e9:.3g} |"
                      f" {row['dram'] / 1e6:.3g} | {row['l2'] / 1e6:.3g} | {row['iterations']}"
                      f" ({', '.join(str(m[name]['iterations']) for m in several)}) |")
    else:
        print("| shape (B, heads, H, W, d) | pass | tensor GFLOP (min) | exp G (min) | DRAM MB (op's in + out) |")
        print("|---|---|---:|---:|---:|")
        for shape in shapes:
            for name, row in criss_cross_model(shape, form, size).items():
                print(f"| {shape} | {name} | {row['tensor'] / 1e9:.3g} ({row['min_tensor'] / 1e9:.3g}) |"
                      f" {row['exp'] / 1e9:.3g} ({row['min_exp'] / 1e9:.3g}) |"
                      f" {row['dram'] / 1e6:.3g} ({row['min_dram'] / 1e6:.3g}) |")
    print()


def attention_flops(shape, backward):
    """``QK^T`` and ``PV`` at two FLOPs per multiply-add; forward+backward counts 3.5 forwards."""
    b, heads, hh, ww, d = shape
    forward = 4 * b * heads * (hh * ww) ** 2 * d
    return forward * (3.5 if backward else 1.0)


def skip_reason(impl, shape, device, backward, kind, mem_limit):
    n = shape[2] * shape[3]
    weights = n * n if kind == "vanilla" else n * (shape[2] + shape[3])  # per (batch, head), fp32
    if impl == "torch" and 3 * shape[0] * shape[1] * weights * 4 * (3 if backward else 1) > mem_limit:
        return "skipped: dense masks exceed the memory limit"
    if impl == "triton" and triton_unavailable_reason(device) is not None:
        return "skipped: Triton unavailable (CPU needs TRITON_INTERPRET=1)"
    if impl == "flex" and (kind != "vanilla" or (backward and device.type == "cpu")):
        return "n/a: vanilla kind only; no CPU backward"
    if impl == "sdpa" and kind != "vanilla":
        return "n/a: vanilla kind only"
    return None


def reference_outcome(shape, dtype, device, backward, kind, form, mem_limit):
    """The fp32 reference's output (and every gradient) on the inputs of a row (None where its
    dense masks do not fit)."""
    if skip_reason("torch", shape, device, backward, kind, mem_limit):
        return None
    inputs, grad = make_inputs(shape, dtype, device, backward)
    return outcome(attend("torch", kind, form, device), fp32_copies(inputs), grad.float(), backward)


def run_case(impl, shape, dtype, device, backward, kind, form, warmup, repeat, mem_limit, want):
    """One table row as a dict (``time_ms`` absent with a ``note`` when skipped); ``error``: its
    output's and gradients' relative error against ``want`` (:func:`reference_outcome`) when given
    (never for the unmasked SDPA floor)."""
    reason = skip_reason(impl, shape, device, backward, kind, mem_limit)
    if reason:
        return {"note": reason}
    inputs, grad = make_inputs(shape, dtype, device, backward)
    fn = attend(impl, kind, form, device)
    if backward:
        def step():
            torch.autograd.grad(fn(*inputs), inputs[:3] if impl == "sdpa" else inputs, grad)
    else:
        def step():
            with torch.no_grad():
                fn(*inputs)
    try:
        seconds = median_seconds(step, device, warmup, repeat)
        peak = peak_memory(step, device)
    except torch.OutOfMemoryError:
        return {"note": "out of memory"}
    row = {"time_ms": seconds * 1e3, "peak": peak, "tflops": attention_flops(shape, backward) / seconds / 1e12}
    if impl == "triton":
        row["configs"] = kept_configs(kind, step)
    if want is not None and impl != "sdpa":
        row["error"] = relative_error(outcome(fn, inputs, grad, backward), want)
    return row


def tuned_kernels(kind) -> dict:
    """The autotuned Triton kernels of ``kind``, by a short name."""
    from ppma.kernels.polyline_attention import line, vanilla, whole_line

    if kind == "vanilla":
        return {"fwd": vanilla._fwd_kernel, "dk/dv": vanilla._bwd_dkdv_kernel, "dq": vanilla._bwd_dq_kernel}
    return {"whole fwd": whole_line._whole_line_fwd_kernel, "whole bwd": whole_line._whole_line_bwd_kernel,
            "tiled fwd": line._line_fwd_kernel, "tiled query": line._line_bwd_query_kernel,
            "tiled key": line._line_bwd_key_kernel}


def kept_configs(kind, step) -> str:
    """Run ``step`` and name the configuration each Triton kernel of ``kind`` ran in it (the
    autotuner's choice for that launch's key; the kernels it did not launch are left out)."""
    from ppma.kernels.common.tuning import config_label

    kernels = tuned_kernels(kind)
    for kernel in kernels.values():
        kernel.best_config = None
    step()
    return "; ".join(f"{name} {config_label(k.best_config)}" for name, k in kernels.items() if k.best_config)


def count_variants(kernels, device) -> int:
    """Compiled variants of the Triton kernels on ``device`` (their JIT caches)."""
    return sum(len(k.device_caches[device.index or 0][0]) for k in kernels)


def recompilation_check(device, dtype, kind, form, sizes=20):
    """Run forward and backward on ``sizes`` random grids and batch sizes (a detection loader's
    variety); returns ``(variants after the first size, variants after all, tiles seen)``: the
    vanilla forward specializes on its tile width (16 or 32 columns), the criss-cross kind's
    whole-line kernels on their line block (16, 32 or 64 tokens), nothing else does."""
    from ppma.kernels.common.strided import pow2
    from ppma.kernels.polyline_attention import line, vanilla, whole_line

    kernels = [k.fn for k in (vanilla._fwd_kernel, vanilla._bwd_dkdv_kernel, vanilla._bwd_dq_kernel,
                              line._line_fwd_kernel, line._line_bwd_query_kernel, line._line_bwd_key_kernel,
                              whole_line._whole_line_fwd_kernel, whole_line._whole_line_bwd_kernel)]
    rng = random.Random(0)
    counts, buckets = [], set()
    for i in range(sizes):
        shape = (rng.randint(1, 4), 8, rng.randint(10, 64), rng.randint(10, 64), 32)
        if kind == "vanilla":
            buckets.add(vanilla.columns(shape[3], backward=False, fp32=dtype == torch.float32))
        else:
            buckets.update(max(16, pow2(n)) for n in shape[2:4])
        inputs, grad = make_inputs(shape, dtype, device, True)
        out = polyline_attention(*inputs, kind=kind, form=form, backend="triton")
        torch.autograd.grad(out, inputs, grad)
        if i == 0:
            counts.append(count_variants(kernels, device))
    counts.append(count_variants(kernels, device))
    return (*counts, len(buckets))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="reduced shapes and repeats (CPU smoke test)")
    parser.add_argument("--kind", choices=("vanilla", "criss_cross"), default="vanilla")
    parser.add_argument("--form", choices=("official", "paper"), default="official")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["bf16"])
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--repeat", type=int, default=None, help="timed runs per case (median)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    shapes = QUICK_SHAPES if args.quick else CRISS_CROSS_SHAPES if args.kind == "criss_cross" else FULL_SHAPES
    repeat = args.repeat or (2 if args.quick else 20)
    warmup = 1 if args.quick else 3
    if device.type == "cuda":
        mem_limit = torch.cuda.mem_get_info(device)[0] // 2
        name = torch.cuda.get_device_name(device)
    else:
        mem_limit = 4 << 30
        name = f"CPU {platform.processor() or platform.machine()}, torch threads: {torch.get_num_threads()}"
    print(f"# polyline_attention benchmark, {datetime.date.today()}, {name}, torch {torch.__version__}")
    print(f"# kind={args.kind!r} form={args.form!r}; median of {repeat} runs; TFLOP/s: QK^T and PV only\n")
    tiles = "64-token tiles" if args.kind == "vanilla" else "whole lines up to 64 tokens, 64-token tiles above"
    print(f"## cost model of the {args.kind} kernels ({args.form}, {args.dtypes[0]}, {tiles})\n")
    print_model(shapes, args.kind, args.form, DTYPES[args.dtypes[0]])
    print("| shape (B, heads, H, W, d) | dtype | pass | impl | time (ms) | peak MiB | TFLOP/s | vs torch | vs SDPA |"
          " error vs fp32 |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    kept = []  # (shape, dtype, pass, the triton row's configurations)
    for shape in shapes:
        for dname in args.dtypes:
            for backward in (False, True):
                want = reference_outcome(shape, DTYPES[dname], device, backward, args.kind, args.form, mem_limit)
                rows = {impl: run_case(impl, shape, DTYPES[dname], device, backward, args.kind, args.form, warmup,
                                       repeat, mem_limit, want) for impl in args.impls}
                ref_ms = rows.get("torch", {}).get("time_ms")
                floor_ms = rows.get("sdpa", {}).get("time_ms")
                for impl, row in rows.items():
                    head = f"| {shape} | {dname} | {'fwd+bwd' if backward else 'fwd'} | {impl} |"
                    if "time_ms" not in row:
                        print(f"{head} {row['note']} | | | | | |")
                        continue
                    vs_ref = f"{ref_ms / row['time_ms']:.3g}x" if ref_ms else "n/a"
                    vs_floor = f"{floor_ms / row['time_ms']:.3g}x" if floor_ms else "n/a"
                    error = f"{row['error']:.1e}" if "error" in row else "n/a"
                    print(f"{head} {row['time_ms']:.4g} | {row['peak'] / 2**20:.1f} | {row['tflops']:.3g} |"
                          f" {vs_ref} | {vs_floor} | {error} |")
                    if "configs" in row:
                        kept.append(f"| {shape} | {dname} | {'fwd+bwd' if backward else 'fwd'} | {row['configs']} |")
    if kept:
        print("\n## the configurations the triton rows ran (the autotuner's choice at each shape)\n")
        print("| shape (B, heads, H, W, d) | dtype | pass | kernel: tile, warps, stages |\n|---|---|---|---|")
        print("\n".join(kept))
    if device.type == "cuda":
        first, last, buckets = recompilation_check(device, DTYPES[args.dtypes[0]], args.kind, args.form)
        print(f"\n# recompilation: {first} compiled kernel variants after the first of 20 sizes, {last} after all,"
              f" over {buckets} tiles ({'as expected' if last <= first * buckets else 'RECOMPILED'})")
    else:
        print("\n# recompilation check: CUDA only (the interpreter compiles nothing)")


if __name__ == "__main__":
    main()
