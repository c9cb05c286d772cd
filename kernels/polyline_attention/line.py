"""Triton kernels of the criss-cross kind on lines longer than :data:`.whole_line.MAX_LINE` tokens:
tiles of a line, read and written in place.

The tensors, their strides, the weights of a line and the ``accumulate`` flags are those of
:mod:`.whole_line`, and :func:`apply_fwd` and :func:`apply_bwd` take the same arguments as its
own. A line is cut into tiles of ``BLOCK_M`` query and ``BLOCK_N`` key tokens (autotuned). A
tile's cumulative decay sums ``G`` are the earlier tiles' total plus its own cumulative sum, in
registers: no ``G`` tensor, no layout copies.

- Forward: one program per query tile and line, one pass over the key tiles with an online
  softmax (FlashAttention-2's).
- Backward, two launches and no atomics (FlashAttention-2's split of the passes):
  - query pass, one program per query tile and line: the tile's log-sum-exp and
    ``delta = rowsum(A * dA)`` in one online pass over the key tiles, then ``dq`` (written or
    added to) and the query tokens' terms of ``dG`` in a second. The last three go to fp32
    scratch tensors like the log-decays.
  - key pass, one program per line, its key tiles last first: ``dk``, ``dy`` and the key tokens'
    terms of ``dG`` over every query tile. With the query terms from the scratch, the log-decay
    gradient is ``-`` the reverse cumulative sum of ``dG`` along the line, carried from tile to
    tile.
"""
from __future__ import annotations

import itertools
import math

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.strided import cdiv
from .launch import channel_blocks, head_bucket, precision
from .vanilla import _sign
from .whole_line import _load_rows, _store_rows, _strides, _tokens

# The resource table's head-dim blocks: head dims up to 32 count as 32; larger ones have no rows
# (their launches run the first configuration, untuned).
HEAD_BLOCKS = (32,)
# Tile sizes the autotuner chooses among (the first one alone under the interpreter), of those that
# spill the fewest register bytes on the launch's GPU by the resource table.
CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=2, num_stages=1),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=8, num_stages=1),
]


def _variant(args) -> str:
    """``'bf16 official d<=32'``: the resource table's name of a launch."""
    return f"{args['Q'][1:]} {'paper' if args['PAPER'] else 'official'} {head_bucket(args, HEAD_BLOCKS)}"


@triton.jit
def _increments(LD, line, start, n, inner, image_lines, BLOCK: tl.constexpr):
    """``-log_decay`` of tokens ``start`` to ``start + BLOCK`` of ``line``, the steps of ``G``
    (``0`` at the line's first token, whose decay no weight reads, and past its end)."""
    pair, g, ok, j = _tokens(line, start, n, inner, image_lines, BLOCK)
    return -tl.load(LD + pair * n * image_lines + g, mask=ok & (j > 0), other=0.0)


@triton.jit
def _cumulative(LD, line, start, n, inner, image_lines, BLOCK: tl.constexpr):
    """``G`` of tokens ``start`` (a multiple of ``BLOCK``) to ``start + BLOCK`` of ``line``."""
    before = 0.0
    for s in range(0, start, BLOCK):
        before += tl.sum(_increments(LD, line, s, n, inner, image_lines, BLOCK), 0)
    return before + tl.cumsum(_increments(LD, line, start, n, inner, image_lines, BLOCK), 0)


@triton.jit
def _logits(q, k, g_q, g_k, k_ok, PAPER: tl.constexpr, PRECISION: tl.constexpr):
    """``(s, log_mask)`` of a query tile and a key tile, fp32: the logits (``q k^T``, plus the log
    mask in the official form; ``-inf`` past the line's end) and ``-|G_j - G_l|``."""
    log_mask = -tl.abs(g_q[:, None] - g_k[None, :])
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if not PAPER:
        s += log_mask
    return tl.where(k_ok[None, :], s, float("-inf")), log_mask


@triton.jit
def _key_tile(K, Y, LD, q, g_q, g_before, line, pair, k_start, n, inner, image_lines, heads, D, DV,
              skb, skh, skt, syb, syh, syt, PAPER: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The key tile at ``k_start`` against the query tile ``q`` (its ``G``: ``g_q``), ``g_before``
    the ``G`` before the key tile: ``(k, y, kj, s, log_mask, g_after)``, its keys, inputs and
    positions, the :func:`_logits`, and the ``G`` before the next tile."""
    _, gk, k_ok, kj = _tokens(line, k_start, n, inner, image_lines, BLOCK_N)
    k = _load_rows(K, pair, gk, k_ok, heads, skb, skh, skt, D, BLOCK_D)
    y = _load_rows(Y, pair, gk, k_ok, heads, syb, syh, syt, DV, BLOCK_DV)
    steps = _increments(LD, line, k_start, n, inner, image_lines, BLOCK_N)
    s, log_mask = _logits(q, k, g_q, g_before + tl.cumsum(steps, 0), k_ok, PAPER, PRECISION)
    return k, y, kj, s, log_mask, g_before + tl.sum(steps, 0)


@triton.jit
def _online_softmax(s, log_mask, m, l, PAPER: tl.constexpr):
    """One key tile of an online softmax: ``(w, rescale, m, l)``, the tile's weights
    ``exp(s - m)`` by the new running max ``m`` (times the mask in the paper form), the factor of
    the sums so far, and the new running max and sum of ``exp(s - m)``."""
    m_new = tl.maximum(m, tl.max(s, 1))
    rescale = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l = l * rescale + tl.sum(p, 1)
    if PAPER:
        p *= tl.exp(log_mask)
    return p, rescale, m_new, l


@triton.jit
def _logit_grads(s, log_mask, da, lse, delta, PAPER: tl.constexpr):
    """``(A, dS, d log_mask)`` of a tile from its logits, log mask and ``dA``, and its query rows'
    log-sum-exp and ``delta``."""
    p = tl.exp(s - lse[:, None])
    if PAPER:
        e = tl.exp(log_mask)
        a = p * e
        return a, p * (da * e - delta[:, None]), da * a
    ds = p * (da - delta[:, None])
    return p, ds, ds


@tuning.autotune(CONFIGS, key=["n"], variant=_variant, spill_free=True, restore_value=["O"])
@triton.jit(do_not_specialize=["n"])
def _line_fwd_kernel(Q, K, Y, LD, O, n, inner, image_lines, heads, D, DV,
                     sqb, sqh, sqt, skb, skh, skt, syb, syh, syt, scale, accumulate,
                     PAPER: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``O = scale * A y``, or ``O += scale * A y`` when ``accumulate``, on the program's query
    tile (``O`` contiguous; ``s<t>b``, ``s<t>h``, ``s<t>t``: tensor ``t``'s batch, head, token strides)."""
    line, start = tl.program_id(0).to(tl.int64), tl.program_id(1) * BLOCK_M
    pair, gq, q_ok, _ = _tokens(line, start, n, inner, image_lines, BLOCK_M)
    q = _load_rows(Q, pair, gq, q_ok, heads, sqb, sqh, sqt, D, BLOCK_D)
    g_q = _cumulative(LD, line, start, n, inner, image_lines, BLOCK_M)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    g_before = 0.0
    for k_start in range(0, n, BLOCK_N):
        _, y, _, s, log_mask, g_before = _key_tile(K, Y, LD, q, g_q, g_before, line, pair, k_start, n, inner,
                                                   image_lines, heads, D, DV, skb, skh, skt, syb, syh, syt, PAPER,
                                                   PRECISION, BLOCK_N, BLOCK_D, BLOCK_DV)
        w, rescale, m, l = _online_softmax(s, log_mask, m, l, PAPER)
        acc = acc * rescale[:, None] + tl.dot(w.to(y.dtype), y, input_precision=PRECISION)
    _store_rows(O, pair, gq, q_ok, n * image_lines, DV, acc / l[:, None] * scale, accumulate, BLOCK_DV)


@tuning.autotune(CONFIGS, key=["n"], variant=_variant, spill_free=True, restore_value=["DQ"])
@triton.jit(do_not_specialize=["n"])
def _line_bwd_query_kernel(Q, K, Y, LD, DO, DQ, LSE, DELTA, DGQ, n, inner, image_lines, heads, D, DV,
                           sqb, sqh, sqt, skb, skh, skt, syb, syh, syt, sob, soh, sot, scale, accumulate_qk,
                           PAPER: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The query pass of the backward of ``O = A y`` for ``dO = scale * DO``: ``DQ`` (fp32,
    contiguous, written or added to by ``accumulate_qk``), and the query tile's log-sum-exps,
    deltas and terms of ``dG`` into ``LSE``, ``DELTA``, ``DGQ`` (fp32, like the log-decays)."""
    line, start = tl.program_id(0).to(tl.int64), tl.program_id(1) * BLOCK_M
    N = n * image_lines
    pair, gq, q_ok, qj = _tokens(line, start, n, inner, image_lines, BLOCK_M)
    q = _load_rows(Q, pair, gq, q_ok, heads, sqb, sqh, sqt, D, BLOCK_D)
    do = _load_rows(DO, pair, gq, q_ok, heads, sob, soh, sot, DV, BLOCK_DV).to(tl.float32) * scale
    do = do.to(Y.dtype.element_ty)
    g_q = _cumulative(LD, line, start, n, inner, image_lines, BLOCK_M)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    u = tl.zeros((BLOCK_M,), tl.float32)  # rowsum(A * dA), times l
    g_before = 0.0
    for k_start in range(0, n, BLOCK_N):
        _, y, _, s, log_mask, g_before = _key_tile(K, Y, LD, q, g_q, g_before, line, pair, k_start, n, inner,
                                                   image_lines, heads, D, DV, skb, skh, skt, syb, syh, syt, PAPER,
                                                   PRECISION, BLOCK_N, BLOCK_D, BLOCK_DV)
        w, rescale, m, l = _online_softmax(s, log_mask, m, l, PAPER)
        u = u * rescale + tl.sum(w * tl.dot(do, tl.trans(y), input_precision=PRECISION), 1)
    lse, delta = m + tl.log(l), u / l
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    dg = tl.zeros((BLOCK_M,), tl.float32)
    g_before = 0.0
    for k_start in range(0, n, BLOCK_N):
        k, y, kj, s, log_mask, g_before = _key_tile(K, Y, LD, q, g_q, g_before, line, pair, k_start, n, inner,
                                                    image_lines, heads, D, DV, skb, skh, skt, syb, syh, syt, PAPER,
                                                    PRECISION, BLOCK_N, BLOCK_D, BLOCK_DV)
        da = tl.dot(do, tl.trans(y), input_precision=PRECISION)
        _, ds, d_log_mask = _logit_grads(s, log_mask, da, lse, delta, PAPER)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        # -|G_j - G_l| = -sign(j - l) (G_j - G_l) with G non-decreasing
        dg -= tl.sum(d_log_mask * _sign(qj[:, None] - kj[None, :]), 1)
    _store_rows(DQ, pair, gq, q_ok, N, D, dq, accumulate_qk, BLOCK_D)
    tl.store(LSE + pair * N + gq, lse, mask=q_ok)
    tl.store(DELTA + pair * N + gq, delta, mask=q_ok)
    tl.store(DGQ + pair * N + gq, dg, mask=q_ok)


@tuning.autotune(CONFIGS, key=["n"], variant=_variant, spill_free=True, restore_value=["DK", "DY", "DLD"])
@triton.jit(do_not_specialize=["n"])
def _line_bwd_key_kernel(Q, K, Y, LD, DO, LSE, DELTA, DGQ, DK, DY, DLD, n, inner, image_lines, heads, D, DV,
                         sqb, sqh, sqt, skb, skh, skt, syb, syh, syt, sob, soh, sot, scale,
                         accumulate_qk, accumulate_y, accumulate_decay,
                         PAPER: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The key pass, after the query pass: ``DK`` (fp32), ``DY`` (``y``'s dtype) and ``DLD`` (fp32),
    all contiguous, written or added to by the ``accumulate_*`` flags."""
    line = tl.program_id(0).to(tl.int64)
    N = n * image_lines
    last = (n - 1) // BLOCK_N * BLOCK_N
    dg_after = 0.0  # dG summed over the later tiles
    for tile in range(0, tl.cdiv(n, BLOCK_N)):
        k_start = last - tile * BLOCK_N
        pair, gk, k_ok, kj = _tokens(line, k_start, n, inner, image_lines, BLOCK_N)
        k = _load_rows(K, pair, gk, k_ok, heads, skb, skh, skt, D, BLOCK_D)
        y = _load_rows(Y, pair, gk, k_ok, heads, syb, syh, syt, DV, BLOCK_DV)
        g_k = _cumulative(LD, line, k_start, n, inner, image_lines, BLOCK_N)
        dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        dy = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)
        dg = tl.load(DGQ + pair * N + gk, mask=k_ok, other=0.0)
        g_before = 0.0
        for q_start in range(0, n, BLOCK_M):
            _, gq, q_ok, qj = _tokens(line, q_start, n, inner, image_lines, BLOCK_M)
            q = _load_rows(Q, pair, gq, q_ok, heads, sqb, sqh, sqt, D, BLOCK_D)
            do = _load_rows(DO, pair, gq, q_ok, heads, sob, soh, sot, DV, BLOCK_DV).to(tl.float32) * scale
            do = do.to(y.dtype)
            steps = _increments(LD, line, q_start, n, inner, image_lines, BLOCK_M)
            s, log_mask = _logits(q, k, g_before + tl.cumsum(steps, 0), g_k, k_ok, PAPER, PRECISION)
            g_before += tl.sum(steps, 0)
            lse = tl.load(LSE + pair * N + gq, mask=q_ok, other=float("inf"))  # no weight past the end
            delta = tl.load(DELTA + pair * N + gq, mask=q_ok, other=0.0)
            da = tl.dot(do, tl.trans(y), input_precision=PRECISION)
            a, ds, d_log_mask = _logit_grads(s, log_mask, da, lse, delta, PAPER)
            dy += tl.dot(tl.trans(a.to(y.dtype)), do, input_precision=PRECISION)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
            dg += tl.sum(d_log_mask * _sign(qj[:, None] - kj[None, :]), 0)
        _store_rows(DK, pair, gk, k_ok, N, D, dk, accumulate_qk, BLOCK_D)
        _store_rows(DY, pair, gk, k_ok, N, DV, dy, accumulate_y, BLOCK_DV)
        dld = tl.where(kj > 0, -(tl.cumsum(dg, 0, reverse=True) + dg_after), 0.0)  # -sum_{m >= p} dG_m
        dg_after += tl.sum(dg, 0)
        if accumulate_decay:
            dld += tl.load(DLD + pair * N + gk, mask=k_ok, other=0.0)
        tl.store(DLD + pair * N + gk, dld, mask=k_ok)


def _launch(q, v, n, form):
    """``(lines, sizes, constexprs)`` of an application along an axis of ``n`` tokens."""
    consts = dict(PAPER=form == "paper", PRECISION=precision(q.dtype), **channel_blocks(q.shape[-1], v.shape[-1]))
    image_lines = math.prod(q.shape[2:-1]) // n
    return q.shape[0] * q.shape[1] * image_lines, (n, image_lines, q.shape[1], q.shape[-1], v.shape[-1]), consts


def apply_fwd(q, k, y, log_decay, out, n, inner, form, scale=1.0, accumulate=False):
    """:func:`.whole_line.apply_fwd` on lines of any length."""
    lines, (n, image_lines, *sizes), consts = _launch(q, y, n, form)
    _line_fwd_kernel[lambda meta: (lines, cdiv(n, meta["BLOCK_M"]))](
        q, k, y, log_decay, out, n, inner, image_lines, *sizes, *_strides(q, k, y), float(scale), int(accumulate),
        **consts)


def apply_bwd(q, k, y, log_decay, grad, dq, dk, dy, dlog_decay, n, inner, form, scale=1.0,
              accumulate_qk=False, accumulate_y=False, accumulate_decay=False):
    """:func:`.whole_line.apply_bwd` on lines of any length: the query pass, then the key pass."""
    lines, (n, image_lines, *sizes), consts = _launch(q, y, n, form)
    lse, delta, dg_query = (torch.empty(log_decay.shape, dtype=torch.float32, device=q.device) for _ in range(3))
    strides = _strides(q, k, y, grad)
    _line_bwd_query_kernel[lambda meta: (lines, cdiv(n, meta["BLOCK_M"]))](
        q, k, y, log_decay, grad, dq, lse, delta, dg_query, n, inner, image_lines, *sizes, *strides, float(scale),
        int(accumulate_qk), **consts)
    _line_bwd_key_kernel[(lines,)](
        q, k, y, log_decay, grad, lse, delta, dg_query, dk, dy, dlog_decay, n, inner, image_lines, *sizes, *strides,
        float(scale), int(accumulate_qk), int(accumulate_y), int(accumulate_decay), **consts)


def compile_cases() -> list[tuning.CompileCase]:
    """Every configuration of the three kernels for fp32 and bf16 (fp16 takes bf16's rows), both
    forms and the head-dim blocks of :data:`HEAD_BLOCKS` (``tools/kernel_resources.py``)."""
    cases = []
    for kernel, dtype, paper, head in itertools.product(
            (_line_fwd_kernel, _line_bwd_query_kernel, _line_bwd_key_kernel), ("fp32", "fp16", "bf16"),
            (False, True), HEAD_BLOCKS):
        pointers = {name: f"*{dtype}" for name in ("Q", "K", "Y", "O", "DO", "DY")}
        pointers.update({name: "*fp32" for name in ("LD", "DQ", "DK", "DLD", "LSE", "DELTA", "DGQ")}, scale="fp32")
        constexprs = dict(PAPER=paper, PRECISION=precision(dtype), BLOCK_D=head, BLOCK_DV=head)
        cases += tuning.cases_of(kernel, tuning.signature(kernel, pointers), constexprs, fp16_as_bf16=True)
    return cases
