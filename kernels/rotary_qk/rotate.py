"""Triton kernel of ``rotary_qk``: ``q`` and ``k`` rotated (and ``k`` scaled) in one launch, forward
and backward.

Channel pair ``(2m, 2m+1)`` of token ``n`` is rotated by the angle whose ``(cos, sin)`` is
``rotation[n, m]``::

    out[2m]   = s * (x[2m] cos - SIGN * x[2m+1] sin)
    out[2m+1] = s * (x[2m+1] cos + SIGN * x[2m] sin)

with ``s`` 1 for ``q`` and ``k_scale`` for ``k``. The forward is ``SIGN = 1``; the backward, the
same kernel on the outputs' gradients with ``SIGN = -1`` (the transposed rotation). Program
``(token block, b * heads + h, q or k)`` reads a ``(BLOCK_N, d)`` tile of its tensor through its
strides (the layer's ``q``, ``k`` are views of one GEMM's output), computes in fp32 (fp64 for fp64
tensors) and writes a contiguous ``(B, heads, N, d)`` tensor in its dtype. Where PyTorch ran, per tensor, a copy to fp32,
the complex product and a copy back (and ``k``'s scaling; about nine kernels backward), one launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.strided import cdiv, pow2

# (BLOCK_N tokens x d/2 pairs) a program: 2,048 pairs, two fp32 tiles of 16 values a thread on 4 warps.
PAIRS = 2048
CONFIGS = [triton.Config({}, num_warps=4, num_stages=1), triton.Config({}, num_warps=8, num_stages=1)]


def _variant(args: dict) -> str:
    """The resource table's variant: the tensors' dtype (q's; k's is the same) and the constexprs."""
    return f"{args['Q'][1:]} ACC={args['ACC']} SIGN={args['SIGN']} BLOCK_N={args['BLOCK_N']} BLOCK_M={args['BLOCK_M']}"


@tuning.autotune(CONFIGS, key=["HEADS", "HALF"], variant=_variant)
@triton.jit(do_not_specialize=["N"])
def _rotate_kernel(Q, K, QO, KO, ROT, N, HEADS, sqb, sqh, sqn, skb, skh, skn, k_scale, HALF,
                   ACC: tl.constexpr, SIGN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """``QO`` and ``KO`` (module doc) from ``Q`` and ``K`` ``(B, heads, N, 2 * HALF)`` with the given
    strides (unit channel stride); ``ROT``: fp32 ``(N, HALF, 2)``. Each token's row, its table row
    and its output row are read and written whole (vector accesses along the channels) and split
    into the pairs' two halves in registers."""
    bh, which = tl.program_id(1), tl.program_id(2)
    b, h = bh // HEADS, bh % HEADS
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    c = tl.arange(0, 2 * BLOCK_M)
    mask = (n < N)[:, None] & (c < 2 * HALF)[None, :]
    src = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + n.to(tl.int64)[:, None] * sqn
    dst = QO
    if which == 1:
        src = K + b.to(tl.int64) * skb + h.to(tl.int64) * skh + n.to(tl.int64)[:, None] * skn
        dst = KO
    scale = tl.where(which == 1, k_scale, 1.0).to(ACC)
    rows = tl.load(src + c[None, :], mask=mask, other=0.0).to(ACC)
    even, odd = tl.split(tl.reshape(rows, (BLOCK_N, BLOCK_M, 2)))
    table = tl.load(ROT + n.to(tl.int64)[:, None] * (2 * HALF) + c[None, :], mask=mask, other=0.0).to(ACC)
    cos, sin = tl.split(tl.reshape(table, (BLOCK_N, BLOCK_M, 2)))
    sin = SIGN * sin
    out = tl.reshape(tl.join(scale * (even * cos - odd * sin), scale * (odd * cos + even * sin)), (BLOCK_N, 2 * BLOCK_M))
    offsets = (bh.to(tl.int64) * N + n.to(tl.int64))[:, None] * (2 * HALF) + c[None, :]
    tl.store(dst + offsets, out.to(dst.dtype.element_ty), mask=mask)


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(B, heads, *grid, d)`` as ``(B, heads, N, d)`` with a unit channel stride (a view where
    the strides allow, else a copy)."""
    flat = x.flatten(2, -2)
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def rotate(q: torch.Tensor, k: torch.Tensor, rotation: torch.Tensor, k_scale: float, sign: int):
    """``(q_out, k_out)``: contiguous, in ``q``'s and ``k``'s dtypes, shaped like them."""
    qf, kf = _tokens(q), _tokens(k)
    batch, heads, tokens, d = qf.shape
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    half = d // 2
    block_m = pow2(half)
    block_n = max(1, PAIRS // block_m)
    _rotate_kernel[(cdiv(tokens, block_n), batch * heads, 2)](
        qf, kf, q_out, k_out, rotation.contiguous(), tokens, heads, *qf.stride()[:3], *kf.stride()[:3], k_scale, half,
        ACC=tl.float64 if q.dtype == torch.float64 else tl.float32, SIGN=sign, BLOCK_N=block_n, BLOCK_M=block_m)
    return q_out, k_out


def forward(q, k, rotation, k_scale):
    """``rotary_qk``'s outputs (module doc)."""
    return rotate(q, k, rotation, k_scale, 1)


def backward(dq_out, dk_out, q, k, rotation, k_scale):
    """``[dq, dk, drotation]``: the transposed rotation of the outputs' gradients; the table's
    gradient is zero (a constant of the grid)."""
    dq, dk = rotate(dq_out.to(q.dtype), dk_out.to(k.dtype), rotation, k_scale, -1)
    return [dq, dk, torch.zeros_like(rotation)]


def compile_cases() -> list[tuning.CompileCase]:
    """The kernel for ``tools/kernel_resources.py``: fp32 and bf16 (fp16 as bf16), both signs, head
    dims 16, 32 and 64."""
    cases = []
    for dtype in ("fp32", "bf16", "fp16"):
        for d in (16, 32, 64):
            block_m = pow2(d // 2)
            for sign in (1, -1):
                pointers = {"Q": f"*{dtype}", "K": f"*{dtype}", "QO": f"*{dtype}", "KO": f"*{dtype}", "ROT": "*fp32"}
                signature = {**tuning.signature(_rotate_kernel, pointers), "k_scale": "fp32"}
                cases += tuning.cases_of(_rotate_kernel, signature,
                                         dict(ACC=tl.float32, SIGN=sign, BLOCK_N=max(1, PAIRS // block_m),
                                              BLOCK_M=block_m),
                                         fp16_as_bf16=True)
    return cases
