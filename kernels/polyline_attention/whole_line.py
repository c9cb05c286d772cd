"""Triton kernels of the criss-cross kind on grids whose lines have at most :data:`MAX_LINE` tokens:
one program per whole line, read and written in place.

Layout: ``(B, heads, *grid, C)`` tensors whose tokens are in raster order with one stride and
whose channels are contiguous (a contiguous tensor, or the heads split from the channels of a
``(B, *grid, heads * C)`` one, as the layer passes them), each addressed by its batch, head and
token strides; fp32 contiguous ``(B, heads, *grid)`` log-decays. A line along a grid axis of
``n`` tokens, with ``inner`` tokens per step along it (the product of the later grid sizes), is
line ``i`` of its image, starting at grid index ``(i // inner) * n * inner + i % inner``: rows
(``inner = 1``) are runs of tokens, columns and depth lines strided, each token's channels one
contiguous run. No layout copies, and no cumulative-decay tensor: a program sums its line's
log-decays in registers (``G = cumsum(-log_decay)``, the first entry unused), with ``-|G_j - G_l|``
the log mask among its tokens ``j`` (query) and ``l`` (key).

Forward application: ``O = scale * A y (+ O)``, ``A`` the line's weights (``form='official'``
``softmax(q k^T + log_mask)``, ``'paper'`` ``softmax(q k^T) * exp(log_mask)``), rounded to
``y``'s dtype before the product as the reference rounds them. Backward application: from
``dO``, the line's ``dy`` (written, or added to), and its terms of ``dq``, ``dk`` (fp32) and of
the log-decay's gradient (fp32, through the reverse cumulative sum), each written or added to
as the launcher says. A program owns its line, so nothing is atomic and nothing but the
launch's outputs is written: the launcher orders the applications (:mod:`.criss_cross`).

The weights of a line are a ``BLOCK x BLOCK`` tile (``BLOCK`` the power of two >= ``n``, at
least 16): ``q k^T``, ``A y`` and the backward's four products are tensor-core products (``tl.dot``).
"""
from __future__ import annotations

import itertools
import math

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.strided import pow2
from .launch import channel_blocks, head_bucket, precision
from .vanilla import _sign

# The longest line one program holds: its weights are a BLOCK x BLOCK fp32 tile in registers.
# The bf16 backward's 128-token tiles spill on sm_80 (116 bytes on 8 warps; 640-960 on 16 warps,
# sm_80 and sm_90); the 64-token ones have a configuration without spills everywhere.
MAX_LINE = 64
HEAD_BLOCKS = (32,)
LINE_BLOCKS = (16, 32, 64)
CONFIGS = [triton.Config({}, num_warps=4, num_stages=1), triton.Config({}, num_warps=2, num_stages=1),
           triton.Config({}, num_warps=8, num_stages=1)]


def fits(grid) -> bool:
    """True when every axis of ``grid`` has at most :data:`MAX_LINE` tokens."""
    return max(grid) <= MAX_LINE


def _variant(args) -> str:
    """``'bf16 official line<=64 d<=32'``: the resource table's name of a launch."""
    form = "paper" if args["PAPER"] else "official"
    return f"{args['Q'][1:]} {form} line<={args['BLOCK']} {head_bucket(args, HEAD_BLOCKS)}"


@triton.jit
def _tokens(line, start, n, inner, image_lines, BLOCK: tl.constexpr):
    """Tokens ``start`` to ``start + BLOCK`` of ``line`` (int64, an index over the lines of every
    (batch, head) pair): the line's pair, the tokens' grid indices (int64), which are in the line,
    and their positions along it."""
    pair, i = line // image_lines, line % image_lines
    j = start + tl.arange(0, BLOCK)
    return pair, (i // inner) * n * inner + i % inner + j * inner, j < n, j


@triton.jit
def _row_ptrs(ptr, pair, g, ok, heads, s_batch, s_head, s_token, C, BLOCK_C: tl.constexpr):
    """``(BLOCK, BLOCK_C)`` pointers to the channels of tokens ``g`` of the pair, and their mask."""
    c = tl.arange(0, BLOCK_C)
    rows = (pair // heads) * s_batch + (pair % heads) * s_head + g * s_token
    return ptr + rows[:, None] + c[None, :], ok[:, None] & (c[None, :] < C)


@triton.jit
def _load_rows(ptr, pair, g, ok, heads, s_batch, s_head, s_token, C, BLOCK_C: tl.constexpr):
    ptrs, mask = _row_ptrs(ptr, pair, g, ok, heads, s_batch, s_head, s_token, C, BLOCK_C)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _store_rows(ptr, pair, g, ok, N, C, value, accumulate, BLOCK_C: tl.constexpr):
    """``value`` into the tokens ``g`` of the pair in the contiguous ``ptr`` (``N`` tokens an
    image), or added to them when ``accumulate``."""
    ptrs, mask = _row_ptrs(ptr, pair, g, ok, 1, N * C, 0, C, C, BLOCK_C)
    if accumulate:
        value += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _weights(q, k, log_decay, ok, PAPER: tl.constexpr, PRECISION: tl.constexpr):
    """``(A, softmax(q k^T), exp(log_mask))`` of the line, fp32 ``BLOCK x BLOCK`` (the last two
    for the paper form; the official form returns ``A`` three times); ``log_decay`` its tokens'
    (``0`` at the first and past the end)."""
    g = tl.cumsum(-log_decay, 0)
    log_mask = -tl.abs(g[:, None] - g[None, :])
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if not PAPER:
        s += log_mask
    s = tl.where(ok[None, :], s, float("-inf"))
    p = tl.exp(s - tl.max(s, 1)[:, None])
    p = p / tl.sum(p, 1)[:, None]
    if PAPER:
        e = tl.exp(log_mask)
        return p * e, p, e
    return p, p, p


@tuning.autotune(CONFIGS, key=[], variant=_variant, spill_free=True, restore_value=["O"])
@triton.jit
def _whole_line_fwd_kernel(Q, K, Y, LD, O, n, inner, image_lines, heads, D, DV,
                           sqb, sqh, sqt, skb, skh, skt, syb, syh, syt, scale, accumulate,
                           PAPER: tl.constexpr, PRECISION: tl.constexpr, BLOCK: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``O = scale * A y``, or ``O += scale * A y`` when ``accumulate``, on the program's line
    (``O`` contiguous; ``s<t>b``, ``s<t>h``, ``s<t>t``: tensor ``t``'s batch, head, token strides)."""
    pair, g, ok, j = _tokens(tl.program_id(0).to(tl.int64), 0, n, inner, image_lines, BLOCK)
    N = n * image_lines
    q = _load_rows(Q, pair, g, ok, heads, sqb, sqh, sqt, D, BLOCK_D)
    k = _load_rows(K, pair, g, ok, heads, skb, skh, skt, D, BLOCK_D)
    y = _load_rows(Y, pair, g, ok, heads, syb, syh, syt, DV, BLOCK_DV)
    log_decay = tl.load(LD + pair * N + g, mask=ok & (j > 0), other=0.0)
    a, _, _ = _weights(q, k, log_decay, ok, PAPER, PRECISION)
    out = tl.dot(a.to(y.dtype), y, input_precision=PRECISION) * scale
    _store_rows(O, pair, g, ok, N, DV, out, accumulate, BLOCK_DV)


@tuning.autotune(CONFIGS, key=[], variant=_variant, spill_free=True, restore_value=["DQ", "DK", "DY", "DLD"])
@triton.jit
def _whole_line_bwd_kernel(Q, K, Y, LD, DO, DQ, DK, DY, DLD, n, inner, image_lines, heads, D, DV,
                           sqb, sqh, sqt, skb, skh, skt, syb, syh, syt, sob, soh, sot, scale,
                           accumulate_qk, accumulate_y, accumulate_decay,
                           PAPER: tl.constexpr, PRECISION: tl.constexpr, BLOCK: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Backward of ``O = A y`` for ``dO = scale * DO`` on the program's line: ``DY`` (``y``'s
    dtype), ``DQ``, ``DK`` and ``DLD`` (fp32), all contiguous, written, or added to by the
    ``accumulate_*`` flags (``so*``: ``DO``'s strides)."""
    pair, g, ok, j = _tokens(tl.program_id(0).to(tl.int64), 0, n, inner, image_lines, BLOCK)
    N = n * image_lines
    q = _load_rows(Q, pair, g, ok, heads, sqb, sqh, sqt, D, BLOCK_D)
    k = _load_rows(K, pair, g, ok, heads, skb, skh, skt, D, BLOCK_D)
    y = _load_rows(Y, pair, g, ok, heads, syb, syh, syt, DV, BLOCK_DV)
    do = (_load_rows(DO, pair, g, ok, heads, sob, soh, sot, DV, BLOCK_DV).to(tl.float32) * scale).to(y.dtype)
    log_decay = tl.load(LD + pair * N + g, mask=ok & (j > 0), other=0.0)
    a, p, e = _weights(q, k, log_decay, ok, PAPER, PRECISION)
    _store_rows(DY, pair, g, ok, N, DV, tl.dot(tl.trans(a.to(y.dtype)), do, input_precision=PRECISION),
                accumulate_y, BLOCK_DV)
    da = tl.dot(do, tl.trans(y), input_precision=PRECISION)  # dL/dA
    if PAPER:
        dp = da * e
        ds = p * (dp - tl.sum(p * dp, 1)[:, None])
        d_log_mask = da * a
    else:
        ds = a * (da - tl.sum(a * da, 1)[:, None])
        d_log_mask = ds
    _store_rows(DQ, pair, g, ok, N, D, tl.dot(ds.to(k.dtype), k, input_precision=PRECISION), accumulate_qk,
                BLOCK_D)
    _store_rows(DK, pair, g, ok, N, D, tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION),
                accumulate_qk, BLOCK_D)
    # -|G_j - G_l| = -sign(j - l) (G_j - G_l) with G non-decreasing; G_m = -sum_{0 < p <= m} log_decay_p
    t = d_log_mask * _sign(j[:, None] - j[None, :])
    dg = tl.sum(t, 0) - tl.sum(t, 1)
    dld = -tl.cumsum(dg, 0, reverse=True)  # -sum_{m >= p} dG_m
    dld = tl.where(j > 0, dld, 0.0)
    if accumulate_decay:
        dld += tl.load(DLD + pair * N + g, mask=ok, other=0.0)
    tl.store(DLD + pair * N + g, dld, mask=ok)


def token_strides(t: torch.Tensor) -> torch.Tensor:
    """``t`` ``(B, heads, *grid, C)``, or a contiguous copy of it unless its channels are
    contiguous and its tokens in raster order with one stride (what the kernels address)."""
    grid = t.shape[2:-1]
    token = t.stride(-2)
    raster = [token * math.prod(grid[i + 1:]) for i in range(len(grid))]
    ok = t.stride(-1) == 1 and all(s == r for s, r, n in zip(t.stride()[2:-1], raster, grid) if n > 1)
    return t if ok else t.contiguous()


def _strides(*tensors) -> list[int]:
    """The batch, head and token strides of each of ``tensors`` (laid out as :func:`token_strides` keeps)."""
    return [s for t in tensors for s in (t.stride(0), t.stride(1), t.stride(-2))]


def _launch(q, v, n, inner, form):
    """``(grid, sizes, constexprs)`` of an application along an axis of ``n`` tokens, ``inner``
    tokens per step."""
    consts = dict(PAPER=form == "paper", PRECISION=precision(q.dtype), BLOCK=max(16, pow2(n)),
                  **channel_blocks(q.shape[-1], v.shape[-1]))
    image_lines = math.prod(q.shape[2:-1]) // n
    sizes = (n, inner, image_lines, q.shape[1], q.shape[-1], v.shape[-1])
    return (q.shape[0] * q.shape[1] * image_lines,), sizes, consts


def apply_fwd(q, k, y, log_decay, out, n, inner, form, scale=1.0, accumulate=False):
    """``out = scale * A y`` (``out += ...`` when ``accumulate``) along the axis of ``n`` tokens
    and ``inner`` tokens per step: ``q``, ``k``, ``y`` laid out as :func:`token_strides` keeps,
    ``log_decay`` and ``out`` (like ``y``) contiguous."""
    grid, sizes, consts = _launch(q, y, n, inner, form)
    _whole_line_fwd_kernel[grid](q, k, y, log_decay, out, *sizes, *_strides(q, k, y), float(scale), int(accumulate),
                                 **consts)


def apply_bwd(q, k, y, log_decay, grad, dq, dk, dy, dlog_decay, n, inner, form, scale=1.0,
              accumulate_qk=False, accumulate_y=False, accumulate_decay=False):
    """Backward of :func:`apply_fwd` for the output gradient ``scale * grad`` (like ``y``, laid out
    as :func:`token_strides` keeps); ``dq``, ``dk``, ``dy``, ``dlog_decay`` contiguous."""
    grid, sizes, consts = _launch(q, y, n, inner, form)
    _whole_line_bwd_kernel[grid](q, k, y, log_decay, grad, dq, dk, dy, dlog_decay, *sizes, *_strides(q, k, y, grad),
                                 float(scale), int(accumulate_qk), int(accumulate_y), int(accumulate_decay), **consts)


def compile_cases() -> list[tuning.CompileCase]:
    """Every configuration of both kernels for fp32 and bf16 (fp16 takes bf16's rows), both forms,
    every line block of :data:`LINE_BLOCKS` and the head-dim blocks of :data:`HEAD_BLOCKS`
    (``tools/kernel_resources.py``)."""
    cases = []
    for kernel, dtype, paper, block, head in itertools.product(
            (_whole_line_fwd_kernel, _whole_line_bwd_kernel), ("fp32", "fp16", "bf16"), (False, True),
            LINE_BLOCKS, HEAD_BLOCKS):
        pointers = {name: f"*{dtype}" for name in ("Q", "K", "Y", "O", "DO", "DY")}
        pointers.update({name: "*fp32" for name in ("LD", "DQ", "DK", "DLD")}, scale="fp32")
        constexprs = dict(PAPER=paper, PRECISION=precision(dtype), BLOCK=block, BLOCK_D=head, BLOCK_DV=head)
        cases += tuning.cases_of(kernel, tuning.signature(kernel, pointers), constexprs, fp16_as_bf16=True)
    return cases
