"""Triton kernels of the vanilla polyline masked attention, forward and backward, no ``N x N``.

Layout: ``q``, ``k`` ``(B, heads, N, d)``, ``v`` ``(B, heads, N, dv)`` (any strides, channels
contiguous), ``N = T*H*W`` tokens in raster order (``T = 1`` on a 2-D grid). The decays enter as
their cumulative sums, fp32 ``(B*heads, N)``: ``Ga`` = cumsum of ``-log_alpha`` along W, ``Gb``
of ``-log_beta`` along H, ``Gc`` of ``-log_gamma`` along T. The V2H log mask from key
``(s, k, l)`` to query ``(t, i, j)`` (its path runs along T, then H, then W) is
``-|Ga[t,i,j] - Ga[t,i,l]| - |Gb[t,i,l] - Gb[t,k,l]| - |Gc[t,k,l] - Gc[s,k,l]|``; the H2V mask
swaps query and key. Each tile gathers the "corner" entries ``(t,i,l)``, ``(t,k,l)``.

Forward (one program per query tile and ``(B, head)``, one pass over the key tiles, ``QK^T``
once): ``form='official'`` keeps two online softmaxes (logits plus the V2H / H2V log mask) and
two accumulators, ``out = 0.5 * (O_v2h + O_h2v)``; ``form='paper'`` keeps one softmax of the
logits and applies ``exp(V2H) + exp(H2V)`` to its probabilities. Besides ``out`` it writes the
residuals of the backward: each softmax's log-sum-exp and, for the official form, ``O_v2h`` (fp32;
``O_h2v = 2 out - O_v2h``).

Backward (one program per key tile and ``(B, head)``, a pass over the query tiles): the
launcher forms ``D = rowsum(dO * O)`` per softmax from the residuals (no forward kernel runs
again); the probabilities are recomputed from the saved log-sum-exps; ``dk``, ``dv`` and the key's own decay
terms accumulate in registers, ``dq``, the query's own terms and the corner terms are added
atomically into fp32 buffers. The launcher turns ``dGa``, ``dGb``, ``dGc`` into decay gradients
with reverse cumulative sums.
"""
from __future__ import annotations

import itertools
import math

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.strided import pow2

# Tile sizes the autotuner chooses among (the first one alone under the interpreter, whose cost
# grows with the tile area); docs/benchmarks.md has each one's shared memory per architecture.
CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=2, num_stages=1),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=8, num_stages=2),
]
# The resource table's channel blocks: head dims up to 32 count as 32; larger ones have no rows
# (their launches run the first configuration, untuned).
HEAD_BLOCKS = (32,)


def _variant(args) -> str:
    """``'fp16 3d official d<=32'``: the resource table's name of a launch (:mod:`..common.tuning`)."""
    head = tuning.bucket(max(args["BLOCK_D"], args["BLOCK_DV"]), HEAD_BLOCKS)
    return f"{args['Q'][1:]} {'3d' if args['IS_3D'] else '2d'} {'paper' if args['PAPER'] else 'official'} d{head}"


@triton.jit
def _sign(x):
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))


@triton.jit
def _tokens(start, N, HW, W, BLOCK: tl.constexpr):
    """Token indices ``start + arange(BLOCK)`` with their validity and ``(t, i, j)`` coordinates."""
    n = start + tl.arange(0, BLOCK)
    ok = n < N
    r = n % HW
    return n, ok, n // HW, r // W, r % W


@triton.jit
def _log_mask(Ga, Gb, Gc, ga_to, gb_from, gc_from, to_t, to_i, fr_i, fr_j, HW, W, ok, IS_3D: tl.constexpr):
    """V2H log mask from tokens ``fr`` to tokens ``to`` (coordinates broadcast to the tile).

    ``ga_to``: ``Ga`` at ``to``; ``gb_from``, ``gc_from``: ``Gb``, ``Gc`` at ``fr``; ``Ga``, ``Gb``,
    ``Gc``: this ``(B, head)``'s rows, gathered at the corners ``(t_to, i_to, j_fr)`` and (3-D)
    ``(t_to, i_fr, j_fr)``.
    """
    corner = to_t * HW + to_i * W + fr_j
    mask = -tl.abs(ga_to - tl.load(Ga + corner, mask=ok, other=0.0))
    if IS_3D:
        corner_b = to_t * HW + fr_i * W + fr_j
        gb_b = tl.load(Gb + corner_b, mask=ok, other=0.0)
        mask -= tl.abs(tl.load(Gb + corner, mask=ok, other=0.0) - gb_b)
        mask -= tl.abs(tl.load(Gc + corner_b, mask=ok, other=0.0) - gc_from)
    else:
        mask -= tl.abs(tl.load(Gb + corner, mask=ok, other=0.0) - gb_from)
    return mask


@triton.jit
def _log_mask_grad(g, dGa, dGb, dGc, to_t, to_i, to_j, fr_t, fr_i, fr_j, HW, W, ok, IS_3D: tl.constexpr):
    """Backpropagate ``g = d loss / d log_mask`` (V2H from ``fr`` to ``to``, as :func:`_log_mask`).

    Adds the corner terms atomically; returns ``(ga, gb, gc)``: the caller adds ``-sum(ga)`` to
    ``dGa`` at ``to`` and ``sum(gb)`` (2-D) or ``sum(gc)`` (3-D) at ``fr``, summed over the other
    token of each pair. The signs come from the indices (``Ga`` grows along W, ...), so a pair
    with equal cumulative sums still gets the segment-sum gradient of the reference.
    """
    ga = g * _sign(to_j - fr_j)
    gb = g * _sign(to_i - fr_i)
    corner = to_t * HW + to_i * W + fr_j
    tl.atomic_add(dGa + corner, ga, mask=ok, sem="relaxed")
    tl.atomic_add(dGb + corner, -gb, mask=ok, sem="relaxed")
    gc = gb
    if IS_3D:
        gc = g * _sign(to_t - fr_t)
        corner_b = to_t * HW + fr_i * W + fr_j
        tl.atomic_add(dGb + corner_b, gb, mask=ok, sem="relaxed")
        tl.atomic_add(dGc + corner_b, -gc, mask=ok, sem="relaxed")
    return ga, gb, gc


@tuning.autotune(CONFIGS, key=["N"], variant=_variant)
@triton.jit(do_not_specialize=["N", "HW", "W"])
def _fwd_kernel(
    Q, K, V, Ga, Gb, Gc, O, O1, LSE,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
    heads, N, HW, W, D, DV,
    IS_3D: tl.constexpr, PAPER: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    row = bh.to(tl.int64) * N
    Ga += row
    Gb += row
    Gc += row
    c = tl.arange(0, BLOCK_D)
    cv = tl.arange(0, BLOCK_DV)
    qn, q_ok, qt, qi, qj = _tokens(tl.program_id(0) * BLOCK_M, N, HW, W, BLOCK_M)
    q = tl.load(Q + b * sq_b + h * sq_h + qn[:, None] * sq_n + c[None, :], mask=q_ok[:, None] & (c[None, :] < D),
                other=0.0)
    ga_q = tl.load(Ga + qn, mask=q_ok, other=0.0)[:, None]
    gb_q = tl.load(Gb + qn, mask=q_ok, other=0.0)[:, None]
    gc_q = tl.load(Gc + qn, mask=q_ok, other=0.0)[:, None] if IS_3D else gb_q
    qt, qi, qj = qt[:, None], qi[:, None], qj[:, None]
    m1 = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l1 = tl.zeros((BLOCK_M,), tl.float32)
    acc1 = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    m2 = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l2 = tl.zeros((BLOCK_M,), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    for start in range(0, N, BLOCK_N):
        kn, k_ok, kt, ki, kj = _tokens(start, N, HW, W, BLOCK_N)
        k = tl.load(K + b * sk_b + h * sk_h + kn[:, None] * sk_n + c[None, :], mask=k_ok[:, None] & (c[None, :] < D),
                    other=0.0)
        v = tl.load(V + b * sv_b + h * sv_h + kn[:, None] * sv_n + cv[None, :],
                    mask=k_ok[:, None] & (cv[None, :] < DV), other=0.0)
        ga_k = tl.load(Ga + kn, mask=k_ok, other=0.0)[None, :]
        gb_k = tl.load(Gb + kn, mask=k_ok, other=0.0)[None, :]
        gc_k = tl.load(Gc + kn, mask=k_ok, other=0.0)[None, :] if IS_3D else gb_k
        kt, ki, kj = kt[None, :], ki[None, :], kj[None, :]
        ok = q_ok[:, None] & k_ok[None, :]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        v2h = _log_mask(Ga, Gb, Gc, ga_q, gb_k, gc_k, qt, qi, ki, kj, HW, W, ok, IS_3D)
        h2v = _log_mask(Ga, Gb, Gc, ga_k, gb_q, gc_q, kt, ki, qi, qj, HW, W, ok, IS_3D)
        if PAPER:
            s = tl.where(k_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m1, tl.max(s, 1))
            scale = tl.exp(m1 - m_new)
            p = tl.exp(s - m_new[:, None])
            l1 = l1 * scale + tl.sum(p, 1)
            pm = p * (tl.exp(v2h) + tl.exp(h2v))
            acc1 = acc1 * scale[:, None] + tl.dot(pm.to(v.dtype), v, input_precision=PRECISION)
            m1 = m_new
        else:
            s1 = tl.where(k_ok[None, :], s + v2h, float("-inf"))
            m_new = tl.maximum(m1, tl.max(s1, 1))
            scale = tl.exp(m1 - m_new)
            p = tl.exp(s1 - m_new[:, None])
            l1 = l1 * scale + tl.sum(p, 1)
            acc1 = acc1 * scale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m1 = m_new
            s2 = tl.where(k_ok[None, :], s + h2v, float("-inf"))
            m_new = tl.maximum(m2, tl.max(s2, 1))
            scale = tl.exp(m2 - m_new)
            p = tl.exp(s2 - m_new[:, None])
            l2 = l2 * scale + tl.sum(p, 1)
            acc2 = acc2 * scale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m2 = m_new
    o1 = acc1 / l1[:, None]
    if PAPER:
        out = o1
    else:
        o2 = acc2 / l2[:, None]
        out = 0.5 * (o1 + o2)
    out_mask = q_ok[:, None] & (cv[None, :] < DV)
    o_off = b * so_b + h * so_h + qn[:, None] * so_n + cv[None, :]
    tl.store(O + o_off, out.to(O.dtype.element_ty), mask=out_mask)
    # residuals, (1 or 2, B*heads, N) log-sum-exps: the V2H (paper: the only) softmax's, then the H2V one's
    tl.store(LSE + row + qn, m1 + tl.log(l1), mask=q_ok)
    if not PAPER:
        tl.store(LSE + tl.num_programs(1).to(tl.int64) * N + row + qn, m2 + tl.log(l2), mask=q_ok)
        tl.store(O1 + o_off, o1, mask=out_mask)


@tuning.autotune(CONFIGS, key=["N"], variant=_variant, reset_to_zero=["DQ", "dGa", "dGb", "dGc"])
@triton.jit(do_not_specialize=["N", "HW", "W"])
def _bwd_kernel(
    Q, K, V, Ga, Gb, Gc, DO, STATS_PTR, DQ, DK, DV_PTR, dGa, dGb, dGc,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sdo_b, sdo_h, sdo_n,
    heads, N, HW, W, D, DV,
    IS_3D: tl.constexpr, PAPER: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    """``DQ`` fp32 ``(B*heads, N, d)``, ``DK``, ``DV_PTR`` ``(B*heads, N, d|dv)`` in the input
    dtypes, ``dGa``, ``dGb``, ``dGc`` fp32 ``(B*heads, N)``; ``DQ`` and ``dG*`` start at zero."""
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    row = bh.to(tl.int64) * N
    Ga += row
    Gb += row
    Gc += row
    dGa += row
    dGb += row
    dGc += row
    plane = tl.num_programs(1).to(tl.int64) * N
    c = tl.arange(0, BLOCK_D)
    cv = tl.arange(0, BLOCK_DV)
    kn, k_ok, kt, ki, kj = _tokens(tl.program_id(0) * BLOCK_N, N, HW, W, BLOCK_N)
    k_mask = k_ok[:, None] & (c[None, :] < D)
    v_mask = k_ok[:, None] & (cv[None, :] < DV)
    k = tl.load(K + b * sk_b + h * sk_h + kn[:, None] * sk_n + c[None, :], mask=k_mask, other=0.0)
    v = tl.load(V + b * sv_b + h * sv_h + kn[:, None] * sv_n + cv[None, :], mask=v_mask, other=0.0)
    ga_k = tl.load(Ga + kn, mask=k_ok, other=0.0)[None, :]
    gb_k = tl.load(Gb + kn, mask=k_ok, other=0.0)[None, :]
    gc_k = tl.load(Gc + kn, mask=k_ok, other=0.0)[None, :] if IS_3D else gb_k
    kt, ki, kj = kt[None, :], ki[None, :], kj[None, :]
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)
    dga_k = tl.zeros((BLOCK_N,), tl.float32)  # the key's own terms: dGa (H2V), dGb (2-D) or dGc (3-D), V2H
    dgx_k = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(0, N, BLOCK_M):
        qn, q_ok, qt, qi, qj = _tokens(start, N, HW, W, BLOCK_M)
        q = tl.load(Q + b * sq_b + h * sq_h + qn[:, None] * sq_n + c[None, :], mask=q_ok[:, None] & (c[None, :] < D),
                    other=0.0)
        do = tl.load(DO + b * sdo_b + h * sdo_h + qn[:, None] * sdo_n + cv[None, :],
                     mask=q_ok[:, None] & (cv[None, :] < DV), other=0.0)
        ga_q = tl.load(Ga + qn, mask=q_ok, other=0.0)[:, None]
        gb_q = tl.load(Gb + qn, mask=q_ok, other=0.0)[:, None]
        gc_q = tl.load(Gc + qn, mask=q_ok, other=0.0)[:, None] if IS_3D else gb_q
        lse1 = tl.load(STATS_PTR + row + qn, mask=q_ok, other=0.0)[:, None]
        d1 = tl.load(STATS_PTR + plane + row + qn, mask=q_ok, other=0.0)[:, None]
        qt, qi, qj = qt[:, None], qi[:, None], qj[:, None]
        ok = q_ok[:, None] & k_ok[None, :]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        v2h = _log_mask(Ga, Gb, Gc, ga_q, gb_k, gc_k, qt, qi, ki, kj, HW, W, ok, IS_3D)
        h2v = _log_mask(Ga, Gb, Gc, ga_k, gb_q, gc_q, kt, ki, qi, qj, HW, W, ok, IS_3D)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if PAPER:
            p = tl.where(ok, tl.exp(s - lse1), 0.0)
            e1 = tl.exp(v2h)
            e2 = tl.exp(h2v)
            pm = p * (e1 + e2)
            dv += tl.dot(tl.trans(pm.to(do.dtype)), do, input_precision=PRECISION)
            ds = p * (dp * (e1 + e2) - d1)
            g1 = dp * p * e1
            g2 = dp * p * e2
        else:
            lse2 = tl.load(STATS_PTR + 2 * plane + row + qn, mask=q_ok, other=0.0)[:, None]
            d2 = tl.load(STATS_PTR + 3 * plane + row + qn, mask=q_ok, other=0.0)[:, None]
            p1 = tl.where(ok, tl.exp(s + v2h - lse1), 0.0)
            p2 = tl.where(ok, tl.exp(s + h2v - lse2), 0.0)
            pm = 0.5 * (p1 + p2)
            dv += tl.dot(tl.trans(pm.to(do.dtype)), do, input_precision=PRECISION)
            g1 = p1 * (0.5 * dp - d1)
            g2 = p2 * (0.5 * dp - d2)
            ds = g1 + g2
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        dq = tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        tl.atomic_add(DQ + (row + qn[:, None]) * D + c[None, :], dq, mask=q_ok[:, None] & (c[None, :] < D),
                      sem="relaxed")
        # V2H: to = query, from = key; H2V: to = key, from = query.
        ga, gb, gc = _log_mask_grad(g1, dGa, dGb, dGc, qt, qi, qj, kt, ki, kj, HW, W, ok, IS_3D)
        dga_q = -tl.sum(ga, 1)
        dgx_k += tl.sum(gc, 0)
        ga, gb, gc = _log_mask_grad(g2, dGa, dGb, dGc, kt, ki, kj, qt, qi, qj, HW, W, ok, IS_3D)
        dga_k -= tl.sum(ga, 0)
        tl.atomic_add(dGa + qn, dga_q, mask=q_ok, sem="relaxed")
        tl.atomic_add((dGc if IS_3D else dGb) + qn, tl.sum(gc, 1), mask=q_ok, sem="relaxed")
    tl.atomic_add(dGa + kn, dga_k, mask=k_ok, sem="relaxed")
    tl.atomic_add((dGc if IS_3D else dGb) + kn, dgx_k, mask=k_ok, sem="relaxed")
    tl.store(DK + (row + kn[:, None]) * D + c[None, :], dk.to(DK.dtype.element_ty), mask=k_mask)
    tl.store(DV_PTR + (row + kn[:, None]) * DV + cv[None, :], dv.to(DV_PTR.dtype.element_ty), mask=v_mask)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``(B, heads, *grid, C)`` -> ``(B, heads, N, C)`` with contiguous channels (a view when possible)."""
    t = t.flatten(2, -2)
    return t if t.stride(-1) == 1 else t.contiguous()


def cumulative_decays(log_alpha, log_beta, log_gamma):
    """``(Ga, Gb, Gc)``: fp32 ``(B*heads, N)`` cumulative sums of the negated log-decays along W, H
    (and T); ``Gc`` is ``Gb`` on a 2-D grid (unused there)."""
    ga = (-log_alpha.float()).cumsum(-1).flatten(2).flatten(0, 1).contiguous()
    gb = (-log_beta.float()).cumsum(-2).flatten(2).flatten(0, 1).contiguous()
    gc = gb if log_gamma is None else (-log_gamma.float()).cumsum(-3).flatten(2).flatten(0, 1).contiguous()
    return ga, gb, gc


def decay_gradient(dg: torch.Tensor, axis: int) -> torch.Tensor:
    """The log-decay gradient from ``dg`` = d loss / d G, fp32 ``(B, heads, *grid)``, where
    ``G = cumsum(-log_decay, axis)``: ``-`` the reverse cumulative sum, zero at index 0 (unused)."""
    grad = -dg.flip(axis).cumsum(axis).flip(axis)
    grad.narrow(axis, 0, 1).zero_()
    return grad.contiguous()


def _dims(q, log_gamma):
    grid = q.shape[2:-1]
    hh, ww = grid[-2], grid[-1]
    return grid, hh * ww, ww, log_gamma is not None


def _check_dtype(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"the Triton polyline_attention kernel takes fp32, fp16 or bf16 {name}, got {t.dtype}")


def residual_shapes(q_shape, dv: int, form: str) -> list[tuple[int, ...]]:
    """Shapes of the fp32 residuals of :func:`vanilla_attention_fwd` for ``q`` of ``q_shape``
    ``(B, heads, *grid, d)``: the log-sum-exps ``(1 or 2, B*heads, N)`` and, for the official
    form, ``O_v2h`` ``(B, heads, N, dv)``."""
    bsz, heads, n = q_shape[0], q_shape[1], math.prod(q_shape[2:-1])
    if form == "paper":
        return [(1, bsz * heads, n)]
    return [(2, bsz * heads, n), (bsz, heads, n, dv)]


def vanilla_attention_fwd(q, k, v, log_alpha, log_beta, log_gamma=None, form="official"):
    """Vanilla polyline attention (``ppma.ops.polyline_attention(kind='vanilla')``).

    ``q``, ``k`` ``(B, heads, *grid, d)``, ``v`` ``(B, heads, *grid, dv)``, fp32 log-decays
    ``(B, heads, *grid)`` on a 2-D ``(H, W)`` or 3-D ``(T, H, W)`` grid -> ``(out, residuals)``:
    ``out`` ``(B, heads, *grid, dv)`` in ``v.dtype`` and the residuals of
    :func:`vanilla_attention_bwd` (:func:`residual_shapes`). The tile size is autotuned.
    """
    _check_dtype(q, k, v)
    decays = cumulative_decays(log_alpha, log_beta, log_gamma)
    grid, hw, ww, is_3d = _dims(q, log_gamma)
    bsz, heads, d, dv = q.shape[0], q.shape[1], q.shape[-1], v.shape[-1]
    qf, kf, vf = _flat(q), _flat(k), _flat(v)
    n = qf.shape[2]
    out = torch.empty(bsz, heads, n, dv, dtype=v.dtype, device=v.device)
    residuals = tuple(torch.empty(s, dtype=torch.float32, device=q.device) for s in residual_shapes(q.shape, dv, form))
    o_v2h = residuals[1] if form != "paper" else out  # the paper form writes no O_v2h
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _fwd_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), bsz * heads)](
        qf, kf, vf, *decays, out, o_v2h, residuals[0],
        *qf.stride()[:3], *kf.stride()[:3], *vf.stride()[:3], *out.stride()[:3],
        heads, n, hw, ww, d, dv,
        IS_3D=is_3d, PAPER=form == "paper", PRECISION=precision,
        BLOCK_D=max(16, pow2(d)), BLOCK_DV=max(16, pow2(dv)),
    )
    return out.view(*q.shape[:-1], dv), residuals


def _softmax_stats(grad, out, residuals, form):
    """The backward's ``(4, B*heads, N)`` fp32 statistics from the forward's residuals: per softmax
    (V2H, then H2V; the paper form has one) its log-sum-exp and ``D = rowsum(dO * O)``, where
    ``dO`` is the part of ``grad`` that reaches that softmax's output."""
    do, out = _flat(grad).float(), _flat(out).float()
    lse = residuals[0]
    if form == "paper":
        return torch.stack([lse[0], (do * out).sum(-1).flatten(0, 1)])
    o_v2h = residuals[1]
    d_v2h = 0.5 * (do * o_v2h).sum(-1).flatten(0, 1)
    d_h2v = 0.5 * (do * (2 * out - o_v2h)).sum(-1).flatten(0, 1)
    return torch.stack([lse[0], d_v2h, lse[1], d_h2v])


def vanilla_attention_bwd(grad, out, residuals, q, k, v, log_alpha, log_beta, log_gamma=None, form="official"):
    """Gradients ``[dq, dk, dv, dlog_alpha, dlog_beta(, dlog_gamma)]`` of :func:`vanilla_attention_fwd`
    for the output gradient ``grad``, from its ``out`` and ``residuals`` (no forward kernel runs)."""
    decays = cumulative_decays(log_alpha, log_beta, log_gamma)
    stats = _softmax_stats(grad, out, residuals, form)
    grid, hw, ww, is_3d = _dims(q, log_gamma)
    bsz, heads, d, dv = q.shape[0], q.shape[1], q.shape[-1], v.shape[-1]
    qf, kf, vf, dof = _flat(q), _flat(k), _flat(v), _flat(grad.to(v.dtype))
    n = qf.shape[2]
    dq = torch.zeros(bsz, heads, n, d, dtype=torch.float32, device=q.device)
    dk = torch.empty(bsz, heads, n, d, dtype=k.dtype, device=q.device)
    dvv = torch.empty(bsz, heads, n, dv, dtype=v.dtype, device=q.device)
    dgs = torch.zeros(3, bsz * heads, n, dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _bwd_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), bsz * heads)](
        qf, kf, vf, *decays, dof, stats, dq, dk, dvv, dgs[0], dgs[1], dgs[2],
        *qf.stride()[:3], *kf.stride()[:3], *vf.stride()[:3], *dof.stride()[:3],
        heads, n, hw, ww, d, dv,
        IS_3D=is_3d, PAPER=form == "paper", PRECISION=precision,
        BLOCK_D=max(16, pow2(d)), BLOCK_DV=max(16, pow2(dv)),
    )
    shape = log_alpha.shape
    grads = [dq.to(q.dtype).view(q.shape), dk.view(k.shape), dvv.view(v.shape),
             decay_gradient(dgs[0].view(shape), -1), decay_gradient(dgs[1].view(shape), -2)]
    if is_3d:
        grads.append(decay_gradient(dgs[2].view(shape), -3))
    return grads


def compile_cases() -> list[tuning.CompileCase]:
    """Every configuration of both kernels for fp32, fp16 and bf16, 2-D and 3-D grids, the
    official form (the released weights'; a launch of the paper form has no rows and runs the
    first configuration) and the head-dim blocks of :data:`HEAD_BLOCKS` (``tools/kernel_resources.py``)."""
    fp32 = ("Ga", "Gb", "Gc", "O1", "LSE", "STATS_PTR", "DQ", "dGa", "dGb", "dGc")
    cases = []
    for kernel, dtype, is_3d, paper, head in itertools.product(
            (_fwd_kernel, _bwd_kernel), ("fp32", "fp16", "bf16"), (False, True), (False,), HEAD_BLOCKS):
        pointers = {name: f"*{dtype}" for name in ("Q", "K", "V", "O", "DO", "DK", "DV_PTR")}
        pointers.update({name: "*fp32" for name in fp32})
        constexprs = dict(IS_3D=is_3d, PAPER=paper, PRECISION="ieee" if dtype == "fp32" else "tf32",
                          BLOCK_D=head, BLOCK_DV=head)
        cases += tuning.cases_of(kernel, tuning.signature(kernel, pointers), constexprs)
    return cases
