"""Triton kernels of the 1-D bidirectional decayed scan along one grid axis, forward and backward.

Along every line of the chosen axis, ``y = A u`` with the symmetric 1-D polyline mask
``A[j, l] = exp(-|G_j - G_l|)``, ``G = cumsum(-log_decay)`` (the reference is ``ppma.ops.polyline_mask_1d``),
computed as ``y_p = h_p + g_p - u_p`` from the causal scan ``h_p = u_p + a_p h_{p-1}`` and the
anti-causal scan ``g_p = u_p + a_{p+1} g_{p+1}``, ``a = exp(log_decay) <= 1``.

Backward (``gv`` = gradient of the pass output): ``gu = A gv`` (A is symmetric) and, since every
entry of A whose path crosses the edge ``p-1 -> p`` factors as ``A[j, p] a_p A[p-1, l]``,
``dlog_a_p = a_p * sum_c (G_p h_{p-1} + H_{p-1} X_p)`` with ``h``/``X`` the causal/anti-causal scans
of ``u`` and ``H``/``G`` those of ``gv``: products of stable recurrences, nothing cancels.

Layout: tensors are handled as 6-D ``(B, heads, T, H, W, C)`` (decays ``(B, heads, T, H, W)``)
with any strides (a permuted channels-last view is read in place); the scan runs along ``dim``
in ``{2, 3, 4}``. One program owns ``BLOCK_L`` lines x ``BLOCK_C`` channels and walks its lines
position by position, keeping the running state in registers, so a line of any length (1, a
prime, 256 and beyond) needs no chunking: the causal sweep stores its scan in an fp32 buffer
(the output itself when that is fp32) and the anti-causal sweep, last position first, reads it
back. Channel sums of the decay gradient are written per channel block and summed afterwards
with ``torch.sum`` (deterministic, no atomics).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.runtime import interpreted
from ..common.strided import accumulation_dtype, block_ptrs, cdiv, line_offsets, pow2, tl_dtype

# Launch heuristics. GPU: 512-element (lines x channels) blocks, fewer lines per program when that
# leaves too few programs to keep the GPU busy; the autotuner picks the warps (CONFIGS; registers
# and spills per architecture in docs/benchmarks.md). The
# interpreter takes few, large programs: its cost grows with programs x loop steps, hardly with
# the block size.
GPU_BLOCK = 512
GPU_MIN_PROGRAMS = 1024
INTERPRET_BLOCK = 1 << 16
CONFIGS = [triton.Config({}, num_warps=4, num_stages=3), triton.Config({}, num_warps=8, num_stages=3)]


def _variant(args) -> str:
    """``'bf16 acc fp32'``: the resource table's name of a launch, measured on ``GPU_BLOCK``
    elements (the most a GPU launch has) with a base."""
    return f"{args['u_ptr'][1:]} acc {args['ACC']}"


@tuning.autotune(CONFIGS, key=["n_lines", "n", "C"], variant=_variant)
@triton.jit
def _decay_scan_fwd_kernel(
    u_ptr, ld_ptr, base_ptr, y_ptr, h_ptr,
    n_lines, n, C, D1, D2, D3,
    su0, su1, su2, su3, sun, suc,
    sd0, sd1, sd2, sd3, sdn,
    sb0, sb1, sb2, sb3, sbn, sbc,
    sy0, sy1, sy2, sy3, syn, syc,
    HAS_BASE: tl.constexpr, ACC: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """``y = A u (+ base)`` along one axis. ``h_ptr`` (y's layout, ``ACC`` dtype; may be ``y``)
    holds the causal scan between the two sweeps."""
    line = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)
    chan = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    line_ok = line < n_lines
    mask = line_ok[:, None] & (chan < C)[None, :]
    u_ptrs = block_ptrs(u_ptr, line, chan, D1, D2, D3, su0, su1, su2, su3, suc)
    h_ptrs = block_ptrs(h_ptr, line, chan, D1, D2, D3, sy0, sy1, sy2, sy3, syc)
    d_ptrs = ld_ptr + line_offsets(line, D1, D2, D3, sd0, sd1, sd2, sd3)
    h = tl.zeros((BLOCK_L, BLOCK_C), dtype=ACC)
    for _ in range(n):  # causal: h_p = u_p + a_p h_{p-1}
        h = tl.load(u_ptrs, mask=mask, other=0.0).to(ACC) + tl.exp(tl.load(d_ptrs, mask=line_ok, other=0.0).to(ACC))[:, None] * h
        tl.store(h_ptrs, h, mask=mask)
        u_ptrs += sun
        h_ptrs += syn
        d_ptrs += sdn
    tl.debug_barrier()  # the anti-causal sweep reads what the causal sweep stored
    y_ptrs = block_ptrs(y_ptr, line, chan, D1, D2, D3, sy0, sy1, sy2, sy3, syc) + tl.cast(n, tl.int64) * syn
    b_ptrs = block_ptrs(base_ptr, line, chan, D1, D2, D3, sb0, sb1, sb2, sb3, sbc) + tl.cast(n, tl.int64) * sbn
    back_un, back_yn, back_dn, back_bn = -sun, -syn, -sdn, -sbn  # negated once: cheap in the interpreter
    g = tl.zeros((BLOCK_L, BLOCK_C), dtype=ACC)
    a_next = tl.zeros((BLOCK_L, 1), dtype=ACC)
    for _ in range(n):  # anti-causal, last position first: g_p = u_p + a_{p+1} g_{p+1}
        u_ptrs += back_un
        h_ptrs += back_yn
        y_ptrs += back_yn
        d_ptrs += back_dn
        u = tl.load(u_ptrs, mask=mask, other=0.0).to(ACC)
        g = u + a_next * g
        y = tl.load(h_ptrs, mask=mask, other=0.0) + g - u
        if HAS_BASE:
            b_ptrs += back_bn
            y += tl.load(b_ptrs, mask=mask, other=0.0).to(ACC)
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)
        a_next = tl.exp(tl.load(d_ptrs, mask=line_ok, other=0.0).to(ACC))[:, None]


@tuning.autotune(CONFIGS, key=["n_lines", "n", "C"], variant=_variant)
@triton.jit
def _decay_scan_bwd_kernel(
    u_ptr, gv_ptr, ld_ptr, base_ptr, gu_ptr, hp_ptr, gp_ptr, dlog_ptr,
    n_lines, n, C, D1, D2, D3,
    su0, su1, su2, su3, sun, suc,
    sg0, sg1, sg2, sg3, sgn, sgc,
    sd0, sd1, sd2, sd3, sdn,
    sb0, sb1, sb2, sb3, sbn, sbc,
    sy0, sy1, sy2, sy3, syn, syc,
    HAS_BASE: tl.constexpr, ACC: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """``gu = A gv (+ base)`` and per-channel-block partial sums of ``dlog_a``.

    ``hp_ptr``/``gp_ptr`` (gu's layout, ``ACC`` dtype; ``gp_ptr`` may be ``gu_ptr``) hold
    ``h_{p-1}``/``H_{p-1}`` between the sweeps; ``dlog_ptr`` is ``(n_channel_blocks, n_lines, n)``.
    """
    line = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)
    chan = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    line_ok = line < n_lines
    mask = line_ok[:, None] & (chan < C)[None, :]
    u_ptrs = block_ptrs(u_ptr, line, chan, D1, D2, D3, su0, su1, su2, su3, suc)
    g_ptrs = block_ptrs(gv_ptr, line, chan, D1, D2, D3, sg0, sg1, sg2, sg3, sgc)
    hp_ptrs = block_ptrs(hp_ptr, line, chan, D1, D2, D3, sy0, sy1, sy2, sy3, syc)
    gp_ptrs = block_ptrs(gp_ptr, line, chan, D1, D2, D3, sy0, sy1, sy2, sy3, syc)
    d_ptrs = ld_ptr + line_offsets(line, D1, D2, D3, sd0, sd1, sd2, sd3)
    h = tl.zeros((BLOCK_L, BLOCK_C), dtype=ACC)  # causal scan of u, one position behind
    hg = tl.zeros((BLOCK_L, BLOCK_C), dtype=ACC)  # causal scan of gv, one position behind
    for _ in range(n):
        tl.store(hp_ptrs, h, mask=mask)
        tl.store(gp_ptrs, hg, mask=mask)
        a = tl.exp(tl.load(d_ptrs, mask=line_ok, other=0.0).to(ACC))[:, None]
        h = tl.load(u_ptrs, mask=mask, other=0.0).to(ACC) + a * h
        hg = tl.load(g_ptrs, mask=mask, other=0.0).to(ACC) + a * hg
        u_ptrs += sun
        g_ptrs += sgn
        hp_ptrs += syn
        gp_ptrs += syn
        d_ptrs += sdn
    tl.debug_barrier()  # the anti-causal sweep reads what the causal sweep stored
    gu_ptrs = block_ptrs(gu_ptr, line, chan, D1, D2, D3, sy0, sy1, sy2, sy3, syc) + tl.cast(n, tl.int64) * syn
    b_ptrs = block_ptrs(base_ptr, line, chan, D1, D2, D3, sb0, sb1, sb2, sb3, sbc) + tl.cast(n, tl.int64) * sbn
    dl_ptrs = dlog_ptr + tl.program_id(1).to(tl.int64) * n_lines * n + line.to(tl.int64) * n + n
    back_un, back_gn, back_yn, back_dn, back_bn = -sun, -sgn, -syn, -sdn, -sbn
    x_anti = tl.zeros((BLOCK_L, BLOCK_C), dtype=ACC)  # anti-causal scan of u
    g_anti = tl.zeros((BLOCK_L, BLOCK_C), dtype=ACC)  # anti-causal scan of gv
    a_next = tl.zeros((BLOCK_L, 1), dtype=ACC)
    for _ in range(n):  # last position first
        u_ptrs += back_un
        g_ptrs += back_gn
        hp_ptrs += back_yn
        gp_ptrs += back_yn
        gu_ptrs += back_yn
        d_ptrs += back_dn
        dl_ptrs += -1
        a = tl.exp(tl.load(d_ptrs, mask=line_ok, other=0.0).to(ACC))[:, None]
        x_anti = tl.load(u_ptrs, mask=mask, other=0.0).to(ACC) + a_next * x_anti
        g_anti = tl.load(g_ptrs, mask=mask, other=0.0).to(ACC) + a_next * g_anti
        h_prev = tl.load(hp_ptrs, mask=mask, other=0.0)
        hg_prev = tl.load(gp_ptrs, mask=mask, other=0.0)
        gu = a * hg_prev + g_anti  # H_p + G_p - gv_p, with H_p = gv_p + a_p H_{p-1}
        if HAS_BASE:
            b_ptrs += back_bn
            gu += tl.load(b_ptrs, mask=mask, other=0.0).to(ACC)
        tl.store(gu_ptrs, gu.to(gu_ptr.dtype.element_ty), mask=mask)
        dlog = tl.sum(a * (g_anti * h_prev + hg_prev * x_anti), axis=1)
        tl.store(dl_ptrs, dlog, mask=line_ok)
        a_next = a


def _blocks(n_lines: int, C: int) -> tuple[int, int]:
    """``(BLOCK_L, BLOCK_C)`` for ``n_lines`` lines of ``C`` channels."""
    if interpreted():
        block_c = min(pow2(C), INTERPRET_BLOCK)
        return min(pow2(n_lines), INTERPRET_BLOCK // block_c), block_c
    block_c = min(pow2(C), 64)
    block_l = min(pow2(n_lines), GPU_BLOCK // block_c)
    while block_l > 1 and cdiv(n_lines, block_l) * cdiv(C, block_c) < GPU_MIN_PROGRAMS:
        block_l //= 2
    return block_l, block_c


class _Lines:
    """The lines of a 6-D ``(B, heads, T, H, W, C)`` view along ``dim``, as kernel arguments.

    The four non-scan grid dims are ordered by decreasing stride of ``ref`` so that consecutive
    line indices are close in memory.
    """

    def __init__(self, ref: torch.Tensor, dim: int):
        others = [d for d in range(5) if d != dim]
        self.dims = sorted(others, key=lambda d: ref.stride(d), reverse=True)
        self.dim = dim
        self.sizes = [ref.shape[d] for d in self.dims]
        self.n_lines = self.sizes[0] * self.sizes[1] * self.sizes[2] * self.sizes[3]
        self.n = ref.shape[dim]
        self.C = ref.shape[5]

    def strides(self, t: torch.Tensor) -> list[int]:
        """Line strides, scan stride and (for 6-D tensors) channel stride of ``t``."""
        out = [t.stride(d) for d in self.dims] + [t.stride(self.dim)]
        return out + [t.stride(5)] if t.dim() == 6 else out

    def unflatten_grad(self, partial: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``(n_blocks, n_lines, n)`` partial sums -> decay-shaped gradient (like ``like``)."""
        grad = partial.sum(0).reshape(*self.sizes, self.n)
        order = self.dims + [self.dim]
        return torch.empty_like(like).copy_(grad.permute([order.index(d) for d in range(5)]))


def _buffer(like: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Uninitialized buffer laid out like ``like`` (dense) or, given ``shape``, contiguous.

    Every buffer the kernels write comes from here (the tests fill them with NaN first).
    """
    if shape is None:
        return torch.empty_like(like, dtype=dtype)
    return torch.empty(shape, dtype=dtype, device=like.device)


def decay_scan_fwd(
    u: torch.Tensor,
    log_decay: torch.Tensor,
    dim: int,
    out_dtype: torch.dtype,
    base: torch.Tensor | None = None,
) -> torch.Tensor:
    """``A u`` along ``dim`` of the grid (+ ``base``), returned in ``out_dtype``.

    ``u``: ``(B, heads, T, H, W, C)``, any strides and float dtype; ``log_decay``:
    ``(B, heads, T, H, W)``; ``dim`` in ``{2, 3, 4}``; ``base``: shaped like ``u``, any strides.
    Accumulates in fp32 (fp64 for fp64 ``u``). The result is laid out like ``u`` when ``u`` is
    dense, else contiguous.
    """
    lines = _Lines(u, dim)
    acc = accumulation_dtype(u)
    y = _buffer(u, out_dtype)
    h = y if out_dtype == acc else _buffer(y, acc)
    base = y if base is None else base
    block_l, block_c = _blocks(lines.n_lines, lines.C)
    grid = (cdiv(lines.n_lines, block_l), cdiv(lines.C, block_c))
    if u.numel() == 0:  # no batch or no channels: nothing to launch
        return y
    _decay_scan_fwd_kernel[grid](
        u, log_decay, base, y, h,
        lines.n_lines, lines.n, lines.C, *lines.sizes[1:],
        *lines.strides(u), *lines.strides(log_decay), *lines.strides(base), *lines.strides(y),
        HAS_BASE=base is not y, ACC=tl_dtype(acc), BLOCK_L=block_l, BLOCK_C=block_c,
    )
    return y


def decay_scan_bwd(
    u: torch.Tensor,
    grad: torch.Tensor,
    log_decay: torch.Tensor,
    dim: int,
    out_dtype: torch.dtype,
    base: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``decay_scan_fwd(u, log_decay, dim)`` given ``grad`` of its output.

    ``u``, ``grad``, ``base``: ``(B, heads, T, H, W, C)``, any strides; ``log_decay``:
    ``(B, heads, T, H, W)``. Returns ``(grad_u (+ base), grad_log_decay)``: ``grad_u`` in
    ``out_dtype`` laid out like ``grad`` (when dense), ``grad_log_decay`` shaped and typed like
    ``log_decay``. Accumulates in fp32 (fp64 for fp64 ``u``).
    """
    lines = _Lines(grad, dim)
    acc = accumulation_dtype(u)
    gu = _buffer(grad, out_dtype)
    hp = _buffer(gu, acc)
    gp = gu if out_dtype == acc else _buffer(gu, acc)
    base = gu if base is None else base
    block_l, block_c = _blocks(lines.n_lines, lines.C)
    n_cblocks = cdiv(lines.C, block_c)
    partial = _buffer(gu, acc, (n_cblocks, lines.n_lines, lines.n))
    grid = (cdiv(lines.n_lines, block_l), n_cblocks)
    if grad.numel() == 0:  # no batch or no channels: zero decay gradients
        return gu, lines.unflatten_grad(partial, log_decay)
    _decay_scan_bwd_kernel[grid](
        u, grad, log_decay, base, gu, hp, gp, partial,
        lines.n_lines, lines.n, lines.C, *lines.sizes[1:],
        *lines.strides(u), *lines.strides(grad), *lines.strides(log_decay), *lines.strides(base),
        *lines.strides(gu),
        HAS_BASE=base is not gu, ACC=tl_dtype(acc), BLOCK_L=block_l, BLOCK_C=block_c,
    )
    return gu, lines.unflatten_grad(partial, log_decay)


def compile_cases() -> list[tuning.CompileCase]:
    """Every configuration of both kernels for fp32, fp16, bf16 (fp32 accumulation) and fp64
    inputs on ``GPU_BLOCK``-element blocks (``tools/kernel_resources.py``)."""
    cases = []
    for kernel in (_decay_scan_fwd_kernel, _decay_scan_bwd_kernel):
        for dtype, acc in (("fp32", tl.float32), ("fp16", tl.float32), ("bf16", tl.float32), ("fp64", tl.float64)):
            pointers = {name: f"*{dtype}" for name in ("u_ptr", "gv_ptr", "base_ptr", "y_ptr", "gu_ptr")}
            pointers.update({name: f"*{acc}" for name in ("h_ptr", "hp_ptr", "gp_ptr", "dlog_ptr")}, ld_ptr="*fp32")
            constexprs = dict(HAS_BASE=True, ACC=acc, BLOCK_L=GPU_BLOCK // 64, BLOCK_C=64)
            cases += tuning.cases_of(kernel, tuning.signature(kernel, pointers), constexprs)
    return cases
