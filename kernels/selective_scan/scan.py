"""Triton kernels of Mamba's selective scan, forward and backward, with grouped B/C.

Per channel ``d`` (group ``g = d // (dim // G)``) and state index ``n``:
``h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t``, ``y_t = (C_t . h_t + D u_t) * silu(z_t)``.

Layout: ``u``, ``delta``, ``z``, ``y``: ``(batch, dim, L)``; ``A``: ``(dim, N)``; ``B``, ``C``:
``(batch, G, N, L)``; all contiguous. One program owns one batch row, one group and
``BLOCK_D`` channels of that group, keeps the ``(BLOCK_D, BLOCK_N)`` state in fp32 registers and
walks the sequence step by step, so any ``L`` works without padding.

Backward, without storing ``(batch, dim, N, L)`` states: the forward kernel saves the state at
every chunk start, ``(batch, dim, n_chunks, N)`` (the op's residual, so the backward does not
scan again). The backward kernel walks the chunks last first; for each it recomputes the chunk's states from its
checkpoint into a ``(batch, dim, chunk, N)`` scratch buffer, then runs the adjoint recurrence
``lam_t = gy_t C_t + exp(dt_{t+1} A) lam_{t+1}`` back through the chunk. Sums over channels (dB,
dC) are written per channel block and over time (dA, dD, d delta_bias) per batch row; the
launcher adds the partial sums with ``torch.sum`` (deterministic, no atomics).
"""
from __future__ import annotations

import itertools
import math

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.runtime import interpreted
from ..common.strided import pow2

# Launch heuristic: up to 512 state elements per program; the autotuner chooses the warps.
GPU_STATE_BLOCK = 512
CONFIGS = [triton.Config({}, num_warps=4, num_stages=3), triton.Config({}, num_warps=8, num_stages=3)]
STATE_BLOCKS = (1, 16)  # the resource table's state blocks: a launch counts as the next one up


def _variant(args) -> str:
    """``'fp16 N<=4'``: the resource table's name of a launch, measured with every optional input
    and ``GPU_STATE_BLOCK`` state elements (the most a launch has)."""
    return f"{args['u_ptr'][1:]} N{tuning.bucket(args['BLOCK_N'], STATE_BLOCKS)}"


@triton.jit
def _dt(delta_ptr, off, d_ok, bias, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """``(pre, dt)``: ``pre = delta + bias`` and ``dt = softplus(pre)`` (or ``pre``), fp32."""
    pre = tl.load(delta_ptr + off, mask=d_ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        pre += bias
    dt = pre
    if SOFTPLUS:
        e = tl.exp(-tl.abs(pre))
        w = 1.0 + e
        log1p_e = tl.where(w == 1.0, e, tl.log(w) * (e / (w - 1.0)))  # accurate log(1 + e)
        # above 20, softplus(x) = x, as torch's default threshold
        dt = tl.where(pre > 20.0, pre, tl.maximum(pre, 0.0) + log1p_e)
    return pre, dt


@triton.jit
def _program_channels(A_ptr, D_ptr, bias_ptr, dpg, N, G, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """The program's batch ``b``, group ``g``, channels ``d`` ``(BLOCK_D,)`` and states ``n``
    ``(BLOCK_N,)`` with their masks, and its fp32 ``A`` ``(BLOCK_D, BLOCK_N)``, ``bias`` and ``D``
    ``(BLOCK_D,)`` (zeros where absent)."""
    b = tl.program_id(0) // G
    g = tl.program_id(0) % G
    jd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = jd < dpg
    d = g * dpg + jd
    n = tl.arange(0, BLOCK_N)
    n_ok = n < N
    dn_ok = d_ok[:, None] & n_ok[None, :]
    A = tl.load(A_ptr + d[:, None] * N + n[None, :], mask=dn_ok, other=0.0).to(tl.float32)
    bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
    Dv = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_D:
        Dv = tl.load(D_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
    return b, g, d, d_ok, n, n_ok, dn_ok, A, bias, Dv


@tuning.autotune(CONFIGS, key=["L", "dpg"], variant=_variant)
@triton.jit
def _selective_scan_fwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, y_ptr, last_ptr, ckpt_ptr,
    L, dim, dpg, N, G, chunk, n_chunks,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``y``, ``last`` ``(batch, dim, N)`` fp32 and the chunk-start states ``ckpt``
    ``(batch, dim, n_chunks, N)`` fp32."""
    b, g, d, d_ok, n, n_ok, dn_ok, A, bias, Dv = _program_channels(
        A_ptr, D_ptr, bias_ptr, dpg, N, G, HAS_D, HAS_BIAS, BLOCK_D, BLOCK_N
    )
    row = (b * dim + d).to(tl.int64) * L  # (BLOCK_D,) offset of (b, d, t=0)
    bc = ((b * G + g) * N + n).to(tl.int64) * L  # (BLOCK_N,) offset of (b, g, n, t=0)
    ck = ((b * dim + d).to(tl.int64) * n_chunks)[:, None] * N + n[None, :]
    h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    for c in range(0, n_chunks):
        tl.store(ckpt_ptr + ck + c * N, h, mask=dn_ok)
        t0 = c * chunk
        for t in range(t0, tl.minimum(t0 + chunk, L)):
            x = tl.load(u_ptr + row + t, mask=d_ok, other=0.0).to(tl.float32)
            pre, dt = _dt(delta_ptr, row + t, d_ok, bias, HAS_BIAS, SOFTPLUS)
            Bt = tl.load(B_ptr + bc + t, mask=n_ok, other=0.0).to(tl.float32)
            h = tl.exp(dt[:, None] * A) * h + (dt * x)[:, None] * Bt[None, :]
            Ct = tl.load(C_ptr + bc + t, mask=n_ok, other=0.0).to(tl.float32)
            y = tl.sum(h * Ct[None, :], axis=1) + Dv * x
            if HAS_Z:
                zt = tl.load(z_ptr + row + t, mask=d_ok, other=0.0).to(tl.float32)
                y = y * zt * tl.sigmoid(zt)
            tl.store(y_ptr + row + t, y.to(y_ptr.dtype.element_ty), mask=d_ok)
    tl.store(last_ptr + (b * dim + d).to(tl.int64)[:, None] * N + n[None, :], h, mask=dn_ok)


@tuning.autotune(CONFIGS, key=["L", "dpg"], variant=_variant)
@triton.jit
def _selective_scan_bwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, gy_ptr, glast_ptr, ckpt_ptr, states_ptr,
    gu_ptr, gdelta_ptr, gz_ptr, gB_ptr, gC_ptr, gA_ptr, gD_ptr, gbias_ptr,
    L, dim, dpg, N, G, chunk, n_chunks,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    HAS_GLAST: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Gradients given ``gy`` (of ``y``) and ``glast`` (of the last state).

    Writes ``gu``, ``gdelta``, ``gz`` (``(batch, dim, L)``); ``gB``, ``gC`` per channel block
    ``(batch, G, n_blocks, N, L)`` fp32; ``gA`` ``(batch, dim, N)``, ``gD``, ``gbias``
    ``(batch, dim)`` fp32 summed over time. ``states_ptr``: ``(batch, dim, chunk, N)`` scratch.
    """
    b, g, d, d_ok, n, n_ok, dn_ok, A, bias, Dv = _program_channels(
        A_ptr, D_ptr, bias_ptr, dpg, N, G, HAS_D, HAS_BIAS, BLOCK_D, BLOCK_N
    )
    bd = (b * dim + d).to(tl.int64)
    row = bd * L
    bc = ((b * G + g) * N + n).to(tl.int64) * L
    gbc = (((b * G + g) * tl.num_programs(1) + tl.program_id(1)) * N + n).to(tl.int64) * L
    dn = bd[:, None] * N + n[None, :]
    ck = (bd * n_chunks)[:, None] * N + n[None, :]
    st = (bd * chunk)[:, None] * N + n[None, :]
    carry = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)  # exp(dt_{t+1} A) * lam_{t+1}
    if HAS_GLAST:
        carry = tl.load(glast_ptr + dn, mask=dn_ok, other=0.0).to(tl.float32)
    gA = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    gD = tl.zeros((BLOCK_D,), dtype=tl.float32)
    gbias = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for cc in range(0, n_chunks):
        c = n_chunks - 1 - cc
        t0 = c * chunk
        steps = tl.minimum(chunk, L - t0)
        h = tl.load(ckpt_ptr + ck + c * N, mask=dn_ok, other=0.0)
        for i in range(0, steps):  # recompute: states[i] = h_{t0 + i - 1}
            tl.store(states_ptr + st + i * N, h, mask=dn_ok)
            x = tl.load(u_ptr + row + t0 + i, mask=d_ok, other=0.0).to(tl.float32)
            pre, dt = _dt(delta_ptr, row + t0 + i, d_ok, bias, HAS_BIAS, SOFTPLUS)
            Bt = tl.load(B_ptr + bc + t0 + i, mask=n_ok, other=0.0).to(tl.float32)
            h = tl.exp(dt[:, None] * A) * h + (dt * x)[:, None] * Bt[None, :]
        tl.debug_barrier()  # the adjoint sweep reads what the recompute sweep stored
        for k in range(0, steps):  # adjoint, last step first
            i = steps - 1 - k
            t = t0 + i
            h_prev = tl.load(states_ptr + st + i * N, mask=dn_ok, other=0.0)
            x = tl.load(u_ptr + row + t, mask=d_ok, other=0.0).to(tl.float32)
            pre, dt = _dt(delta_ptr, row + t, d_ok, bias, HAS_BIAS, SOFTPLUS)
            Bt = tl.load(B_ptr + bc + t, mask=n_ok, other=0.0).to(tl.float32)
            Ct = tl.load(C_ptr + bc + t, mask=n_ok, other=0.0).to(tl.float32)
            gy = tl.load(gy_ptr + row + t, mask=d_ok, other=0.0).to(tl.float32)
            a = tl.exp(dt[:, None] * A)
            h = a * h_prev + (dt * x)[:, None] * Bt[None, :]
            if HAS_Z:
                zt = tl.load(z_ptr + row + t, mask=d_ok, other=0.0).to(tl.float32)
                sig = tl.sigmoid(zt)
                y = tl.sum(h * Ct[None, :], axis=1) + Dv * x
                gz = gy * y * sig * (1.0 + zt * (1.0 - sig))  # silu'(z) = sig (1 + z (1 - sig))
                tl.store(gz_ptr + row + t, gz.to(gz_ptr.dtype.element_ty), mask=d_ok)
                gy = gy * zt * sig
            gD += gy * x
            tl.store(gC_ptr + gbc + t, tl.sum(gy[:, None] * h, axis=0), mask=n_ok)
            lam = gy[:, None] * Ct[None, :] + carry
            tl.store(gB_ptr + gbc + t, tl.sum(lam * (dt * x)[:, None], axis=0), mask=n_ok)
            lam_b = tl.sum(lam * Bt[None, :], axis=1)
            da = lam * h_prev * a  # d loss / d (dt A), per state
            gdt = x * lam_b + tl.sum(da * A, axis=1)
            gA += da * dt[:, None]
            carry = lam * a
            if SOFTPLUS:
                gdt = tl.where(pre > 20.0, gdt, gdt * tl.sigmoid(pre))
            gbias += gdt
            tl.store(gu_ptr + row + t, (gy * Dv + dt * lam_b).to(gu_ptr.dtype.element_ty), mask=d_ok)
            tl.store(gdelta_ptr + row + t, gdt.to(gdelta_ptr.dtype.element_ty), mask=d_ok)
        tl.debug_barrier()  # the next chunk overwrites the scratch states
    tl.store(gA_ptr + dn, gA, mask=dn_ok)
    tl.store(gD_ptr + bd, gD, mask=d_ok)
    tl.store(gbias_ptr + bd, gbias, mask=d_ok)


def default_chunk(length: int) -> int:
    """Steps per backward chunk: ``ceil(sqrt(L))`` balances checkpoints against scratch states."""
    return math.isqrt(max(length - 1, 0)) + 1


def _blocks(dpg: int, n_state: int) -> tuple[int, int]:
    """``(BLOCK_D, BLOCK_N)`` for ``dpg`` channels per group and ``n_state`` states."""
    block_n = pow2(n_state)
    if interpreted():  # few, large programs: the interpreter's cost grows with programs x steps
        return pow2(dpg), block_n
    return min(pow2(dpg), max(1, GPU_STATE_BLOCK // block_n)), block_n


class _Problem:
    """Shapes, contiguous inputs and launch geometry shared by the forward and backward launchers."""

    def __init__(self, u, delta, A, B, C, D, z, delta_bias, delta_softplus, chunk):
        self.batch, self.dim, self.length = u.shape
        self.device = u.device
        if B.dim() == 3:
            B, C = B[:, None], C[:, None]
        self.groups, self.n_state = B.shape[1], A.shape[1]
        self.dpg = self.dim // self.groups
        self.chunk = chunk or default_chunk(self.length)
        self.n_chunks = triton.cdiv(self.length, self.chunk)
        self.block_d, self.block_n = _blocks(self.dpg, self.n_state)
        self.grid = (self.batch * self.groups, triton.cdiv(self.dpg, self.block_d))
        # An absent optional input is passed as u: the kernels never read it (HAS_* flags).
        self.tensors = [t.contiguous() if t is not None else u for t in (u, delta, A, B, C, D, z, delta_bias)]
        self.flags = dict(HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None,
                          SOFTPLUS=bool(delta_softplus), BLOCK_D=self.block_d, BLOCK_N=self.block_n)
        self.sizes = (self.length, self.dim, self.dpg, self.n_state, self.groups, self.chunk, self.n_chunks)

    def states(self, *shape):
        """An fp32 ``(batch, dim, *shape)`` buffer."""
        return torch.empty(self.batch, self.dim, *shape, dtype=torch.float32, device=self.device)

def chunk_states_shape(u_shape: tuple[int, int, int], n_state: int, chunk: int | None = None) -> tuple[int, ...]:
    """Shape of the forward's chunk-start states for ``u`` ``(batch, dim, L)``: ``(batch, dim, n_chunks, N)``."""
    batch, dim, length = u_shape
    return batch, dim, triton.cdiv(length, chunk or default_chunk(length)), n_state


def selective_scan_fwd(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                       out_dtype=None, chunk=None):
    """Forward: ``(y, last_state, chunk_states)``, ``y`` ``(batch, dim, L)`` in ``out_dtype``
    (default ``u.dtype``), ``last_state`` ``(batch, dim, N)`` and ``chunk_states`` (the state at
    every chunk start, :func:`chunk_states_shape`) fp32. Shapes as :func:`ppma.ops.selective_scan`
    (B/C ``(batch, N, L)`` or ``(batch, G, N, L)``); any float dtypes, fp32 state. No input checks."""
    p = _Problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus, chunk)
    y = torch.empty(u.shape, dtype=out_dtype or u.dtype, device=u.device)
    last, chunk_states = p.states(p.n_state), p.states(p.n_chunks, p.n_state)
    _selective_scan_fwd_kernel[p.grid](
        *p.tensors, y, last, chunk_states, *p.sizes, **p.flags,
    )
    return y, last, chunk_states


def selective_scan_bwd(grad_y, grad_last, chunk_states, u, delta, A, B, C, D=None, z=None, delta_bias=None,
                       delta_softplus=False, chunk=None):
    """Backward: gradients ``[du, ddelta, dA, dB, dC, dD, dz, ddelta_bias]`` shaped and typed like
    the inputs (``None`` for an absent input) given ``grad_y`` ``(batch, dim, L)``, ``grad_last``
    ``(batch, dim, N)`` (or None) and the forward's ``chunk_states`` (same ``chunk``): each chunk's
    states are recomputed from its start, nothing ``(batch, dim, N, L)`` is stored."""
    p = _Problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus, chunk)
    ckpt = chunk_states.contiguous()
    scratch = p.states(p.chunk, p.n_state)
    gu, gdelta = torch.empty_like(p.tensors[0]), torch.empty_like(p.tensors[1])
    gz = torch.empty_like(p.tensors[6]) if z is not None else gu
    n_blocks = p.grid[1]
    gB = torch.empty(p.batch, p.groups, n_blocks, p.n_state, p.length, dtype=torch.float32, device=u.device)
    gC = torch.empty_like(gB)
    gA = p.states(p.n_state)
    gD, gbias = p.states(), p.states()
    grad_last = grad_last.contiguous() if grad_last is not None else gA
    _selective_scan_bwd_kernel[p.grid](
        *p.tensors, grad_y.contiguous(), grad_last, ckpt, scratch,
        gu, gdelta, gz, gB, gC, gA, gD, gbias, *p.sizes,
        HAS_GLAST=grad_last is not gA, **p.flags,
    )
    gB, gC = (g.sum(2).reshape(B.shape).to(t.dtype) for g, t in ((gB, B), (gC, C)))
    return [
        gu, gdelta, gA.sum(0).to(A.dtype), gB, gC,
        gD.sum(0).to(D.dtype) if D is not None else None,
        gz if z is not None else None,
        gbias.sum(0).to(delta_bias.dtype) if delta_bias is not None else None,
    ]


def compile_cases() -> list[tuning.CompileCase]:
    """Every configuration of both kernels for fp32, fp16 and bf16 inputs and the state blocks of
    :data:`STATE_BLOCKS`, with every optional input (``tools/kernel_resources.py``)."""
    io = ("u_ptr", "delta_ptr", "B_ptr", "C_ptr", "z_ptr", "y_ptr", "gy_ptr", "gu_ptr", "gdelta_ptr", "gz_ptr")
    fp32 = ("A_ptr", "D_ptr", "bias_ptr", "last_ptr", "ckpt_ptr", "glast_ptr", "states_ptr", "gB_ptr", "gC_ptr",
            "gA_ptr", "gD_ptr", "gbias_ptr")
    cases = []
    for kernel, dtype, block_n in itertools.product(
            (_selective_scan_fwd_kernel, _selective_scan_bwd_kernel), ("fp32", "fp16", "bf16"), STATE_BLOCKS):
        pointers = {**{name: f"*{dtype}" for name in io}, **{name: "*fp32" for name in fp32}}
        constexprs = dict(HAS_D=True, HAS_Z=True, HAS_BIAS=True, SOFTPLUS=True, BLOCK_D=GPU_STATE_BLOCK // block_n,
                          BLOCK_N=block_n)
        if kernel is _selective_scan_bwd_kernel:
            constexprs["HAS_GLAST"] = True
        cases += tuning.cases_of(kernel, tuning.signature(kernel, pointers), constexprs)
    return cases
