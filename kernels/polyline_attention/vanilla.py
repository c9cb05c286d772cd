"""Triton kernels of the vanilla polyline masked attention, forward and backward, no ``N x N``.

Layout: ``q``, ``k`` ``(B, heads, N, d)``, ``v`` ``(B, heads, N, dv)`` (any strides, channels
contiguous), ``N = T*H*W`` tokens in raster order (``T = 1`` on a 2-D grid). The decays enter as
their cumulative sums, fp32 ``(B*heads, N)``: ``Ga`` = cumsum of ``-log_alpha`` along W, ``Gb``
of ``-log_beta`` along H, ``Gc`` of ``-log_gamma`` along T. The V2H log mask ``M(to, from)``
from key ``from = (s, k, l)`` to query ``to = (t, i, j)`` (its path runs along T, then H, then W)
is ``-|Ga[t,i,j] - Ga[t,i,l]| - |Gb[t,i,l] - Gb[t,k,l]| - |Gc[t,k,l] - Gc[s,k,l]|``; the H2V
mask is ``M(key, query)``.

Tiles follow the grid. Every program owns a *fixed* tile ``F``: ``ROWS`` image rows of one frame
by ``COLS`` columns (16 or 32, whichever pads W least; 16 in the backward; ``ROWS = BLOCK //
COLS``, ``BLOCK`` autotuned); it loops over *loop* tiles ``L`` of ``LROWS`` image rows of one
frame by ``COLS`` columns (``LROWS`` 1, 2 or 4, autotuned: ``LROWS * COLS`` keys a product),
column block by column block. Then every log mask is broadcasts of per-row vectors, never a
``BLOCK x BLOCK`` gather:

- ``M(F, L)`` (``to`` in ``F``) reads ``Ga``, ``Gb`` at the corners (``F``'s row, ``L``'s
  column): a ``(BLOCK, COLS)`` table that is the same for every loop row of a column block,
  gathered once per column block and repeated over the loop tile's rows; the rest are vectors
  over ``L``.
- ``M(L, F)`` (``to`` in ``L``) reads ``Ga``, ``Gb`` at (``L``'s row, ``F``'s column): a
  ``(BLOCK, LROWS)`` gather per loop tile, repeated over each row's columns.

Forward (``F`` = queries, ``L`` = keys; one pass, ``QK^T`` once): ``form='official'`` keeps two
online softmaxes (logits plus the V2H = ``M(F, L)`` / H2V = ``M(L, F)`` log mask) and two
accumulators, ``out = 0.5 * (O_v2h + O_h2v)``; ``form='paper'`` keeps one softmax of the logits
and applies ``exp(V2H) + exp(H2V)`` to its probabilities. Besides ``out`` it writes the
residuals of the backward: each softmax's log-sum-exp and, for the official form, ``O_v2h``
(fp32; ``O_h2v = 2 out - O_v2h``).

Backward, FlashAttention-2 style, two kernels that recompute the probabilities from the saved
log-sum-exps: a ``dk``/``dv`` pass (``F`` = keys, ``L`` = queries) and a ``dq`` pass (``F`` =
queries, ``L`` = keys); each writes only its fixed tile's rows. The decay gradients are split the
same way: each pass keeps the terms of ``dGa``, ``dGb``, ``dGc`` that land on its fixed tile's
rows (its own tokens, and the corners of ``M(F, L)``, reduced over the tile's columns once per
column block) and writes them to a slot of its own; the launcher sums the slots. The one
exception, 3-D grids only: the terms at ``(frame of L, row and column of F)`` land in frames the
program does not own; they are summed over each loop frame in registers and added atomically,
one ``BLOCK`` vector per frame and program (``T`` additions per position, no float atomics per
element). ``dGa``, ``dGb``, ``dGc`` are the slots' sums, and the decay gradients their reverse
cumulative sums (:mod:`.decays`, one launch, as the cumulative decays are).

Launches: a forward is the cumulative decays and the forward kernel; a backward the statistics
(:func:`_softmax_stats_kernel`, FlashAttention-2's preprocess; the linear kind's
:func:`_linear_stats_kernel`), the cumulative decays, the two passes, the decay gradients and the
zero fill of the slots: no PyTorch arithmetic between the kernels.

The same kernels run the linear kind in its quadratic form (``LINEAR``): no softmax, the weights
are the logits times ``exp(V2H) + exp(H2V)`` (the paper form with the logits in place of the
probabilities). The forward (:func:`linear_attention_quadratic_fwd`) accumulates the weights'
products with ``v`` and their row sums, the numerator ``num'``; the two backward passes
(:func:`linear_attention_quadratic_bwd`) take the normalization by the row sums through ``dO``
and one statistic per query.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.strided import cdiv
from .decays import cumulative_decays, decay_gradients
from .launch import channel_blocks, head_bucket, precision

# Fixed tiles of BLOCK tokens (the autotuner's choice; the interpreter runs the first) on rows of
# COLS columns (the launcher's: :func:`columns`), loop tiles of LROWS rows. One-row loop tiles make
# many short iterations (64 x 16 products at 14 x 14, a dependent online-softmax update each); two
# and four rows give FlashAttention-2's 64 x 32 and 64 x 64 products (the backward's four-row
# tiles on 16-token fixed tiles: the larger spilled). Registers bound the tiles: the
# BLOCK x (LROWS * COLS) fp32 tiles (logits, masks, probabilities), the BLOCK x COLS corner tables
# and the backward's corner sums, and the accumulators live in registers. mma layouts give every
# warp 16 of the tile's rows first, so warps beyond BLOCK / 16 go along the channels: a 64-token tile on 8 warps holds as many
# registers per thread as on 4, a 16-token tile on 8 or 16 warps an eighth or a sixteenth of its
# accumulators (how head dims 64 and 128 fit). The backward takes one pipeline stage (the loop
# tiles' prefetch costs it 20-40 registers). ``maxnreg=255``: with Triton's ptxas options
# (--regAllocOptLevel=2) configurations of 8 or more warps otherwise stop at 128 registers and spill
# (the dk/dv pass everywhere, the small tiles elsewhere; the first three forward and first two dq
# configurations spilled more with it). Which configurations a launch may run is the resource
# table's (``spill_free``): those that spill the fewest register bytes on the launch's GPU, none on
# sm_80 and sm_90 for every variant of the table (tests/kernels/test_kernel_resources.py).


def _configs(shapes, stages: int, maxnreg=None, loop_rows: int = 1):
    """``triton.Config`` of ``(BLOCK, num_warps)`` pairs with ``LROWS = loop_rows``."""
    return [triton.Config({"BLOCK": block, "LROWS": loop_rows}, num_warps=warps, num_stages=stages, maxnreg=maxnreg)
            for block, warps in shapes]


FWD_CONFIGS = (_configs([(64, 4), (64, 8), (128, 8)], 2) + _configs([(32, 8), (16, 4), (16, 8), (16, 16)], 2, 255)
               + _configs([(64, 4), (64, 8)], 2, 255, loop_rows=2) + _configs([(64, 8)], 2, 255, loop_rows=4))
BWD_CONFIGS = (_configs([(64, 4), (64, 8)], 1)  # 128-token tiles spilled in bf16 on sm_80 (44-80 bytes)
               + _configs([(32, 8), (16, 4), (16, 8), (16, 16)], 1, 255)
               + _configs([(64, 8), (32, 4)], 1, 255, loop_rows=2) + _configs([(16, 4)], 1, 255, loop_rows=4))
DKDV_CONFIGS = (_configs([(64, 4), (64, 8), (32, 8), (16, 4), (16, 8), (16, 16)], 1, 255)
                + _configs([(64, 8)], 1, 255, loop_rows=2) + _configs([(16, 4)], 1, 255, loop_rows=4))
FWD_COLS, BWD_COLS = (16, 32), (16,)  # tile widths (tl.dot's smallest tile side is 16)
# The resource table's channel blocks: head dims up to 32 count as 32, up to 64 as 64, up to 128 as
# 128 (larger ones have no rows: their launches run the first configuration, untuned).
HEAD_BLOCKS = (32, 64, 128)


def columns(width: int, backward: bool, fp32: bool = False, head: int = 32) -> int:
    """``COLS``: the columns of every tile for a grid ``width`` wide: of the widths offered (16 or
    32 forward; 16 backward, for ``fp32`` inputs and for head-dim blocks ``head`` above 32, whose
    32-column tiles spilled) the one that pads the rows least, the wider on a tie."""
    offered = BWD_COLS if backward or fp32 or head > 32 else FWD_COLS
    return min(offered, key=lambda cols: (cdiv(width, cols) * cols, -cols))


def _variant(args) -> str:
    """``'fp16 3d official d<=32 cols16'``: the resource table's name of a launch (:mod:`..common.tuning`)."""
    form = "linear" if args.get("LINEAR") else "paper" if args["PAPER"] else "official"
    return f"{args['Q'][1:]} {'3d' if args['IS_3D'] else '2d'} {form} {head_bucket(args, HEAD_BLOCKS)} cols{args['COLS']}"


def _tiles(meta, frames, height, width, cols):
    """Fixed tiles of one ``(B, head)``: frames x row blocks x column blocks."""
    return frames * cdiv(height, meta["BLOCK"] // cols) * cdiv(width, cols)


@triton.jit
def _sign(x):
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))


@triton.jit
def _fixed_tile(H, W, ROWS: tl.constexpr, COLS: tl.constexpr):
    """The program's fixed tile: token indices, validity, frame, rows, columns, column block, first row."""
    tile = tl.program_id(0)
    col_blocks = tl.cdiv(W, COLS)
    row_blocks = tl.cdiv(H, ROWS)
    cb = tile % col_blocks
    t = tile // (col_blocks * row_blocks)
    m = tl.arange(0, ROWS * COLS)
    i = (tile // col_blocks) % row_blocks * ROWS + m // COLS
    j = cb * COLS + m % COLS
    ok = (i < H) & (j < W)
    return (t * H + i) * W + j, ok, t, i, j, cb, (tile // col_blocks) % row_blocks * ROWS


@triton.jit
def _load_rows(ptr, n, ok, stride_n, c, C):
    """``(len(n), BLOCK_C)`` rows ``n`` of a ``(N, C)`` matrix at ``ptr`` (zeros outside)."""
    return tl.load(ptr + n[:, None] * stride_n + c[None, :], mask=ok[:, None] & (c[None, :] < C), other=0.0)


@triton.jit
def _corner_tables(Ga, Gb, ga_f, f_t, f_i, f_ok, l_j, l_ok, HW, W):
    """Per column block: ``|Ga[F] - Ga[F's row, L's column]|`` and ``Gb[F's row, L's column]``
    ``(BLOCK, COLS)``."""
    corner = (f_t * HW + f_i * W)[:, None] + l_j[None, :]
    ok = f_ok[:, None] & l_ok[None, :]
    a = tl.abs(ga_f[:, None] - tl.load(Ga + corner, mask=ok, other=0.0))
    return a, tl.load(Gb + corner, mask=ok, other=0.0)


# The loop tile's keys are LROWS rows of COLS columns. Per-row values ``(BLOCK, LROWS)`` and
# per-column values ``(BLOCK, COLS)`` go to the ``(BLOCK, LROWS * COLS)`` tile and back with these
# four; one-row tiles keep the plain broadcasts (a ``(BLOCK, 1)`` column, the table itself).
@triton.jit
def _per_row(x, LROWS: tl.constexpr, COLS: tl.constexpr):
    """``(BLOCK, LROWS)`` -> ``(BLOCK, LROWS * COLS)``: each loop row's value on its ``COLS`` keys."""
    if LROWS == 1:
        out = x
    else:
        out = tl.reshape(tl.broadcast_to(x[:, :, None], (x.shape[0], LROWS, COLS)), (x.shape[0], LROWS * COLS))
    return out


@triton.jit
def _per_column(x, LROWS: tl.constexpr, COLS: tl.constexpr):
    """``(BLOCK, COLS)`` -> ``(BLOCK, LROWS * COLS)``: each column's value on every loop row."""
    if LROWS == 1:
        out = x
    else:
        out = tl.reshape(tl.broadcast_to(x[:, None, :], (x.shape[0], LROWS, COLS)), (x.shape[0], LROWS * COLS))
    return out


@triton.jit
def _sum_rows(x, LROWS: tl.constexpr, COLS: tl.constexpr):
    """``(BLOCK, LROWS * COLS)`` -> ``(BLOCK, COLS)``: the sum over the loop rows (:func:`_per_column`'s adjoint)."""
    if LROWS == 1:
        out = x
    else:
        out = tl.sum(tl.reshape(x, (x.shape[0], LROWS, COLS)), 1)
    return out


@triton.jit
def _sum_columns(x, LROWS: tl.constexpr, COLS: tl.constexpr):
    """``(BLOCK, LROWS * COLS)`` -> ``(BLOCK, LROWS)``: each loop row's sum (:func:`_per_row`'s adjoint)."""
    if LROWS == 1:
        out = tl.sum(x, 1)[:, None]
    else:
        out = tl.sum(tl.reshape(x, (x.shape[0], LROWS, COLS)), 2)
    return out


@triton.jit
def _loop_tile(l_t, i0, cb, H, W, LROWS: tl.constexpr, COLS: tl.constexpr):
    """The keys of the loop tile at rows ``i0`` to ``i0 + LROWS - 1`` of frame ``l_t``, column block
    ``cb``: ``(l_i, l_j, l_n, l_ok)``, their rows (a scalar for one-row tiles), columns, tokens and
    validity, ``(LROWS * COLS,)``."""
    key = tl.arange(0, LROWS * COLS)
    if LROWS == 1:
        l_i = i0
        l_j = cb * COLS + key
        l_ok = l_j < W
    else:
        l_i = i0 + key // COLS
        l_j = cb * COLS + key % COLS
        l_ok = (l_j < W) & (l_i < H)
    return l_i, l_j, (l_t * H + l_i) * W + l_j, l_ok


@triton.jit
def _at_loop_rows(G, l_t, i0, f_j, f_ok, H, HW, W, LROWS: tl.constexpr):
    """``(BLOCK, LROWS)``: ``G`` at (the loop tile's rows ``i0`` on of frame ``l_t``, ``F``'s columns)."""
    if LROWS == 1:
        out = tl.load(G + l_t * HW + i0 * W + f_j, mask=f_ok, other=0.0)[:, None]
    else:
        rows = i0 + tl.arange(0, LROWS)
        out = tl.load(G + (l_t * HW + rows * W)[None, :] + f_j[:, None], mask=f_ok[:, None] & (rows < H)[None, :],
                      other=0.0)
    return out


@triton.jit
def _log_masks(Ga, Gb, Gc, a_fl, gb_fl, gb_f, gc_f, f_t, f_i, f_j, f_ok, l_t, i0, l_i, l_n, l_j, l_ok, H, HW, W,
               IS_3D: tl.constexpr, LROWS: tl.constexpr, COLS: tl.constexpr):
    """``(M(F, L), M(L, F))`` ``(BLOCK, LROWS * COLS)`` for the loop tile: rows ``i0`` to ``i0 +
    LROWS - 1`` of frame ``l_t``, one column block (``l_i``, ``l_n``, ``l_j``, ``l_ok``: each key's
    row, token, column, validity); ``a_fl``, ``gb_fl``: the column block's :func:`_corner_tables`;
    ``gb_f``, ``gc_f``: ``Gb``, ``Gc`` at ``F``. Both masks are -inf at ``L``'s padding (its
    ``Ga``, ``Gb`` read as +inf): it weighs 0."""
    ga_l = tl.load(Ga + l_n, mask=l_ok, other=float("inf"))
    ya = _at_loop_rows(Ga, l_t, i0, f_j, f_ok, H, HW, W, LROWS)
    yb = _at_loop_rows(Gb, l_t, i0, f_j, f_ok, H, HW, W, LROWS)
    if IS_3D:
        # M(F, L): Gb, Gc at (F's frame, L's row and column); M(L, F): at (L's frame, F's row and column)
        fl = f_t * HW + l_i * W + l_j
        gb_fl_l = tl.load(Gb + fl, mask=l_ok, other=float("inf"))
        gc_fl_l = tl.load(Gc + fl, mask=l_ok, other=0.0)
        c_fl = tl.abs(gc_fl_l - tl.load(Gc + l_n, mask=l_ok, other=0.0))
        lf = l_t * HW + f_i * W + f_j
        gb_lf = tl.load(Gb + lf, mask=f_ok, other=0.0)
        r_lf = tl.abs(yb - gb_lf[:, None]) + tl.abs(tl.load(Gc + lf, mask=f_ok, other=0.0) - gc_f)[:, None]
        m_fl = -_per_column(a_fl, LROWS, COLS) - tl.abs(_per_column(gb_fl, LROWS, COLS) - gb_fl_l[None, :]) - c_fl[None, :]
    else:
        r_lf = tl.abs(yb - gb_f[:, None])
        gb_l = tl.load(Gb + l_n, mask=l_ok, other=float("inf"))
        m_fl = -_per_column(a_fl, LROWS, COLS) - tl.abs(_per_column(gb_fl, LROWS, COLS) - gb_l[None, :])
    m_lf = -tl.abs(ga_l[None, :] - _per_row(ya, LROWS, COLS)) - _per_row(r_lf, LROWS, COLS)
    return m_fl, m_lf


@tuning.autotune(FWD_CONFIGS, key=["T", "H", "W"], variant=_variant, spill_free=True)
@triton.jit(do_not_specialize=["T", "H", "W"])
def _fwd_kernel(
    Q, K, V, Ga, Gb, Gc, O, O1, LSE,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
    heads, T, H, W, D, DV, EPS,
    IS_3D: tl.constexpr, PAPER: tl.constexpr, LINEAR: tl.constexpr, PRECISION: tl.constexpr, COLS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr, LROWS: tl.constexpr,
):
    """``O``: ``(B, heads, N, dv)`` (strides ``so_*``). Residuals: softmax forms, the log-sum-exps
    ``LSE`` ``(1 or 2, B*heads, N)`` and (official form) ``O_v2h`` in ``O1`` (``O``'s strides);
    linear kind (``LINEAR``, with ``PAPER``), the numerator ``num'`` in ``O1``, contiguous
    ``(B*heads, N, dv + 1)``, and ``out = num'[:dv] / (num'[dv] + EPS)`` in ``O``."""
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    HW = H * W
    N = T * HW
    row = bh.to(tl.int64) * N
    Ga += row
    Gb += row
    Gc += row
    Q += b * sq_b + h * sq_h
    K += b * sk_b + h * sk_h
    V += b * sv_b + h * sv_h
    c = tl.arange(0, BLOCK_D)
    cv = tl.arange(0, BLOCK_DV)
    col = tl.arange(0, COLS)
    f_n, f_ok, f_t, f_i, f_j, _, _ = _fixed_tile(H, W, BLOCK // COLS, COLS)
    q = _load_rows(Q, f_n, f_ok, sq_n, c, D)
    ga_f = tl.load(Ga + f_n, mask=f_ok, other=0.0)
    gb_f = tl.load(Gb + f_n, mask=f_ok, other=0.0)
    gc_f = tl.load(Gc + f_n, mask=f_ok, other=0.0)
    m1 = tl.full((BLOCK,), float("-inf"), tl.float32)
    l1 = tl.zeros((BLOCK,), tl.float32)
    acc1 = tl.zeros((BLOCK, BLOCK_DV), tl.float32)
    m2 = tl.full((BLOCK,), float("-inf"), tl.float32)
    l2 = tl.zeros((BLOCK,), tl.float32)
    acc2 = tl.zeros((BLOCK, BLOCK_DV), tl.float32)
    for cb in range(0, tl.cdiv(W, COLS)):
        block_j = cb * COLS + col  # the column block's columns
        a_fl, gb_fl = _corner_tables(Ga, Gb, ga_f, f_t, f_i, f_ok, block_j, block_j < W, HW, W)
        for r in range(0, T * tl.cdiv(H, LROWS)):
            l_t = r // tl.cdiv(H, LROWS)
            i0 = r % tl.cdiv(H, LROWS) * LROWS
            l_i, l_j, l_n, l_ok = _loop_tile(l_t, i0, cb, H, W, LROWS, COLS)
            k = _load_rows(K, l_n, l_ok, sk_n, c, D)
            v = _load_rows(V, l_n, l_ok, sv_n, cv, DV)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            v2h, h2v = _log_masks(Ga, Gb, Gc, a_fl, gb_fl, gb_f, gc_f, f_t, f_i, f_j, f_ok, l_t, i0, l_i, l_n, l_j,
                                  l_ok, H, HW, W, IS_3D, LROWS, COLS)
            if LINEAR:  # no softmax: the weights are the logits times both masks (0 at L's padding)
                w = s * (tl.exp(v2h) + tl.exp(h2v))
                l1 += tl.sum(w, 1)
                acc1 += tl.dot(w.to(v.dtype), v, input_precision=PRECISION)
            elif PAPER:
                s = tl.where(l_ok[None, :], s, float("-inf"))
                m_new = tl.maximum(m1, tl.max(s, 1))
                scale = tl.exp(m1 - m_new)
                p = tl.exp(s - m_new[:, None])
                l1 = l1 * scale + tl.sum(p, 1)
                pm = p * (tl.exp(v2h) + tl.exp(h2v))
                acc1 = acc1 * scale[:, None] + tl.dot(pm.to(v.dtype), v, input_precision=PRECISION)
                m1 = m_new
            else:
                s1 = tl.where(l_ok[None, :], s + v2h, float("-inf"))
                m_new = tl.maximum(m1, tl.max(s1, 1))
                scale = tl.exp(m1 - m_new)
                p = tl.exp(s1 - m_new[:, None])
                l1 = l1 * scale + tl.sum(p, 1)
                acc1 = acc1 * scale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
                m1 = m_new
                s2 = tl.where(l_ok[None, :], s + h2v, float("-inf"))
                m_new = tl.maximum(m2, tl.max(s2, 1))
                scale = tl.exp(m2 - m_new)
                p = tl.exp(s2 - m_new[:, None])
                l2 = l2 * scale + tl.sum(p, 1)
                acc2 = acc2 * scale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
                m2 = m_new
    out_mask = f_ok[:, None] & (cv[None, :] < DV)
    o_off = b * so_b + h * so_h + f_n[:, None] * so_n + cv[None, :]
    if LINEAR:
        tl.store(O + o_off, (acc1 / (l1[:, None] + EPS)).to(O.dtype.element_ty), mask=out_mask)
        num = O1 + (row + f_n) * (DV + 1)
        tl.store(num[:, None] + cv[None, :], acc1, mask=out_mask)
        tl.store(num + DV, l1, mask=f_ok)
    else:
        o1 = acc1 / l1[:, None]
        out = o1 if PAPER else 0.5 * (o1 + acc2 / l2[:, None])
        tl.store(O + o_off, out.to(O.dtype.element_ty), mask=out_mask)
        # residuals, (1 or 2, B*heads, N) log-sum-exps: the V2H (paper: the only) softmax's, then the H2V one's
        tl.store(LSE + row + f_n, m1 + tl.log(l1), mask=f_ok)
        if not PAPER:
            tl.store(LSE + tl.num_programs(1).to(tl.int64) * N + row + f_n, m2 + tl.log(l2), mask=f_ok)
            tl.store(O1 + o_off, o1, mask=out_mask)


@triton.jit
def _probabilities(PAPER: tl.constexpr, LINEAR: tl.constexpr, s, m_fl, m_lf, lse_fl, lse_lf):
    """``(p_fl, p_lf, p)`` ``(BLOCK, COLS)`` (``F`` x ``L``) from the logits ``s`` and the log masks
    ``M(F, L)``, ``M(L, F)``; ``lse_*``: each softmax's log-sum-exp, broadcast to the tile (paper
    form: the one softmax's, in ``lse_fl``). Official form: each softmax's probabilities and their
    mean, the attention weights; paper form: the softmax's probabilities ``p`` times
    ``exp(M(F, L))`` and times ``exp(M(L, F))`` (their sum is the attention weights), and ``p``;
    linear kind (``LINEAR``, no softmax): ``s`` times either mask, and the two masks' sum."""
    if LINEAR:
        e_fl = tl.exp(m_fl)
        e_lf = tl.exp(m_lf)
        return s * e_fl, s * e_lf, e_fl + e_lf
    if PAPER:
        p = tl.exp(s - lse_fl)
        return p * tl.exp(m_fl), p * tl.exp(m_lf), p
    p_fl = tl.exp(s + m_fl - lse_fl)
    p_lf = tl.exp(s + m_lf - lse_lf)
    return p_fl, p_lf, 0.5 * (p_fl + p_lf)


@triton.jit
def _weights(PAPER: tl.constexpr, p_fl, p_lf, p):
    """The attention weights from :func:`_probabilities`."""
    if PAPER:
        return p_fl + p_lf
    return p


@triton.jit
def _mask_grads(PAPER: tl.constexpr, LINEAR: tl.constexpr, p_fl, p_lf, p, dp, d_fl, d_lf):
    """``(ds, g_fl, g_lf)``: the gradients of the logits and of the log masks ``M(F, L)``,
    ``M(L, F)`` from :func:`_probabilities` and ``dp = dO v^T`` (all ``(BLOCK, COLS)``). ``d_*``:
    each softmax's ``rowsum(dO * O)``, broadcast to the tile (paper form: in ``d_fl``); linear
    kind: the gradient of the weights is ``dp + d_fl``, ``d_fl`` the one of the ones column of
    ``v' = [v, 1]``, ``-(g . out) / den`` per query."""
    if LINEAR:
        dw = dp + d_fl
        return dw * p, dw * p_fl, dw * p_lf
    if PAPER:
        g_fl = dp * p_fl
        g_lf = dp * p_lf
        return g_fl + g_lf - p * d_fl, g_fl, g_lf
    g_fl = p_fl * (0.5 * dp - d_fl)
    g_lf = p_lf * (0.5 * dp - d_lf)
    return g_fl + g_lf, g_fl, g_lf


@triton.jit
def _flush_corners(DG_CORNER, ca, cb_acc, f_t, row0, l_j, l_ok, H, W, HW, plane,
                   ROWS: tl.constexpr, COLS: tl.constexpr):
    """Store the column block's corner terms of ``M(F, L)`` (``(BLOCK, COLS)`` for ``dGa`` and
    ``dGb``), summed over each row's columns of ``F``, at (``F``'s rows, ``L``'s columns)."""
    rows = row0 + tl.arange(0, ROWS)
    off = (f_t * HW + rows * W)[:, None] + l_j[None, :]
    ok = (rows < H)[:, None] & l_ok[None, :]
    tl.store(DG_CORNER + off, tl.sum(tl.reshape(ca, (ROWS, COLS, COLS)), 1), mask=ok)
    tl.store(DG_CORNER + plane + off, tl.sum(tl.reshape(cb_acc, (ROWS, COLS, COLS)), 1), mask=ok)


@triton.jit
def _bwd_pass(
    F_MAT, L_MAT, F_OUT, L_OUT, Ga, Gb, Gc, DG, STATS,
    s_fb, s_fh, s_fn, s_lb, s_lh, s_ln, s_fob, s_foh, s_fon, s_lob, s_loh, s_lon,
    heads, T, H, W, D, DV,
    KEYS_FIXED: tl.constexpr, IS_3D: tl.constexpr, PAPER: tl.constexpr, LINEAR: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr, COLS: tl.constexpr,
    LROWS: tl.constexpr,
):
    """One backward pass (see the module docstring). ``KEYS_FIXED``: the ``dk``/``dv`` pass
    (``F_MAT`` = ``K``, ``F_OUT`` = ``V``, ``L_MAT`` = ``Q``, ``L_OUT`` = ``dO``), else the
    ``dq`` pass (``F_MAT`` = ``Q``, ``F_OUT`` = ``dO``, ``L_MAT`` = ``K``, ``L_OUT`` = ``V``).
    Returns the accumulators ``(acc_d, acc_dv)`` ``(BLOCK, BLOCK_D|BLOCK_DV)`` and the fixed
    tile's tokens and validity. ``DG``: this pass's fp32 ``(2 + column blocks, 3, B*heads, N)``
    slots (own tokens, atomic 3-D terms, corners per column block of ``F``)."""
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    HW = H * W
    N = T * HW
    row = bh.to(tl.int64) * N
    plane = tl.num_programs(1).to(tl.int64) * N  # one (B*heads, N) plane
    Ga += row
    Gb += row
    Gc += row
    DG += row
    F_MAT += b * s_fb + h * s_fh
    F_OUT += b * s_fob + h * s_foh
    L_MAT += b * s_lb + h * s_lh
    L_OUT += b * s_lob + h * s_loh
    c = tl.arange(0, BLOCK_D)
    cv = tl.arange(0, BLOCK_DV)
    col = tl.arange(0, COLS)
    f_n, f_ok, f_t, f_i, f_j, f_cb, f_row0 = _fixed_tile(H, W, BLOCK // COLS, COLS)
    fm = _load_rows(F_MAT, f_n, f_ok, s_fn, c, D)
    fo = _load_rows(F_OUT, f_n, f_ok, s_fon, cv, DV)
    ga_f = tl.load(Ga + f_n, mask=f_ok, other=0.0)
    gb_f = tl.load(Gb + f_n, mask=f_ok, other=0.0)
    gc_f = tl.load(Gc + f_n, mask=f_ok, other=0.0)
    # Padding tokens weigh 0: L's by their masks (:func:`_log_masks`), the queries' (dq pass: F's)
    # by +inf log-sum-exps; F's padding keys (dk/dv pass) only reach rows never stored, and the
    # corner sums, zeroed there.
    if not KEYS_FIXED:  # the queries' softmax statistics, (BLOCK, 1)
        lse_1 = tl.load(STATS + row + f_n, mask=f_ok, other=float("inf"))[:, None]
        d_1 = tl.load(STATS + plane + row + f_n, mask=f_ok, other=0.0)[:, None]
        lse_2 = tl.load(STATS + 2 * plane + row + f_n, mask=f_ok, other=float("inf"))[:, None]
        d_2 = tl.load(STATS + 3 * plane + row + f_n, mask=f_ok, other=0.0)[:, None]
    acc_d = tl.zeros((BLOCK, BLOCK_D), tl.float32)
    acc_dv = tl.zeros((BLOCK, BLOCK_DV), tl.float32)
    own_a = tl.zeros((BLOCK,), tl.float32)
    own_b = tl.zeros((BLOCK,), tl.float32)
    own_c = tl.zeros((BLOCK,), tl.float32)
    dg_corner = DG + (2 + f_cb).to(tl.int64) * 3 * plane
    for cb in range(0, tl.cdiv(W, COLS)):
        block_j = cb * COLS + col  # the column block's columns
        a_fl, gb_fl = _corner_tables(Ga, Gb, ga_f, f_t, f_i, f_ok, block_j, block_j < W, HW, W)
        ca = tl.zeros((BLOCK, COLS), tl.float32)
        cb_acc = tl.zeros((BLOCK, COLS), tl.float32)
        for l_t in range(0, T):
            frame_b = tl.zeros((BLOCK,), tl.float32)  # 3-D: terms at (L's frame, F's row and column)
            frame_c = tl.zeros((BLOCK,), tl.float32)
            for i0 in range(0, H, LROWS):
                l_i, l_j, l_n, l_ok = _loop_tile(l_t, i0, cb, H, W, LROWS, COLS)
                lm = _load_rows(L_MAT, l_n, l_ok, s_ln, c, D)
                lo = _load_rows(L_OUT, l_n, l_ok, s_lon, cv, DV)
                s = tl.dot(fm, tl.trans(lm), input_precision=PRECISION)
                m_fl, m_lf = _log_masks(Ga, Gb, Gc, a_fl, gb_fl, gb_f, gc_f, f_t, f_i, f_j, f_ok, l_t, i0, l_i,
                                        l_n, l_j, l_ok, H, HW, W, IS_3D, LROWS, COLS)
                if KEYS_FIXED:  # F = keys: V2H = M(L, F), H2V = M(F, L); statistics along L
                    lse_v2h = tl.load(STATS + row + l_n, mask=l_ok, other=float("inf"))[None, :]
                    if PAPER:
                        p_fl, p_lf, p = _probabilities(PAPER, LINEAR, s, m_fl, m_lf, lse_v2h, lse_v2h)
                    else:
                        lse_h2v = tl.load(STATS + 2 * plane + row + l_n, mask=l_ok, other=float("inf"))[None, :]
                        p_fl, p_lf, p = _probabilities(PAPER, LINEAR, s, m_fl, m_lf, lse_h2v, lse_v2h)
                    acc_dv += tl.dot(_weights(PAPER, p_fl, p_lf, p).to(lo.dtype), lo, input_precision=PRECISION)
                    d_v2h = tl.load(STATS + plane + row + l_n, mask=l_ok, other=0.0)[None, :]
                    d_h2v = tl.load(STATS + 3 * plane + row + l_n, mask=l_ok, other=0.0)[None, :]
                    d_fl, d_lf = (d_v2h, d_v2h) if PAPER else (d_h2v, d_v2h)
                else:
                    p_fl, p_lf, p = _probabilities(PAPER, LINEAR, s, m_fl, m_lf, lse_1, lse_2)
                    d_fl, d_lf = d_1, d_2
                dp = tl.dot(fo, tl.trans(lo), input_precision=PRECISION)
                ds, g_fl, g_lf = _mask_grads(PAPER, LINEAR, p_fl, p_lf, p, dp, d_fl, d_lf)
                acc_d += tl.dot(ds.to(lm.dtype), lm, input_precision=PRECISION)
                # M(F, L): dGa at F and at the corner (F's row, L's column); dGb at the corner
                below = _sign(f_i[:, None] - (i0 + tl.arange(0, LROWS))[None, :])  # (BLOCK, LROWS): F's row vs L's
                ca += _sum_rows(g_fl, LROWS, COLS)
                cb_acc -= _sum_rows(g_fl * _per_row(below, LROWS, COLS), LROWS, COLS)
                # M(L, F): dGb (3-D: and -dGc) at (L's frame, F's row and column), dGc at F
                g_rows = _sum_columns(g_lf, LROWS, COLS)
                frame_b -= tl.sum(below * g_rows, 1)
                if IS_3D:
                    frame_c -= _sign(l_t - f_t) * tl.sum(g_rows, 1)
            if IS_3D:
                at = DG + 3 * plane + l_t * HW + f_i * W + f_j  # the atomic slot
                tl.atomic_add(at + plane, frame_b, mask=f_ok, sem="relaxed")
                tl.atomic_add(at + 2 * plane, frame_c, mask=f_ok, sem="relaxed")
                own_c -= frame_c
            else:
                own_b += frame_b
        ca = tl.where(f_ok[:, None], ca * _sign(f_j[:, None] - block_j[None, :]), 0.0)
        cb_acc = tl.where(f_ok[:, None], cb_acc, 0.0)
        own_a -= tl.sum(ca, 1)
        _flush_corners(dg_corner, ca, cb_acc, f_t, f_row0, block_j, block_j < W, H, W, HW, plane, BLOCK // COLS, COLS)
    tl.store(DG + f_n, own_a, mask=f_ok)
    tl.store(DG + plane + f_n, own_b, mask=f_ok)
    tl.store(DG + 2 * plane + f_n, own_c, mask=f_ok)
    return acc_d, acc_dv, f_n, f_ok


@tuning.autotune(DKDV_CONFIGS, key=["T", "H", "W"], variant=_variant, spill_free=True, reset_to_zero=["DG"])
@triton.jit(do_not_specialize=["T", "H", "W"])
def _bwd_dkdv_kernel(
    Q, K, V, DO, Ga, Gb, Gc, DG, STATS, DK, DV_PTR,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sdo_b, sdo_h, sdo_n,
    heads, T, H, W, D, DV,
    IS_3D: tl.constexpr, PAPER: tl.constexpr, LINEAR: tl.constexpr, PRECISION: tl.constexpr, COLS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr, LROWS: tl.constexpr,
):
    """``DK``, ``DV_PTR``: contiguous ``(B*heads, N, d|dv)`` in ``k``'s, ``v``'s dtype."""
    dk, dv, f_n, f_ok = _bwd_pass(
        K, Q, V, DO, Ga, Gb, Gc, DG, STATS,
        sk_b, sk_h, sk_n, sq_b, sq_h, sq_n, sv_b, sv_h, sv_n, sdo_b, sdo_h, sdo_n,
        heads, T, H, W, D, DV, True, IS_3D, PAPER, LINEAR, PRECISION, BLOCK_D, BLOCK_DV, BLOCK, COLS, LROWS)
    row = tl.program_id(1).to(tl.int64) * T * H * W
    c = tl.arange(0, BLOCK_D)
    cv = tl.arange(0, BLOCK_DV)
    tl.store(DK + (row + f_n[:, None]) * D + c[None, :], dk.to(DK.dtype.element_ty),
             mask=f_ok[:, None] & (c[None, :] < D))
    tl.store(DV_PTR + (row + f_n[:, None]) * DV + cv[None, :], dv.to(DV_PTR.dtype.element_ty),
             mask=f_ok[:, None] & (cv[None, :] < DV))


@tuning.autotune(BWD_CONFIGS, key=["T", "H", "W"], variant=_variant, spill_free=True, reset_to_zero=["DG"])
@triton.jit(do_not_specialize=["T", "H", "W"])
def _bwd_dq_kernel(
    Q, K, V, DO, Ga, Gb, Gc, DG, STATS, DQ,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sdo_b, sdo_h, sdo_n,
    heads, T, H, W, D, DV,
    IS_3D: tl.constexpr, PAPER: tl.constexpr, LINEAR: tl.constexpr, PRECISION: tl.constexpr, COLS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr, LROWS: tl.constexpr,
):
    """``DQ``: contiguous ``(B*heads, N, d)`` in ``q``'s dtype."""
    dq, _, f_n, f_ok = _bwd_pass(
        Q, K, DO, V, Ga, Gb, Gc, DG, STATS,
        sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sdo_b, sdo_h, sdo_n, sv_b, sv_h, sv_n,
        heads, T, H, W, D, DV, False, IS_3D, PAPER, LINEAR, PRECISION, BLOCK_D, BLOCK_DV, BLOCK, COLS, LROWS)
    row = tl.program_id(1).to(tl.int64) * T * H * W
    c = tl.arange(0, BLOCK_D)
    tl.store(DQ + (row + f_n[:, None]) * D + c[None, :], dq.to(DQ.dtype.element_ty),
             mask=f_ok[:, None] & (c[None, :] < D))


# The statistics kernels: one configuration, tiles of 2,048 fp32 values (:func:`_stats_tile`).
STATS_CONFIGS = [triton.Config({}, num_warps=4, num_stages=1)]


def _stats_tile(dv: int) -> dict[str, int]:
    """``BLOCK_DV`` and ``BLOCK_N``, the statistics kernels' tile of ``BLOCK_N`` rows of ``dv``
    values: 2,048 elements (at 128 rows of 128 channels the fp32 rows spilled)."""
    block = channel_blocks(dv, dv)["BLOCK_DV"]
    return dict(BLOCK_DV=block, BLOCK_N=max(16, 2048 // block))


def _stats_variant(args) -> str:
    """``'bf16 official dv<=32'``: the resource table's name of a statistics kernel's launch."""
    form = "" if "PAPER" not in args else " paper" if args["PAPER"] else " official"
    return f"{args['DO'][1:]}{form} dv<={args['BLOCK_DV']}"


@tuning.autotune(STATS_CONFIGS, key=["N"], variant=_stats_variant)
@triton.jit(do_not_specialize=["N"])
def _softmax_stats_kernel(
    DO, O, O1, LSE, STATS, sdo_b, sdo_h, sdo_n, so_b, so_h, so_n, heads, N, DV,
    PAPER: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The backward passes' ``STATS`` from the forward's residuals: per softmax (V2H, then H2V; the
    paper form's one twice) its log-sum-exp from ``LSE`` and ``D = rowsum(dO_s * O_s)``, where
    ``dO_s`` is the part of ``dO`` that reaches that softmax's output ``O_s``: official,
    ``D_v2h = 0.5 dO . O_v2h`` (``O1``, contiguous fp32) and ``D_h2v = dO . out - D_v2h``
    (``O_h2v = 2 out - O_v2h``); paper, ``dO . out``."""
    bh = tl.program_id(1)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = n < N
    c = tl.arange(0, BLOCK_DV)
    do = _load_rows(DO + (bh // heads) * sdo_b + (bh % heads) * sdo_h, n, ok, sdo_n, c, DV).to(tl.float32)
    out = _load_rows(O + (bh // heads) * so_b + (bh % heads) * so_h, n, ok, so_n, c, DV).to(tl.float32)
    d_out = tl.sum(do * out, axis=1)
    row = bh.to(tl.int64) * N + n
    plane = tl.num_programs(1).to(tl.int64) * N
    lse_v2h = tl.load(LSE + row, mask=ok)
    if PAPER:
        lse_h2v = lse_v2h
        d_v2h = d_out
        d_h2v = d_out
    else:
        lse_h2v = tl.load(LSE + plane + row, mask=ok)
        d_v2h = 0.5 * tl.sum(do * _load_rows(O1 + bh.to(tl.int64) * N * DV, n, ok, DV, c, DV), axis=1)
        d_h2v = d_out - d_v2h
    tl.store(STATS + row, lse_v2h, mask=ok)
    tl.store(STATS + plane + row, d_v2h, mask=ok)
    tl.store(STATS + 2 * plane + row, lse_h2v, mask=ok)
    tl.store(STATS + 3 * plane + row, d_h2v, mask=ok)


@tuning.autotune(STATS_CONFIGS, key=["N"], variant=_stats_variant)
@triton.jit(do_not_specialize=["N"])
def _linear_stats_kernel(
    GRAD, NUM, DO, STATS, sg_b, sg_h, sg_n, heads, N, DV, eps,
    BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The linear kind's ``dO = grad / den`` (``DO``: contiguous, ``v``'s dtype) and ``STATS``
    (row 1: ``-(dO . out)``, the gradient of the ones column; the others 0) from the forward's
    ``num'`` (``NUM``: contiguous fp32 ``(B*heads, N, dv + 1)``), ``out = num'[:dv] / den`` and
    ``den = num'[dv] + eps``."""
    bh = tl.program_id(1)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = n < N
    c = tl.arange(0, BLOCK_DV)
    row = bh.to(tl.int64) * N + n
    den = tl.load(NUM + row * (DV + 1) + DV, mask=ok, other=1.0) + eps
    g = _load_rows(GRAD + (bh // heads) * sg_b + (bh % heads) * sg_h, n, ok, sg_n, c, DV).to(tl.float32)
    g = g / den[:, None]
    num = _load_rows(NUM + bh.to(tl.int64) * N * (DV + 1), n, ok, DV + 1, c, DV)
    tl.store(DO + row[:, None] * DV + c[None, :], g.to(DO.dtype.element_ty), mask=ok[:, None] & (c[None, :] < DV))
    plane = tl.num_programs(1).to(tl.int64) * N
    zero = tl.zeros([BLOCK_N], dtype=tl.float32)
    tl.store(STATS + row, zero, mask=ok)
    tl.store(STATS + plane + row, -tl.sum(g * num, axis=1) / den, mask=ok)
    tl.store(STATS + 2 * plane + row, zero, mask=ok)
    tl.store(STATS + 3 * plane + row, zero, mask=ok)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``(B, heads, *grid, C)`` -> ``(B, heads, N, C)`` with contiguous channels (a view when possible)."""
    t = t.flatten(2, -2)
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_dtype(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"the Triton polyline_attention kernel takes fp32, fp16 or bf16 {name}, got {t.dtype}")


def _launch_sizes(q, v, log_gamma, backward):
    """``(T, H, W)`` (``T = 1`` on a 2-D grid) and the constexprs every kernel takes."""
    grid = q.shape[2:-1]
    frames, height, width = (grid if log_gamma is not None else (1, *grid))
    blocks = channel_blocks(q.shape[-1], v.shape[-1])
    consts = dict(IS_3D=log_gamma is not None, PRECISION=precision(q.dtype), **blocks,
                  COLS=columns(width, backward, q.dtype == torch.float32, max(blocks.values())))
    return (frames, height, width), consts


def residual_shapes(q_shape, dv: int, form: str) -> list[tuple[int, ...]]:
    """Shapes of the fp32 residuals of :func:`vanilla_attention_fwd` for ``q`` of ``q_shape``
    ``(B, heads, *grid, d)``: the log-sum-exps ``(1 or 2, B*heads, N)`` and, for the official
    form, ``O_v2h`` ``(B, heads, N, dv)``."""
    bsz, heads, n = q_shape[0], q_shape[1], math.prod(q_shape[2:-1])
    if form == "paper":
        return [(1, bsz * heads, n)]
    return [(2, bsz * heads, n), (bsz, heads, n, dv)]


def _forward(q, k, v, log_alpha, log_beta, log_gamma, o1, lse, eps: float, paper: bool, linear: bool):
    """The forward kernel on ``q``, ``k``, ``v`` (one dtype) writing its fp32 ``o1`` and ``lse``
    (:func:`_fwd_kernel`'s ``O1``, ``LSE``) -> ``out`` ``(B, heads, N, dv)`` in ``v``'s dtype."""
    decays = cumulative_decays(log_alpha, log_beta, log_gamma)
    (frames, height, width), consts = _launch_sizes(q, v, log_gamma, backward=False)
    bsz, heads, d, dv = q.shape[0], q.shape[1], q.shape[-1], v.shape[-1]
    qf, kf, vf = _flat(q), _flat(k), _flat(v)
    out = torch.empty(bsz, heads, qf.shape[2], dv, dtype=v.dtype, device=v.device)
    _fwd_kernel[lambda meta: (_tiles(meta, frames, height, width, consts["COLS"]), bsz * heads)](
        qf, kf, vf, *decays, out, o1, lse,
        *qf.stride()[:3], *kf.stride()[:3], *vf.stride()[:3], *out.stride()[:3],
        heads, frames, height, width, d, dv, eps, PAPER=paper, LINEAR=linear, **consts,
    )
    return out


def vanilla_attention_fwd(q, k, v, log_alpha, log_beta, log_gamma=None, form="official"):
    """Vanilla polyline attention (``ppma.ops.polyline_attention(kind='vanilla')``).

    ``q``, ``k`` ``(B, heads, *grid, d)``, ``v`` ``(B, heads, *grid, dv)``, fp32 log-decays
    ``(B, heads, *grid)`` on a 2-D ``(H, W)`` or 3-D ``(T, H, W)`` grid -> ``(out, residuals)``:
    ``out`` ``(B, heads, *grid, dv)`` in ``v.dtype`` and the residuals of
    :func:`vanilla_attention_bwd` (:func:`residual_shapes`).
    """
    _check_dtype(q, k, v)
    residuals = tuple(torch.empty(s, dtype=torch.float32, device=q.device)
                      for s in residual_shapes(q.shape, v.shape[-1], form))
    o_v2h = residuals[-1]  # the paper form writes no O_v2h (nor reads this)
    out = _forward(q, k, v, log_alpha, log_beta, log_gamma, o_v2h, residuals[0], 0.0, form == "paper", False)
    return out.view(v.shape), residuals


def linear_attention_quadratic_fwd(q, k, v, log_alpha, log_beta, log_gamma=None, eps=1e-6):
    """The linear kind (``ppma.ops.polyline_linear_attention``) in its quadratic form, by the
    forward kernel without the softmax (``LINEAR``): ``num' = ((q k^T) * (exp(V2H) + exp(H2V)))
    @ [v, 1]`` and ``out = num'[:dv] / (num'[dv] + eps)``, O(N^2) work, O(N) memory.

    ``q``, ``k`` ``(B, heads, *grid, d)`` non-negative features, ``v`` ``(B, heads, *grid, dv)``
    (of mixed dtypes, all run in the promoted one), fp32 log-decays ``(B, heads, *grid)`` on a 2-D
    or 3-D grid -> ``(out, num')``: ``out`` ``(B, heads, *grid, dv)`` in ``v.dtype`` and ``num'``
    fp32 ``(B*heads, *grid, dv + 1)`` (what :func:`linear_attention_quadratic_bwd` takes).
    """
    _check_dtype(q, k, v)
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    bh, grid, dv = q.shape[0] * q.shape[1], q.shape[2:-1], v.shape[-1]
    num = torch.empty(bh, math.prod(grid), dv + 1, dtype=torch.float32, device=v.device)
    out = _forward(q.to(dtype), k.to(dtype), v.to(dtype), log_alpha, log_beta, log_gamma, num, num, float(eps),
                   True, True)
    return out.view(v.shape).to(v.dtype), num.view(bh, *grid, dv + 1)


def _softmax_stats(do, out, residuals, form):
    """The backward's ``(4, B*heads, N)`` fp32 statistics (:func:`_softmax_stats_kernel`) for ``dO``
    ``do`` from the forward's ``out`` and residuals."""
    dof, outf = _flat(do), _flat(out)
    bsz, heads, n, dv = outf.shape
    stats = torch.empty(4, bsz * heads, n, dtype=torch.float32, device=out.device)
    lse, o_v2h = residuals[0], residuals[-1]  # the paper form's O1 is its LSE, unread
    _softmax_stats_kernel[lambda meta: (cdiv(n, meta["BLOCK_N"]), bsz * heads)](
        dof, outf, o_v2h, lse, stats, *dof.stride()[:3], *outf.stride()[:3], heads, n, dv,
        PAPER=form == "paper", **_stats_tile(dv))
    return stats


def vanilla_attention_bwd(grad, out, residuals, q, k, v, log_alpha, log_beta, log_gamma=None, form="official"):
    """Gradients ``[dq, dk, dv, dlog_alpha, dlog_beta(, dlog_gamma)]`` of :func:`vanilla_attention_fwd`
    for the output gradient ``grad``, from its ``out`` and ``residuals`` (no forward kernel runs)."""
    do = grad.to(v.dtype)
    stats = _softmax_stats(do, out, residuals, form)
    return _backward(do, stats, q, k, v, log_alpha, log_beta, log_gamma, form == "paper", False)


def linear_attention_quadratic_bwd(grad, num, q, k, v, log_alpha, log_beta, log_gamma=None, eps=1e-6):
    """Gradients ``[dq, dk, dv, dlog_alpha, dlog_beta(, dlog_gamma)]`` of the linear kind
    (``ppma.ops.polyline_linear_attention``) in its quadratic form, by this module's two backward
    passes without the softmax: the weights are ``(q k^T) * (exp(V2H) + exp(H2V))``, ``num' =
    weights @ [v, 1]`` and ``out = num'[:dv] / (num'[dv] + eps)``. ``num`` is the forward's
    ``num'`` (fp32 ``(B * heads, *grid, dv + 1)``); ``grad`` ``(B, heads, *grid, dv)``. The passes
    take ``dO = grad / den`` and, as the statistic the softmax's ``D`` takes, the gradient of the
    ones column, ``-(dO . out)`` per query (``den = num'[dv] + eps``)."""
    gradf, bh, dv = _flat(grad), num.shape[0], v.shape[-1]
    n = gradf.shape[2]
    num = num.reshape(bh, n, dv + 1).contiguous()
    do = torch.empty(*v.shape[:2], n, dv, dtype=v.dtype, device=v.device)
    stats = torch.empty(4, bh, n, dtype=torch.float32, device=num.device)
    _linear_stats_kernel[lambda meta: (cdiv(n, meta["BLOCK_N"]), bh)](
        gradf, num, do, stats, *gradf.stride()[:3], v.shape[1], n, dv, float(eps), **_stats_tile(dv))
    return _backward(do, stats, q, k, v, log_alpha, log_beta, log_gamma, True, True)


def _backward(do, stats, q, k, v, log_alpha, log_beta, log_gamma, paper: bool, linear: bool):
    """The two backward passes for ``dO`` ``do`` (``v``'s dtype) and the fp32 ``(4, B*heads, N)``
    statistics ``stats`` -> ``[dq, dk, dv, dlog_alpha, dlog_beta(, dlog_gamma)]``."""
    decays = cumulative_decays(log_alpha, log_beta, log_gamma)
    (frames, height, width), consts = _launch_sizes(q, v, log_gamma, backward=True)
    bsz, heads, d, dv = q.shape[0], q.shape[1], q.shape[-1], v.shape[-1]
    qf, kf, vf, dof = _flat(q), _flat(k), _flat(v), _flat(do)
    n = qf.shape[2]
    dq = torch.empty(bsz, heads, n, d, dtype=q.dtype, device=q.device)
    dk = torch.empty(bsz, heads, n, d, dtype=k.dtype, device=q.device)
    dvv = torch.empty(bsz, heads, n, dv, dtype=v.dtype, device=q.device)
    slots = 2 + cdiv(width, consts["COLS"])  # each pass's: own tokens, 3-D atomic terms, column blocks
    dg = torch.zeros(2 * slots, 3, bsz * heads, n, dtype=torch.float32, device=q.device)
    grid = lambda meta: (_tiles(meta, frames, height, width, consts["COLS"]), bsz * heads)  # noqa: E731
    strides = (*qf.stride()[:3], *kf.stride()[:3], *vf.stride()[:3], *dof.stride()[:3])
    sizes = (heads, frames, height, width, d, dv)
    forms = dict(PAPER=paper, LINEAR=linear)
    _bwd_dkdv_kernel[grid](qf, kf, vf, dof, *decays, dg[:slots], stats, dk, dvv, *strides, *sizes, **forms, **consts)
    _bwd_dq_kernel[grid](qf, kf, vf, dof, *decays, dg[slots:], stats, dq, *strides, *sizes, **forms, **consts)
    return [dq.view(q.shape), dk.view(k.shape), dvv.view(v.shape), *decay_gradients(dg, log_alpha, log_gamma)]


INPUT_POINTERS = ("Q", "K", "V", "O", "DO", "DK", "DV_PTR", "DQ")  # in the inputs' dtype; the other pointers fp32
FP32_POINTERS = ("Ga", "Gb", "Gc", "O1", "LSE", "DG", "STATS")


def offered(configs, head: int, linear: bool = False, cols: int = 16) -> list[triton.Config]:
    """The configurations the resource table has rows for at the head-dim block ``head`` and tile
    width ``cols``: fixed tiles of 1,024 to 4,096 ``BLOCK x head`` elements (32 to 128 tokens up to
    head dim 32, 16 to 64 at 64, 16 and 32 at 128: the larger spilled, the smaller only move more
    loop tiles) and at least one row, and loop tiles of at most 2,048 ``LROWS x cols x head``
    elements (several rows only up to head dim 64). 16-token tiles also up to head dim 32 where
    the loop tiles have several rows (16 x 64 tiles), and in the linear kind's kernels
    (``linear``): on 3-D grids every larger tile of its ``dq`` pass spilled on sm_80 (16-80 bytes)."""
    def smallest(config):
        return 512 if linear or config.kwargs["LROWS"] > 1 else 1024
    return [c for c in configs if smallest(c) <= c.kwargs["BLOCK"] * head <= 4096 and c.kwargs["BLOCK"] >= cols
            and c.kwargs["LROWS"] * cols * head <= 2048]


def compile_cases() -> list[tuning.CompileCase]:
    """The three kernels (forward, ``dk``/``dv`` pass, ``dq`` pass) for fp32, fp16 and bf16, 2-D and
    3-D grids, both forms and the linear kind, the head-dim blocks of
    :data:`HEAD_BLOCKS`, every tile width :func:`columns` gives and the configurations
    :func:`offered` keeps; the two statistics kernels for the same dtypes and channel blocks of 16
    and up (``tools/kernel_resources.py``). fp16 rows take bf16's numbers (``same_as``: the same
    layouts)."""
    cases = []
    forms = {"official": dict(PAPER=False), "paper": dict(PAPER=True), "linear": dict(PAPER=True)}
    for kernel, dtype, is_3d, form, head in itertools.product(
            (_fwd_kernel, _bwd_dkdv_kernel, _bwd_dq_kernel), ("fp32", "fp16", "bf16"), (False, True), forms,
            HEAD_BLOCKS):
        types = {name: f"*{dtype}" for name in INPUT_POINTERS}
        types.update({name: "*fp32" for name in FP32_POINTERS}, EPS="fp32")
        for cols in BWD_COLS if kernel is not _fwd_kernel or dtype == "fp32" or head > 32 else FWD_COLS:
            constexprs = dict(IS_3D=is_3d, **forms[form], LINEAR=form == "linear", PRECISION=precision(dtype),
                              COLS=cols, BLOCK_D=head, BLOCK_DV=head)
            keep = offered(kernel.tuning.configs, head, form == "linear", cols)
            for case, config in zip(tuning.cases_of(kernel, tuning.signature(kernel, types), constexprs),
                                    kernel.tuning.configs):
                if config in keep:
                    bf16 = case.name.replace(" | fp16 ", " | bf16 ", 1) if dtype == "fp16" else None
                    cases.append(dataclasses.replace(case, same_as=bf16))
    for dtype, block in itertools.product(("fp32", "fp16", "bf16"), (16, *HEAD_BLOCKS)):
        twin = dtype == "fp16"
        for paper in (False, True):
            types = dict(DO=f"*{dtype}", O=f"*{dtype}", O1="*fp32", LSE="*fp32", STATS="*fp32")
            cases += tuning.cases_of(_softmax_stats_kernel, tuning.signature(_softmax_stats_kernel, types),
                                     dict(PAPER=paper, **_stats_tile(block)), fp16_as_bf16=twin)
        types = dict(GRAD=f"*{dtype}", NUM="*fp32", DO=f"*{dtype}", STATS="*fp32")
        signature = {**tuning.signature(_linear_stats_kernel, types), "eps": "fp32"}
        cases += tuning.cases_of(_linear_stats_kernel, signature, _stats_tile(block), fp16_as_bf16=twin)
    return cases
