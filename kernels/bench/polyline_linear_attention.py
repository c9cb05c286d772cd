"""Benchmark of the linear kind: PPMA-linear-T backbone, chunked op vs reference, vs PPMA-T.

A script (not installed with ``ppma.kernels``). Rows, per input size (batch 1, square images):

- ``ppma_linear_tiny``: the backbone (``features_only=True``) through
  :func:`ppma.ops.polyline_linear_attention` (backend per ``PPMA_BACKEND``; ``auto``: on CUDA the
  fused quadratic kernels on grids of at most 64 x 64 tokens and the Triton strip kernels of
  ``ppma.kernels.polyline_linear_attention`` on larger ones, on CPU the ``cpu`` kernel);
- ``ppma_linear_tiny (chunked, triton scan)`` (CUDA only): the op's former ``'triton'`` path, the
  chunked path with the Triton polyline scan over ``d x dv'`` states per token;
- ``ppma_linear_tiny (tiled)``: the same weights with the op replaced by
  :func:`~ppma.ops.polyline_linear_attention_impl.tiled.polyline_linear_attention_tiled` (row strips,
  matmuls inside a strip, per-column states between strips; not yet a registered backend);
- ``ppma_linear_tiny (reference)``: the same weights with the op replaced by its reference
  (every token's ``d*d + d``-channel state at once, the path before the chunked op);
- ``ppma_tiny``: the released kinds (criss-cross, then vanilla masked attention), for scale.

Columns: median inference time, peak memory of an inference forward and (``--train``) of a
forward + backward, beyond the model and the input. CUDA: the caching allocator's peak; CPU:
the running sum of the allocations the profiler records (:func:`ppma.kernels.common.timing.peak_memory`).

First, the cost model of the two forward kernels, the strip kernels (:func:`strip_model`) and the
fused quadratic one (:func:`fused_model`), at PPMA-linear-T's stages (224, batch ``--batch``, bf16
inputs, the first configuration's tiles with their padding): tensor-core FLOPs against the op's
FLOP formula (the O(N) scan form, the registry's count), the fused kernel's exponentials, and
bytes: unique (each tensor through DRAM once) and requested (every tile's loads, the L2's load)
against the bytes that must move. Then the op's forward and forward + backward per stage for each
path (the op as it routes, its forward forced onto the strip kernels, the chunked paths), with
its error against the fp32 reference on the same inputs (``--op``, CUDA). Then a bytes model of the op's forward at PPMA-linear-T's four stages (224 x 224, batch
``--batch``, bf16 inputs): the bytes that must move (read ``q``, ``k``, ``v`` and the two decays,
write the output) against what the chunked path moves. It forms the ``d * (dv + 1)`` state
channels of every token in fp32 (written once), scans them with the fused 2-D polyline-scan
kernel (read twice, written once) and contracts them with ``q`` (read once): 20 bytes a state
channel and token, before the scan's carried states and decays.

    python kernels/bench/polyline_linear_attention.py                 # CUDA if present
    python kernels/bench/polyline_linear_attention.py --op --sizes    # the models and the op per stage (CUDA)
    python kernels/bench/polyline_linear_attention.py --device cpu --threads 1 --sizes 224 512
    python kernels/bench/polyline_linear_attention.py --backward --sizes   # the backwards, side by side
    python kernels/bench/polyline_linear_attention.py --step --chunks --sizes   # a training step; one chunk's cost

``--backward``: per stage, the ``'cpu'`` and ``'triton'`` backends' backward as it first was
(autograd through the chunked path, whose forward runs again first) and those they now choose
between from the numerator their forward kept (the chunked backward; the quadratic form's in
PyTorch, the ``'cpu'`` backend's on the grids where
:func:`~ppma.ops.polyline_linear_attention_impl.cpu.quadratic_is_cheaper` says so; on CUDA the
fused quadratic passes, the ``'triton'`` backend's on grids of at most
``FUSED_BACKWARD_MAX_TOKENS`` tokens), side by side with their gradients compared.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import math
import platform
from unittest import mock

import timm
import torch

import ppma  # noqa: F401  (registers the models)
import ppma.layers.polyline_attention as layer
from ppma.kernels.common.accuracy import fp32_copies, outcome, relative_error
from ppma.kernels.common.timing import median_seconds, peak_memory
from ppma.kernels.polyline_attention import vanilla
from ppma.kernels.polyline_attention.vanilla import linear_attention_quadratic_bwd
from ppma.kernels.polyline_linear_attention import tiled as strip_kernels
from ppma.ops import polyline_linear_attention
from ppma.ops.polyline_linear_attention_impl import cpu as cpu_kernel
from ppma.ops.polyline_linear_attention_impl import op as linear_op
from ppma.ops.polyline_linear_attention_impl import (
    polyline_linear_attention_chunked,
    polyline_linear_attention_reference,
)
from ppma.ops.polyline_linear_attention_impl.chunked import chunked_backward, chunked_forward
from ppma.ops.polyline_linear_attention_impl.quadratic import GPU_CHUNK_ELEMENTS, quadratic_backward
from ppma.ops.polyline_linear_attention_impl.tiled import polyline_linear_attention_tiled

SIZES = (224, 512, 768, 1024, 1280)
# PPMA-linear-T at 224 x 224: (heads, H, W, head dim) of its four stages.
STAGES = [(4, 56, 56, 16), (4, 28, 28, 32), (8, 14, 14, 32), (16, 7, 7, 32)]
# The largest N x N mask of one (batch, head) the PyTorch quadratic backward is timed on: a GPU chunk.
QUADRATIC_MAX_MASK = GPU_CHUNK_ELEMENTS
STATE_BYTES = 4 + 3 * 4 + 4  # per fp32 state element: formed, scanned (read twice, written), contracted
CHUNKED_TRITON_SCAN = functools.partial(polyline_linear_attention_chunked, scan="triton")
MODELS = {
    "ppma_linear_tiny": ("ppma_linear_tiny", None),
    "ppma_linear_tiny (chunked, triton scan)": ("ppma_linear_tiny", CHUNKED_TRITON_SCAN),
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


def _path_model(h: int, w: int, d: int, dv: int, itemsize: int) -> dict[str, float]:
    """One path (H2V on an ``h x w`` grid) of one ``(B, head)``: tensor-core FLOPs, unique and
    requested bytes of the intra-strip kernel, the edge kernel and the strip states (PyTorch)."""
    rows = strip_kernels.strip_rows(max(16, 1 << (d - 1).bit_length()))
    cols = strip_kernels.columns(w, torch.bfloat16)
    block = strip_kernels.INTRA_CONFIGS[0].kwargs["BLOCK"]
    state_cols = max(1, strip_kernels.EDGE_CONFIGS[0].kwargs["STATE_ROWS"] // max(16, 1 << (d - 1).bit_length()))
    w_pad, strips, dv1 = math.ceil(w / cols) * cols, math.ceil(h / rows), dv + 1
    cost = {"flops": 0.0, "unique": 0.0, "requested": 0.0}
    for s in range(strips):
        r = min(rows, h - s * rows)
        queries = math.ceil(r / (block // cols)) * math.ceil(w / cols) * block  # padded query tiles
        keys = r * w_pad  # every query tile walks the strip's rows in padded segments
        cost["flops"] += 2 * queries * keys * (d + dv)
        cost["requested"] += queries * d * itemsize + queries // block * keys * (d + dv) * itemsize
        if strips > 1:  # the edge kernel: programs of state_cols columns, two edges
            cost["flops"] += 2 * 2 * w * r * w * d * dv1
            cost["requested"] += math.ceil(w / state_cols) * r * w * (d + dv) * itemsize
    tokens = h * w
    cost["unique"] += tokens * (2 * d + dv) * itemsize + tokens * dv1 * 4  # q, k, v in; num' out
    cost["requested"] += tokens * dv1 * 4
    if strips > 1:
        states = strips * w * d * dv1 * 4
        cost["flops"] += 2 * 2 * strips * strips * w * d * dv1 + 2 * 2 * strips * rows * w * d * dv1
        # E written, read; the carried states written, read; q (fp32) read; two partial num' and the sum
        traffic = 2 * states * 4 + tokens * d * 4 + 4 * tokens * dv1 * 4
        cost["unique"] += traffic
        cost["requested"] += traffic
    return cost


def strip_model(batch: int, heads: int, h: int, w: int, d: int, itemsize: int = 2) -> dict[str, float]:
    """The strip kernels' forward on ``(batch, heads, h, w, d)`` (``dv = d``): both paths (V2H on
    the transposed grid) and the division, ``{'flops', 'unique', 'requested'}``."""
    paths = [_path_model(h, w, d, d, itemsize), _path_model(w, h, d, d, itemsize)]
    tokens = h * w
    total = {key: sum(p[key] for p in paths) for key in paths[0]}
    total["unique"] += tokens * (2 * (d + 1) * 4 + d * itemsize)  # the two num' read, out written
    total["requested"] += tokens * (2 * (d + 1) * 4 + d * itemsize)
    return {key: value * batch * heads for key, value in total.items()}


def fused_model(batch: int, heads: int, h: int, w: int, d: int, itemsize: int = 2) -> dict[str, float]:
    """The fused quadratic forward kernel on ``(batch, heads, h, w, d)`` (``dv = d``), the first
    configuration's tiles with their padding: ``{'flops'`` (tensor cores), ``'exps'`` (two a query
    and key), ``'unique'``, ``'requested'}`` (every fixed tile walks every key row in segments of
    ``COLS`` columns, reading its keys, values and decays)."""
    block_d = max(16, 1 << (d - 1).bit_length())
    cols = vanilla.columns(w, backward=False, head=block_d)
    rows = vanilla.FWD_CONFIGS[0].kwargs["BLOCK"] // cols
    w_pad = math.ceil(w / cols) * cols
    tiles = math.ceil(h / rows) * math.ceil(w / cols)
    queries, keys, tokens = tiles * rows * cols, h * w_pad, h * w
    pairs = queries * keys
    decays = 2 * tokens * 4 * 3  # the log-decays read, their fp32 cumulative sums written and read
    unique = tokens * (3 * d * itemsize + (d + 1) * 4 + d * itemsize) + decays  # q, k, v in; num', out out
    requested = tokens * d * itemsize + tiles * keys * (2 * d * itemsize + 3 * 4) + tokens * ((d + 1) * 4 + d * itemsize)
    cost = {"flops": 2 * pairs * 2 * d, "exps": 2 * pairs, "unique": unique, "requested": requested}
    return {key: value * batch * heads for key, value in cost.items()}


def forward_model_rows(batch: int, itemsize: int = 2) -> list[str]:
    """Markdown rows per stage: :func:`strip_model` and :func:`fused_model` against the op's FLOP
    formula and the bytes that must move."""
    from ppma.ops.polyline_linear_attention_impl.op import _flops

    rows = ["| stage (B, heads, H, W, d) | op formula GFLOP | must move (MB) | strips: tensor GFLOP | strips: unique "
            "(MB) | strips: requested (MB) | fused: tensor GFLOP | fused: G exp | fused: unique (MB) "
            "| fused: requested (MB) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for heads, hh, ww, d in STAGES:
        shape = (batch, heads, hh, ww, d)
        formula = sum(_flops(shape, shape, shape, shape[:-1], shape[:-1], None, 1e-6).values())
        strips = strip_model(batch, heads, hh, ww, d, itemsize)
        fused = fused_model(batch, heads, hh, ww, d, itemsize)
        minimum = batch * heads * hh * ww * (4 * d * itemsize + 2 * 4)
        rows.append(f"| {shape} | {formula / 1e9:.1f} | {minimum / 1e6:.1f} | {strips['flops'] / 1e9:.1f} "
                    f"| {strips['unique'] / 1e6:.1f} | {strips['requested'] / 1e6:.1f} | {fused['flops'] / 1e9:.1f} "
                    f"| {fused['exps'] / 1e9:.2f} | {fused['unique'] / 1e6:.1f} | {fused['requested'] / 1e6:.1f} |")
    return rows


def strip_forward(*args, **kwargs):
    """The op on the ``'triton'`` backend with its forward on the strip kernels at every grid size
    (the backward as the op chooses)."""
    with mock.patch.object(linear_op, "FUSED_FORWARD_MAX_TOKENS", 0):
        return polyline_linear_attention(*args, backend="triton", **kwargs)


OP_PATHS = {
    "triton (the op: fused quadratic)": functools.partial(polyline_linear_attention, backend="triton"),
    "triton, strip kernels forward": strip_forward,
    "chunked, triton scan": CHUNKED_TRITON_SCAN,
    "torch (chunked, blocked scan)": functools.partial(polyline_linear_attention, backend="torch"),
}


def op_rows(batch: int, device: torch.device, dtype: torch.dtype, repeat: int) -> list[str]:
    """Markdown rows: per stage and path, the op's forward and forward + backward (ms), and the
    error of its output and every gradient against the fp32 reference on the same inputs (none
    where the reference's per-token states do not fit)."""
    rows = ["| stage (B, heads, H, W, d) | path | forward (ms) | forward + backward (ms) | error vs fp32 |",
            "|---|---|---:|---:|---:|"]
    for heads, hh, ww, d in STAGES:
        q, k = (torch.rand(batch, heads, hh, ww, d, device=device, dtype=dtype) for _ in range(2))
        v = torch.randn(batch, heads, hh, ww, d, device=device, dtype=dtype)
        decays = [-torch.rand(batch, heads, hh, ww, device=device) for _ in range(2)]
        inputs = [t.requires_grad_() for t in (q, k, v, *decays)]
        grad = torch.randn(v.shape, device=device)
        try:
            want = outcome(polyline_linear_attention_reference, fp32_copies(inputs), grad, True)
        except torch.OutOfMemoryError:
            want = None
        for label, path in OP_PATHS.items():
            def forward(path=path, inputs=inputs):
                with torch.no_grad():
                    path(*inputs)

            def step(path=path, inputs=inputs):
                path(*inputs).float().square().mean().backward()

            try:
                times = [median_seconds(fn, device, 1, repeat) * 1e3 for fn in (forward, step)]
                error = "n/a" if want is None else f"{relative_error(outcome(path, inputs, grad, True), want):.1e}"
                rows.append(f"| {(batch, heads, hh, ww, d)} | {label} | {times[0]:.2f} | {times[1]:.2f} | {error} |")
            except torch.OutOfMemoryError:
                rows.append(f"| {(batch, heads, hh, ww, d)} | {label} | out of memory | | |")
    return rows


def stages_at(size: int) -> list[tuple[int, int, int, int]]:
    """PPMA-linear-T's stages ``(heads, H, W, head dim)`` for a ``size x size`` input (strides 4
    to 32)."""
    return [(heads, size // stride, size // stride, d) for (heads, _, _, d), stride in zip(STAGES, (4, 8, 16, 32))]


def backward_rows(batch: int, device: torch.device, repeat: int, size: int = 224) -> list[str]:
    """Markdown rows: per stage of a ``size`` input (fp32, batch ``batch``), the op's backward in its
    forms, side by side, the gradients compared with the first: ``torch.func.vjp`` through the
    chunked path (its forward runs again, then its backward: the backward before the forward kept
    its numerator), and the backwards from the forward's numerator that the ``'cpu'`` and
    ``'triton'`` backends choose between
    (:func:`~ppma.ops.polyline_linear_attention_impl.op.numerator_backward`): the chunked path's,
    the quadratic form's in PyTorch and (CUDA) the fused quadratic passes. Scans: the Triton kernel
    on CUDA (the ``'triton'`` backend's), the blocked PyTorch scan on the CPU (the ``'cpu'``
    backend's). The PyTorch quadratic form runs where one row's ``N x N`` mask has at most
    :data:`QUADRATIC_MAX_MASK` elements (else ``-``: its tensors would not fit)."""
    cuda = device.type == "cuda"
    scan = "triton" if cuda else "blocked"
    rows = ["| stage (B, heads, H, W, d) | vjp through the chunked path (ms) | chunked from the numerator (ms) "
            "| quadratic, PyTorch (ms) | fused quadratic, Triton (ms) | the op takes | max gradient difference |",
            "|---|---:|---:|---:|---:|---|---:|"]
    for heads, hh, ww, d in stages_at(size):
        q, k = (torch.rand(batch, heads, hh, ww, d, device=device) for _ in range(2))
        v = torch.randn(batch, heads, hh, ww, d, device=device)
        decays = [-torch.rand(batch, heads, hh, ww, device=device) for _ in range(2)]
        inputs = (q, k, v, *decays)
        out, num = chunked_forward(*inputs, scan=scan)
        grad = torch.randn_like(out)

        def recompute(inputs=inputs, grad=grad):
            _, vjp = torch.func.vjp(functools.partial(polyline_linear_attention_chunked, scan=scan), *inputs)
            return vjp(grad)

        def chunked(inputs=inputs, grad=grad, num=num):
            return chunked_backward(grad, num, *inputs, scan=scan)

        def quadratic(inputs=inputs, grad=grad, num=num):
            return quadratic_backward(grad, num, *inputs)

        def fused(inputs=inputs, grad=grad, num=num):
            return linear_attention_quadratic_bwd(grad, num, *inputs)

        forms = [recompute, chunked, quadratic if (hh * ww) ** 2 <= QUADRATIC_MAX_MASK else None, fused if cuda else None]
        want = recompute()
        gaps = [relative_error(fn(), want) for fn in forms[1:] if fn is not None]
        times = ["-" if fn is None else f"{median_seconds(fn, device, 1, repeat) * 1e3:.1f}" for fn in forms]
        if cuda:
            taken = "fused" if hh * ww <= linear_op.FUSED_BACKWARD_MAX_TOKENS else "chunked"
        else:
            taken = "quadratic" if cpu_kernel.quadratic_is_cheaper((hh, ww), d, d + 1) else "chunked"
        rows.append(f"| {(batch, heads, hh, ww, d)} | {' | '.join(times)} | {taken} | {max(gaps):.1e} |")
    return rows


@contextlib.contextmanager
def chunked_backward_only():
    """The op's backward forced onto the chunked path on every grid (the backward before the
    quadratic and fused forms): no fused passes, the CPU's quadratic form replaced by the chunked
    backward with the blocked scan."""
    saved = linear_op.FUSED_BACKWARD_MAX_TOKENS, linear_op.quadratic_backward
    linear_op.FUSED_BACKWARD_MAX_TOKENS = 0
    linear_op.quadratic_backward = functools.partial(chunked_backward, scan="blocked")
    try:
        yield
    finally:
        linear_op.FUSED_BACKWARD_MAX_TOKENS, linear_op.quadratic_backward = saved


def step_rows(batch: int, size: int, device: torch.device, repeat: int) -> list[str]:
    """Markdown rows: one ``ppma_linear_tiny`` training step (fp32, no drop path, forward and
    backward of the mean output) with the op's backward as it chooses now and forced onto the
    chunked path (:func:`chunked_backward_only`), in ``repeat`` interleaved rounds after one
    (medians), and the gradients compared: the largest difference over the largest gradient."""
    model = timm.create_model("ppma_linear_tiny", drop_path_rate=0.0).to(device).train()
    x = torch.randn(batch, 3, size, size, device=device)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).mean().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    forms = {"the op's backward now": contextlib.nullcontext, "chunked backward everywhere": chunked_backward_only}
    times, grads = {label: [] for label in forms}, {}
    for round_ in range(repeat + 1):
        for label, context in forms.items():
            with context():
                seconds = median_seconds(lambda label=label: grads.__setitem__(label, step()), device, 0, 1)
            if round_:
                times[label].append(seconds * 1e3)
    now, before = grads.values()
    gap = max((a - b).abs().max() for a, b in zip(now, before)) / max(b.abs().max() for b in before)
    medians = {label: sorted(t)[len(t) // 2] for label, t in times.items()}
    rows = ["| backward | step (ms) | ratio | largest gradient difference |", "|---|---:|---:|---:|"]
    first = next(iter(medians.values()))
    for label, ms in medians.items():
        rows.append(f"| {label} | {ms:.0f} | {ms / first:.2f} | {gap.item():.1e} |")
    return rows


def chunk_rows(device: torch.device) -> list[str]:
    """Markdown rows: what one chunk of the backwards from the numerator costs at PPMA-linear-T's
    stage 2 (8 rows of 28 x 28 tokens, d = dv = 32, fp32): the aten ops dispatched (a custom op,
    such as the Triton scan, counts as one) and the peak memory beyond the inputs, in chunk-sized
    tensors (gradients included), for the chunked backward in 8 chunks and in 1 (the Triton scan on
    CUDA, the blocked one on the CPU), and for the quadratic form in 8 chunks."""
    from ppma.bench.step_count import OpCounter

    rows_, n, d = 8, 28 * 28, 32
    q, k = (torch.rand(1, rows_, 28, 28, d, device=device) for _ in range(2))
    v = torch.randn(1, rows_, 28, 28, d, device=device)
    decays = [-torch.rand(1, rows_, 28, 28, device=device) for _ in range(2)]
    inputs = (q, k, v, *decays)
    scan = "triton" if device.type == "cuda" else "blocked"
    out, num = chunked_forward(*inputs, scan=scan)
    grad = torch.randn_like(out)
    forms = {f"chunked ({scan} scan), 8 chunks": (chunked_backward, dict(scan=scan), n * d * (d + 1)),
             f"chunked ({scan} scan), 1 chunk": (chunked_backward, dict(scan=scan), rows_ * n * d * (d + 1)),
             "quadratic, 8 chunks": (quadratic_backward, {}, n * n)}
    table = ["| backward | chunks | ops | ops a chunk | peak MiB | peak in chunk-sized tensors |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, (backward, options, chunk) in forms.items():
        def run(backward=backward, options=options, chunk=chunk):
            return backward(grad, num, *inputs, budget=chunk, **options)
        with OpCounter() as counter:
            run()
        ops, chunks = sum(counter.by_op.values()), rows_ * n * (n if backward is quadratic_backward else d * (d + 1)) // chunk
        peak = peak_memory(run, device)
        table.append(f"| {label} | {chunks} | {ops} | {ops / chunks:.0f} | {peak / 2**20:.1f} | {peak / (4 * chunk):.1f} |")
    return table


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
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES), help="backbone input sizes (none: no backbones)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--train", action="store_true", help="also the peak memory of forward + backward")
    parser.add_argument("--repeat", type=int, default=None, help="timed runs per row (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--batch", type=int, default=64, help="batch of the models and of --op")
    parser.add_argument("--op", action="store_true", help="time the op per stage and path, bf16 (CUDA)")
    parser.add_argument("--backward", action="store_true",
                        help="time the op's backwards (chunked, from the numerator, quadratic) per stage (fp32)")
    parser.add_argument("--step", type=int, nargs="?", const=224, default=None, metavar="SIZE",
                        help="time a ppma_linear_tiny training step (SIZE x SIZE, default 224), the op's backward "
                             "now vs the chunked one")
    parser.add_argument("--chunks", action="store_true",
                        help="ops and peak memory of one chunk of the backwards from the numerator")
    parser.add_argument("--backward-input", type=int, default=224,
                        help="input size whose stages --backward times (224; larger places where fused and chunked cross)")
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
    print("# cost model of the forward kernels (strips, fused quadratic), PPMA-linear-T at 224, bf16 inputs\n")
    print("\n".join(forward_model_rows(args.batch)) + "\n")
    if args.op and device.type == "cuda":
        print(f"# the op per stage, bf16, batch {args.batch}; median of {repeat} run(s) after 1 warm-up\n")
        print("\n".join(op_rows(args.batch, device, torch.bfloat16, repeat)) + "\n")
    if args.backward:
        print(f"# the op's backward per stage of a {args.backward_input} input, fp32, batch {args.batch}; "
              f"median of {repeat} run(s)\n")
        print("\n".join(backward_rows(args.batch, device, repeat, args.backward_input)) + "\n")
    if args.step:
        print(f"# a ppma_linear_tiny training step, fp32, {args.batch}x3x{args.step}x{args.step}; median of "
              f"{repeat} interleaved round(s) after one\n")
        print("\n".join(step_rows(args.batch, args.step, device, repeat)) + "\n")
    if args.chunks:
        print("# one chunk of the backwards from the numerator, PPMA-linear-T's stage 2, fp32\n")
        print("\n".join(chunk_rows(device)) + "\n")
    print("# bytes model of the op's forward, PPMA-linear-T at 224, bf16 inputs\n")
    print("\n".join(traffic_model(args.batch)) + "\n")
    print(f"# backbones (features_only), batch 1, fp32; median of {repeat} run(s) after 1 warm-up\n")
    print("| size | model | time (ms) | inference peak MiB | training peak MiB |")
    print("|---:|---|---:|---:|---:|")
    models = [m for m in args.models if device.type == "cuda" or MODELS[m][1] is not CHUNKED_TRITON_SCAN]
    for size in args.sizes:
        for label in models:
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
