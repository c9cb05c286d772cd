"""Triton kernels of ``depthwise_conv``: a ``K x K`` depthwise convolution ('same' padding, stride
1) on a channels-last grid ``(N, H, W, C)``, its bias and optionally its input added, forward and
backward, in one launch each way.

Program ``(pixel tile, channel block)`` covers ``ROWS x BLOCK_W`` pixels of one image (a row band)
and ``BLOCK_C`` channels: every access is a ``(pixels, channels)`` tile along the contiguous
channel axis. Per tap ``t = (ky, kx)`` (offset ``(ky - K // 2, kx - K // 2)``)::

    forward:   y[p]    = round(sum_t w[t] x[p + off_t] + b) (+ x[p])
    backward:  dx[p]   = sum_t w[t] dy[p - off_t] (+ dy[p])
               dw[t]   = sum_p dy[p] x[p + off_t],   db = sum_p dy[p]

in fp32 (fp64 for fp64 tensors), out-of-grid pixels read as zero. ``round`` is the conv's own
output dtype ``ROUND`` (autocast's, where the reference's conv runs in it): the weights and the
input are rounded to it before the products as autocast's casts would, the conv's sum after, and
then the input (unrounded) is added. The backward's weight and bias gradients are per-tile partial
sums, ``(tiles, C, K*K)`` and ``(tiles, C)``, summed over the tiles by the launcher (no atomics).

Where PyTorch ran, under autocast, the weight's and the bias' casts, two permutes, the conv and
the residual add forward, and the conv's backward, two casts back and the residual's sum backward
(docs/benchmarks.md, "Ops and copies per training step"), one launch forward, one launch and two
sums backward.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.strided import accumulation_dtype, cdiv, pow2, tl_dtype

# A program's tile: PIXELS pixels (ROWS rows of BLOCK_W) x BLOCK_C channels.
PIXELS = 64
CONFIGS = [triton.Config({}, num_warps=4, num_stages=1), triton.Config({}, num_warps=8, num_stages=1)]


def _variant(args: dict) -> str:
    """The resource table's variant: the input's, output's (its gradient's) and weight's dtypes and
    the constexprs."""
    names = ("K", "HAS_BIAS", "ADD_INPUT", "ROUND", "ACC", "ROWS", "BLOCK_W", "BLOCK_C")
    out = args["Y"] if "Y" in args else args["DY"]
    return " ".join([args["X"][1:], out[1:], args["WT"][1:]] + [f"{n}={args[n]}" for n in names])


@triton.jit
def _tile(N, H, W, C, ROWS: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
    """The program's image ``n``, pixel rows ``h`` and columns ``w`` (``(PIXELS,)``), channels ``c``
    and their masks, and its tile index."""
    tile = tl.program_id(0)
    bands, blocks = tl.cdiv(H, ROWS), tl.cdiv(W, BLOCK_W)
    n = tile // (bands * blocks)
    band = tile % (bands * blocks)
    p = tl.arange(0, ROWS * BLOCK_W)
    h = (band // blocks) * ROWS + p // BLOCK_W
    w = (band % blocks) * BLOCK_W + p % BLOCK_W
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    return tile, n.to(tl.int64), h, w, c, (h < H) & (w < W), c < C


@triton.jit
def _at(ptr, n, h, w, c, H, W, c_ok, sn, sh, sw):
    """``ptr[n, h, w, c]`` as an fp32-or-wider ``(PIXELS, BLOCK_C)`` tile (zero outside the grid)."""
    ok = ((h >= 0) & (h < H) & (w >= 0) & (w < W))[:, None] & c_ok[None, :]
    offsets = n * sn + h.to(tl.int64)[:, None] * sh + w.to(tl.int64)[:, None] * sw + c[None, :]
    return tl.load(ptr + offsets, mask=ok, other=0.0)


@tuning.autotune(CONFIGS, key=["C"], variant=_variant, spill_free=True)
@triton.jit(do_not_specialize=["N", "H", "W"])
def _fwd_kernel(X, WT, B, Y, N, H, W, C, sxn, sxh, sxw,
                K: tl.constexpr, HAS_BIAS: tl.constexpr, ADD_INPUT: tl.constexpr, ROUND: tl.constexpr,
                ACC: tl.constexpr, ROWS: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
    """``Y`` ``(N, H, W, C)`` contiguous from ``X`` (strides ``sx*``, unit channel stride), ``WT``
    ``(C, K*K)`` and ``B`` ``(C,)`` (module doc)."""
    _, n, h, w, c, p_ok, c_ok = _tile(N, H, W, C, ROWS, BLOCK_W, BLOCK_C)
    acc = tl.zeros((ROWS * BLOCK_W, BLOCK_C), ACC)
    for t in range(K * K):
        wt = tl.load(WT + c * (K * K) + t, mask=c_ok, other=0.0).to(ROUND).to(ACC)
        x = _at(X, n, h + (t // K - K // 2), w + (t % K - K // 2), c, H, W, c_ok, sxn, sxh, sxw)
        acc += x.to(ROUND).to(ACC) * wt[None, :]
    if HAS_BIAS:
        acc += tl.load(B + c, mask=c_ok, other=0.0).to(ROUND).to(ACC)[None, :]
    y = acc.to(ROUND).to(ACC)
    if ADD_INPUT:
        y += _at(X, n, h, w, c, H, W, c_ok, sxn, sxh, sxw).to(ACC)
    offsets = ((n * H + h) * W + w).to(tl.int64)[:, None] * C + c[None, :]
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=p_ok[:, None] & c_ok[None, :])


@tuning.autotune(CONFIGS, key=["C"], variant=_variant, spill_free=True)
@triton.jit(do_not_specialize=["N", "H", "W"])
def _bwd_kernel(X, WT, DY, DX, PW, PB, N, H, W, C, sxn, sxh, sxw,
                K: tl.constexpr, HAS_BIAS: tl.constexpr, ADD_INPUT: tl.constexpr, ROUND: tl.constexpr,
                ACC: tl.constexpr, ROWS: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
    """``DX`` ``(N, H, W, C)`` contiguous and the partial sums ``PW`` ``(tiles, C, K*K)``, ``PB``
    ``(tiles, C)`` from ``DY`` (contiguous), ``X`` and ``WT`` (module doc)."""
    tile, n, h, w, c, p_ok, c_ok = _tile(N, H, W, C, ROWS, BLOCK_W, BLOCK_C)
    dy = _at(DY, n, h, w, c, H, W, c_ok, H * W * C, W * C, C).to(ACC)
    dx = tl.zeros((ROWS * BLOCK_W, BLOCK_C), ACC)
    if ADD_INPUT:
        dx += dy
    partial = PW + tile.to(tl.int64) * C * (K * K) + c * (K * K)
    for t in range(K * K):
        oh, ow = t // K - K // 2, t % K - K // 2
        wt = tl.load(WT + c * (K * K) + t, mask=c_ok, other=0.0).to(ROUND).to(ACC)
        dx += _at(DY, n, h - oh, w - ow, c, H, W, c_ok, H * W * C, W * C, C).to(ACC) * wt[None, :]
        x = _at(X, n, h + oh, w + ow, c, H, W, c_ok, sxn, sxh, sxw).to(ROUND).to(ACC)
        tl.store(partial + t, tl.sum(dy * x, axis=0), mask=c_ok)
    if HAS_BIAS:
        tl.store(PB + tile.to(tl.int64) * C + c, tl.sum(dy, axis=0), mask=c_ok)
    offsets = ((n * H + h) * W + w).to(tl.int64)[:, None] * C + c[None, :]
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=p_ok[:, None] & c_ok[None, :])


def _tiles(height: int, width: int, channels: int) -> tuple[int, int, int]:
    """``(ROWS, BLOCK_W, BLOCK_C)``: up to 32 columns a row band, :data:`PIXELS` pixels, 64 channels."""
    block_w = min(32, pow2(width))
    return max(1, PIXELS // block_w), block_w, min(64, max(16, pow2(channels)))


def grid(n: int, h: int, w: int, c: int) -> tuple[int, int]:
    """The launch grid on an ``(n, h, w, c)`` input: ``(pixel tiles, channel blocks)``."""
    rows, block_w, block_c = _tiles(h, w, c)
    return n * cdiv(h, rows) * cdiv(w, block_w), cdiv(c, block_c)


def _launch(x: torch.Tensor):
    """``x`` with a unit channel stride, its sizes, its tiles and the launch grid."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    rows, block_w, block_c = _tiles(*x.shape[1:])
    return x, tuple(x.shape), dict(ROWS=rows, BLOCK_W=block_w, BLOCK_C=block_c), grid(*x.shape)


def _constexprs(x, weight, bias, add_input, compute_dtype):
    return dict(K=weight.shape[-1], HAS_BIAS=bias is not None, ADD_INPUT=add_input, ROUND=tl_dtype(compute_dtype),
                ACC=tl_dtype(accumulation_dtype(x)))


def forward(x, weight, bias, add_input, compute_dtype, out_dtype):
    """``y`` ``(N, H, W, C)`` contiguous in ``out_dtype`` (module doc) of ``x`` ``(N, H, W, C)`` (any
    strides), ``weight`` ``(C, 1, K, K)``, ``bias`` ``(C,)`` or None; products in ``compute_dtype``."""
    x, sizes, tiles, grid = _launch(x)
    y = torch.empty(sizes, dtype=out_dtype, device=x.device)
    wt = weight.reshape(sizes[-1], -1)
    _fwd_kernel[grid](x, wt, wt if bias is None else bias, y, *sizes, *x.stride()[:3],
                      **_constexprs(x, weight, bias, add_input, compute_dtype), **tiles)
    return y


def backward(dy, x, weight, bias, add_input, compute_dtype):
    """``[dx, dweight(, dbias)]`` for the output gradient ``dy``: ``dx`` contiguous in ``x``'s dtype,
    the others in their parameters' dtypes and layouts."""
    x, sizes, tiles, grid = _launch(x)
    n, h, w, c = sizes
    k2 = weight.shape[-1] ** 2
    dy = dy.contiguous()
    dx = torch.empty(sizes, dtype=x.dtype, device=x.device)
    pw = torch.empty((grid[0], c, k2), dtype=accumulation_dtype(x), device=x.device)
    pb = torch.empty((grid[0], c), dtype=pw.dtype, device=x.device) if bias is not None else pw
    wt = weight.reshape(c, -1)
    _bwd_kernel[grid](x, wt, dy, dx, pw, pb, *sizes, *x.stride()[:3],
                      **_constexprs(x, weight, bias, add_input, compute_dtype), **tiles)
    grads = [dx, pw.sum(0).to(weight.dtype).view(weight.shape)]
    return grads + ([pb.sum(0).to(bias.dtype)] if bias is not None else [])


def compile_cases() -> list[tuning.CompileCase]:
    """The kernels for ``tools/kernel_resources.py``: PPMA's and MILA's convs (3x3 with and without the
    input added, 5x5 without) on bf16 (under autocast: fp32 weights, bf16 products) and fp32 grids of
    at least 8 columns and 64 channels (fp16 launches, like others the table lacks, keep the first
    configuration)."""
    cases = []
    for dtype, compute in (("fp32", tl.float32), ("bf16", tl.bfloat16)):
        fwd = tuning.signature(_fwd_kernel, {"X": f"*{dtype}", "WT": "*fp32", "B": "*fp32", "Y": f"*{dtype}"})
        bwd = tuning.signature(_bwd_kernel, {"X": f"*{dtype}", "WT": "*fp32", "DY": f"*{dtype}",
                                             "DX": f"*{dtype}", "PW": "*fp32", "PB": "*fp32"})
        for k, add_input in ((3, False), (3, True), (5, False)):  # 5x5: PPMA's LePE, no residual
            for block_w in (8, 16, 32):
                constexprs = dict(K=k, HAS_BIAS=True, ADD_INPUT=add_input, ROUND=compute, ACC=tl.float32,
                                  ROWS=PIXELS // block_w, BLOCK_W=block_w, BLOCK_C=64)
                cases += tuning.cases_of(_fwd_kernel, fwd, constexprs)
                cases += tuning.cases_of(_bwd_kernel, bwd, constexprs)
    return cases
