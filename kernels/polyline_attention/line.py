"""Triton kernels of the 1-D masked line attention, the step of the criss-cross kind.

Layout: contiguous ``(lines, n, C)`` tensors (the launchers of :mod:`.criss_cross` move a grid axis
next to the channels); ``G`` fp32 ``(lines, n)``: the cumulative sum of the negated log-decay
along the line. Weights among the tokens ``j`` (query) and ``l`` (key) of one line, with the
log mask ``-|G_j - G_l|``: ``form='official'`` ``softmax(q k^T + log_mask)``, ``form='paper'``
``softmax(q k^T) * exp(log_mask)``; the output is the weights times ``y``.

Forward: one program per query tile and line, one pass over the key tiles with an online
softmax; it writes the log-sum-exp for the backward. Backward: one program per key tile and line;
``dk``, ``dy`` and the key's decay terms accumulate in registers, ``dq`` and the query's terms are
added atomically; ``dq``, ``dk`` and ``dG`` are fp32 buffers shared by every application of the
same axis (added to, never overwritten).
"""
from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from ..common import tuning
from .launch import channel_blocks, head_bucket, precision
from .vanilla import _sign

# Tile sizes the autotuner chooses among (the first one alone under the interpreter), of those that
# spill the fewest register bytes on the launch's GPU by the resource table (``spill_free``: the
# 64 x 64 tiles on 4 warps spill in the backward and in fp32 on sm_80/sm_90; the 32 x 32 ones and
# the 16 x 16 ones nowhere there; on 8 warps with every register, the 64 x 64 backward in bf16 on
# sm_90 neither).
# The resource table's head-dim blocks: head dims up to 32 count as 32; larger ones have no rows
# (their launches run the first configuration, untuned).
HEAD_BLOCKS = (32,)
CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=2, num_stages=1),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=8, num_stages=1, maxnreg=255),
]


def _variant(args) -> str:
    """``'fp16 official d<=32'``: the resource table's name of a launch."""
    return f"{args['Q'][1:]} {'paper' if args['PAPER'] else 'official'} {head_bucket(args, HEAD_BLOCKS)}"


@tuning.autotune(CONFIGS, key=["n"], variant=_variant, spill_free=True)
@triton.jit(do_not_specialize=["n"])
def _line_fwd_kernel(Q, K, Y, G, O, LSE, n, D, DV,
                     PAPER: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    line = tl.program_id(1).to(tl.int64)
    c = tl.arange(0, BLOCK_D)
    cv = tl.arange(0, BLOCK_DV)
    qj = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    q_ok = qj < n
    q = tl.load(Q + (line * n + qj[:, None]) * D + c[None, :], mask=q_ok[:, None] & (c[None, :] < D), other=0.0)
    g_q = tl.load(G + line * n + qj, mask=q_ok, other=0.0)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    for start in range(0, n, BLOCK_N):
        kj = start + tl.arange(0, BLOCK_N)
        k_ok = kj < n
        k = tl.load(K + (line * n + kj[:, None]) * D + c[None, :], mask=k_ok[:, None] & (c[None, :] < D), other=0.0)
        y = tl.load(Y + (line * n + kj[:, None]) * DV + cv[None, :], mask=k_ok[:, None] & (cv[None, :] < DV),
                    other=0.0)
        g_k = tl.load(G + line * n + kj, mask=k_ok, other=0.0)
        log_mask = -tl.abs(g_q[:, None] - g_k[None, :])
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if not PAPER:
            s += log_mask
        s = tl.where(k_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        scale = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * scale + tl.sum(p, 1)
        if PAPER:
            p *= tl.exp(log_mask)
        acc = acc * scale[:, None] + tl.dot(p.to(y.dtype), y, input_precision=PRECISION)
        m = m_new
    tl.store(O + (line * n + qj[:, None]) * DV + cv[None, :], (acc / l[:, None]).to(O.dtype.element_ty),
             mask=q_ok[:, None] & (cv[None, :] < DV))
    tl.store(LSE + line * n + qj, m + tl.log(l), mask=q_ok)


# DQ, DK and DG are shared by every application of an axis: timing runs must leave them as they were.
@tuning.autotune(CONFIGS, key=["n"], variant=_variant, spill_free=True, restore_value=["DQ", "DK", "DG"])
@triton.jit(do_not_specialize=["n"])
def _line_bwd_kernel(Q, K, Y, G, DO, LSE, DELTA, DQ, DK, DY, DG, n, D, DV,
                     PAPER: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``DELTA``: ``rowsum(dO * O)`` fp32 ``(lines, n)``; ``DQ``, ``DK``, ``DG`` fp32, added to;
    ``DY`` written, in ``Y``'s dtype."""
    line = tl.program_id(1).to(tl.int64)
    c = tl.arange(0, BLOCK_D)
    cv = tl.arange(0, BLOCK_DV)
    kj = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_ok = kj < n
    k_mask = k_ok[:, None] & (c[None, :] < D)
    y_mask = k_ok[:, None] & (cv[None, :] < DV)
    k = tl.load(K + (line * n + kj[:, None]) * D + c[None, :], mask=k_mask, other=0.0)
    y = tl.load(Y + (line * n + kj[:, None]) * DV + cv[None, :], mask=y_mask, other=0.0)
    g_k = tl.load(G + line * n + kj, mask=k_ok, other=0.0)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dy = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)
    dg_k = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(0, n, BLOCK_M):
        qj = start + tl.arange(0, BLOCK_M)
        q_ok = qj < n
        q = tl.load(Q + (line * n + qj[:, None]) * D + c[None, :], mask=q_ok[:, None] & (c[None, :] < D), other=0.0)
        do = tl.load(DO + (line * n + qj[:, None]) * DV + cv[None, :], mask=q_ok[:, None] & (cv[None, :] < DV),
                     other=0.0)
        g_q = tl.load(G + line * n + qj, mask=q_ok, other=0.0)
        lse = tl.load(LSE + line * n + qj, mask=q_ok, other=0.0)
        delta = tl.load(DELTA + line * n + qj, mask=q_ok, other=0.0)
        ok = q_ok[:, None] & k_ok[None, :]
        log_mask = -tl.abs(g_q[:, None] - g_k[None, :])
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        dp = tl.dot(do, tl.trans(y), input_precision=PRECISION)
        if PAPER:
            p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
            e = tl.exp(log_mask)
            dy += tl.dot(tl.trans((p * e).to(do.dtype)), do, input_precision=PRECISION)
            ds = p * (dp * e - delta[:, None])
            g = dp * p * e
        else:
            p = tl.where(ok, tl.exp(s + log_mask - lse[:, None]), 0.0)
            dy += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            g = ds
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        dq = tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        tl.atomic_add(DQ + (line * n + qj[:, None]) * D + c[None, :], dq, mask=q_ok[:, None] & (c[None, :] < D),
                      sem="relaxed")
        g = g * _sign(qj[:, None] - kj[None, :])  # d(-|G_j - G_l|) = -sign(j - l) dG_j + sign(j - l) dG_l
        tl.atomic_add(DG + line * n + qj, -tl.sum(g, 1), mask=q_ok, sem="relaxed")
        dg_k += tl.sum(g, 0)
    tl.atomic_add(DG + line * n + kj, dg_k, mask=k_ok, sem="relaxed")
    tl.atomic_add(DK + (line * n + kj[:, None]) * D + c[None, :], dk, mask=k_mask, sem="relaxed")
    tl.store(DY + (line * n + kj[:, None]) * DV + cv[None, :], dy.to(DY.dtype.element_ty), mask=y_mask)


def _launch_args(q, y, tile: str):
    """``(grid, sizes, constexprs)``; the grid has one program per ``tile`` (``'BLOCK_M'``: query
    tiles, ``'BLOCK_N'``: key tiles) and line."""
    lines, n, d = q.shape
    consts = dict(PRECISION=precision(q.dtype), **channel_blocks(d, y.shape[-1]))
    return lambda meta: (triton.cdiv(n, meta[tile]), lines), (n, d, y.shape[-1]), consts


def line_attention_fwd(q, k, y, g, form):
    """``(out, lse)``: the line attention of ``y`` (``(lines, n, dv)``, contiguous) with
    ``q``, ``k`` ``(lines, n, d)`` and ``g`` fp32 ``(lines, n)``; ``out`` in ``y.dtype``, ``lse``
    fp32 ``(lines, n)``."""
    grid, sizes, consts = _launch_args(q, y, "BLOCK_M")
    out = torch.empty_like(y)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    _line_fwd_kernel[grid](q, k, y, g, out, lse, *sizes, PAPER=form == "paper", **consts)
    return out, lse


def line_attention_bwd(grad, q, k, y, g, out, lse, dq, dk, dg, form):
    """Backward of :func:`line_attention_fwd` for the output gradient ``grad`` (like ``y``): adds
    into the fp32 buffers ``dq``, ``dk`` (like ``q``) and ``dg`` (like ``g``) and returns ``dy``."""
    grid, sizes, consts = _launch_args(q, y, "BLOCK_N")
    delta = (grad.float() * out.float()).sum(-1)
    dy = torch.empty_like(y)
    _line_bwd_kernel[grid](q, k, y, g, grad, lse, delta, dq, dk, dy, dg, *sizes, PAPER=form == "paper", **consts)
    return dy


def compile_cases() -> list[tuning.CompileCase]:
    """Every configuration of both kernels for fp32, fp16 and bf16, both forms and the head-dim
    blocks of :data:`HEAD_BLOCKS` (``tools/kernel_resources.py``)."""
    cases = []
    for kernel, dtype, paper, head in itertools.product(
            (_line_fwd_kernel, _line_bwd_kernel), ("fp32", "fp16", "bf16"), (False, True), HEAD_BLOCKS):
        pointers = {name: f"*{dtype}" for name in ("Q", "K", "Y", "O", "DO", "DY")}
        pointers.update({name: "*fp32" for name in ("G", "LSE", "DELTA", "DQ", "DK", "DG")})
        constexprs = dict(PAPER=paper, PRECISION=precision(dtype), BLOCK_D=head, BLOCK_DV=head)
        cases += tuning.cases_of(kernel, tuning.signature(kernel, pointers), constexprs)
    return cases
