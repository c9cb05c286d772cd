"""Triton kernels of Mamba's selective scan, forward and backward, with grouped B/C, in time tiles.

Per channel ``d`` (group ``g = d // (dim // G)``) and state index ``n``:
``h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t``, ``y_t = (C_t . h_t + D u_t) * silu(z_t)``.

Layout (:class:`Layout`): ``u``, ``delta``, ``z`` are ``(batch, dim, L)`` and ``B``, ``C``
``(batch, G, N, L)`` views of any strides (each family passes its own :class:`Strides`); ``y`` and
the gradients are written through the layout's output strides (contiguous on sequences). With
``ROUTES`` the groups are VMamba's four routes over a channels-last map, step ``t`` of route ``g``
at the map position the route visits then (:mod:`.routes`). Time is walked in tiles of ``BLOCK_T`` steps (:func:`tile_length`): a program
loads ``(BLOCK_D, BLOCK_T)`` tiles of ``u``, ``delta``, ``z`` and ``(BLOCK_N, BLOCK_T)`` tiles of
``B``, ``C`` along the time axis (contiguous, so the loads coalesce and vectorize), runs the
recurrence over the tile in registers as an associative scan of ``(decay, input)`` pairs over
``(BLOCK_D, BLOCK_N, BLOCK_T)``, and carries the fp32 state to the next tile. Positions past
``L`` get ``dt = 0`` (decay 1, input 0), so any ``L`` works.

Forward (grid: batch x group, channel blocks): ``y``, the last state, and the state at every tile
start, ``(batch, dim, n_tiles, N)`` fp32: the op's residual (one state per ``BLOCK_T`` steps).

Backward (grid: batch x group, channel slices): tiles last first; within a tile, the slice's
channel blocks one after another. Each block recomputes its tile's states in registers from the
tile-start state (no global scratch of states), then runs the adjoint
``lam_t = gy_t C_t + exp(dt_{t+1} A) lam_{t+1}`` as a reverse associative scan, its value at the
tile's first step carried to the previous tile through a ``(batch, dim, N)`` buffer. ``dB``,
``dC`` (sums over channels) are summed over the slice's channels in registers and written once
per slice; ``dA``, ``dD``, ``d delta_bias`` (sums over time and batch) are written per tile. The
launcher adds the partial sums with ``torch.sum``: deterministic, no atomics.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.strided import cdiv, pow2

# Time steps x states of one channel in a tile (the registers one channel's arrays take).
TILE_ELEMENTS = 2048
# Registers: a configuration may run a tile when its fp32 (BLOCK_D, max(BLOCK_N, 2), BLOCK_T) array
# takes at most this many elements per thread (N = 1 counts as 2: its (BLOCK_D, BLOCK_T) arrays
# are as large as the 3-D ones, and there are more of them). Set from ptxas -v for sm_90.
FWD_ELEMENTS_PER_THREAD = 16
BWD_ELEMENTS_PER_THREAD = 8
# Backward: aim for this many programs (batch x groups x channel slices) to fill the GPU.
BWD_PROGRAMS = 1024
# Channels of a backward slice are a multiple of the largest BLOCK_D.
SLICE_MULTIPLE = 32


def _configs(block_ds: tuple[int, ...], maxnreg: int | None = None) -> list[triton.Config]:
    return [triton.Config({"BLOCK_D": bd}, num_warps=w, num_stages=1, maxnreg=maxnreg)
            for bd in block_ds for w in (4, 8)]


# Wide channel blocks are for short tiles, e.g. the routes' (channels-last maps: the channel axis
# is the contiguous one there). Both kernels may take every register: with Triton's ptxas options
# (--regAllocOptLevel=2) some configurations otherwise stop at 128 or 168 and spill.
FWD_CONFIGS = _configs((2, 1, 4, 8, 16, 32), maxnreg=255)
BWD_CONFIGS = _configs((1, 2, 4, 8, 16, 32), maxnreg=255)


def _elements_per_thread(config: triton.Config, block_n: int, block_t: int) -> float:
    return config.kwargs["BLOCK_D"] * max(block_n, 2) * block_t / (32 * config.num_warps)


def _fitting(configs, block_n: int, block_t: int, per_thread: int) -> list[triton.Config]:
    """The configurations within ``per_thread`` elements per thread on ``(BLOCK_N, BLOCK_T)``
    tiles (the smallest one when none is)."""
    fit = [c for c in configs if _elements_per_thread(c, block_n, block_t) <= per_thread]
    return fit or [min(configs, key=lambda c: _elements_per_thread(c, block_n, block_t))]


def _prune(per_thread, configs, named_args, **kwargs):
    """``early_config_prune`` at the launch's tile: :func:`_fitting` within ``per_thread``."""
    return _fitting(configs, kwargs["BLOCK_N"], kwargs["BLOCK_T"], per_thread)


@triton.jit
def _dt(pre, ok, bias, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """``(pre, dt)`` fp32: ``pre = delta + bias``, ``dt = softplus(pre)`` (or ``pre``), 0 where not ``ok``."""
    if HAS_BIAS:
        pre += bias[:, None]
    dt = pre
    if SOFTPLUS:
        e = tl.exp(-tl.abs(pre))
        w = 1.0 + e
        log1p_e = tl.where(w == 1.0, e, tl.log(w) * (e / (w - 1.0)))  # accurate log(1 + e)
        # above 20, softplus(x) = x, as torch's default threshold
        dt = tl.where(pre > 20.0, pre, tl.maximum(pre, 0.0) + log1p_e)
    return pre, tl.where(ok, dt, 0.0)


@triton.jit
def _linear(a1, b1, a2, b2):
    """Composition of ``h -> a1 h + b1`` then ``h -> a2 h + b2``."""
    return a1 * a2, b1 * a2 + b2


@triton.jit
def _last(x, t, BLOCK_T: tl.constexpr):
    """``x[..., BLOCK_T - 1]`` of a ``(BLOCK_D, BLOCK_N, BLOCK_T)`` array."""
    return tl.sum(tl.where(t[None, None, :] == BLOCK_T - 1, x, 0.0), axis=2)


@triton.jit
def _first(x, t):
    """``x[..., 0]`` of a ``(BLOCK_D, BLOCK_N, BLOCK_T)`` array."""
    return tl.sum(tl.where(t[None, None, :] == 0, x, 0.0), axis=2)


@triton.jit
def _positions(t, g, L, height, width, ROUTES: tl.constexpr):
    """Memory positions of time steps ``t``: ``t`` itself, or with ``ROUTES`` the position on an
    ``(height, width)`` map, row-major, of step ``t`` of VMamba's route ``g`` (0: row-major, 1:
    column-major, 2, 3: those reversed)."""
    if ROUTES:
        t = tl.where(g >= 2, L - 1 - t, t)
        t = tl.where(g % 2 == 1, (t % height) * width + t // height, t)
    return t


@triton.jit
def _offsets(b, g, jd, p, s_b, s_g, s_d, s_t):
    """``(BLOCK_D, BLOCK_T)`` offsets of channels ``jd`` of group ``g`` at positions ``p``."""
    return b.to(tl.int64) * s_b + g * s_g + jd[:, None] * s_d + p[None, :].to(tl.int64) * s_t


@triton.jit
def _channel_params(A_ptr, D_ptr, bias_ptr, d, d_ok, n, n_ok, N, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    """fp32 ``A`` ``(BLOCK_D, BLOCK_N)``, ``bias`` and ``D`` ``(BLOCK_D,)`` of channels ``d`` (zeros where absent)."""
    A = tl.load(A_ptr + d[:, None] * N + n[None, :], mask=d_ok[:, None] & n_ok[None, :], other=0.0).to(tl.float32)
    bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
    Dv = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_D:
        Dv = tl.load(D_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
    return A, bias, Dv


@triton.jit
def _bc_tile(B_ptr, C_ptr, b, g, n, n_ok, p, t_ok, sbc_b, sbc_g, sbc_n, sbc_t):
    """fp32 ``B`` and ``C`` of group ``g`` at the tile's positions ``p``: ``(BLOCK_N, BLOCK_T)``."""
    bc_off = _offsets(b, g, n, p, sbc_b, sbc_g, sbc_n, sbc_t)
    nt_ok = n_ok[:, None] & t_ok[None, :]
    Bt = tl.load(B_ptr + bc_off, mask=nt_ok, other=0.0).to(tl.float32)
    Ct = tl.load(C_ptr + bc_off, mask=nt_ok, other=0.0).to(tl.float32)
    return Bt, Ct


@triton.jit
def _tile_inputs(u_ptr, delta_ptr, Bt, b, g, jd, d_ok, p, t_ok, A, bias,
                 su_b, su_g, su_d, su_t, sd_b, sd_g, sd_d, sd_t, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """One channel block's fp32 tile inputs: ``x``, ``pre``, ``dt`` ``(BLOCK_D, BLOCK_T)``, decays
    ``a`` and inputs ``bx`` ``(BLOCK_D, BLOCK_N, BLOCK_T)``, the ``u`` offsets and the tile's
    mask. ``p``: the tile's positions (:func:`_positions`); ``Bt``: :func:`_bc_tile`'s ``B``."""
    dt_ok = d_ok[:, None] & t_ok[None, :]
    u_off = _offsets(b, g, jd, p, su_b, su_g, su_d, su_t)
    x = tl.load(u_ptr + u_off, mask=dt_ok, other=0.0).to(tl.float32)
    pre = tl.load(delta_ptr + _offsets(b, g, jd, p, sd_b, sd_g, sd_d, sd_t), mask=dt_ok, other=0.0).to(tl.float32)
    pre, dt = _dt(pre, dt_ok, bias, HAS_BIAS, SOFTPLUS)
    a = tl.exp(dt[:, None, :] * A[:, :, None])
    bx = (dt * x)[:, None, :] * Bt[None, :, :]
    return x, pre, dt, a, bx, u_off, dt_ok


def _variant(args) -> str:
    """``'bf16 N<=16'``: the resource table's name of a launch (:mod:`~ppma.kernels.common.tuning`):
    its dtype, its state block, ``routes`` on VMamba's routes (a launch with some or none of ``D``,
    ``z``, ``delta_bias``, softplus counts as one with all: the most registers)."""
    name = f"{args['u_ptr'][1:]} N{tuning.bucket(args['BLOCK_N'], (1, 16))}"
    return f"{name} routes" if args["ROUTES"] else name


@tuning.autotune(FWD_CONFIGS, key=["L", "dpg", "N", "G"], variant=_variant, prune=functools.partial(_prune, FWD_ELEMENTS_PER_THREAD))
@triton.jit
def _selective_scan_fwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, y_ptr, last_ptr, ckpt_ptr,
    L, dim, dpg, N, G, n_tiles, height, width,
    su_b, su_g, su_d, su_t, sd_b, sd_g, sd_d, sd_t, sbc_b, sbc_g, sbc_n, sbc_t, sy_b, sy_g, sy_d, sy_t,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    ROUTES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """``y`` (strides ``sy_*``), ``last`` ``(batch, dim, N)`` fp32 and the tile-start states
    ``ckpt`` ``(batch, dim, n_tiles, N)`` fp32, contiguous."""
    b = tl.program_id(0) // G
    g = tl.program_id(0) % G
    jd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = jd < dpg
    d = g * dpg + jd
    n = tl.arange(0, BLOCK_N)
    n_ok = n < N
    dn_ok = d_ok[:, None] & n_ok[None, :]
    A, bias, Dv = _channel_params(A_ptr, D_ptr, bias_ptr, d, d_ok, n, n_ok, N, HAS_D, HAS_BIAS, BLOCK_D)
    bd = b.to(tl.int64) * dim + d  # (BLOCK_D,) row of (batch, dim)
    ck = (bd * n_tiles)[:, None] * N + n[None, :]
    tt = tl.arange(0, BLOCK_T)
    h0 = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    for k in range(0, n_tiles):
        tl.store(ckpt_ptr + ck + k * N, h0, mask=dn_ok)
        t = k * BLOCK_T + tt
        t_ok = t < L
        p = _positions(t, g, L, height, width, ROUTES)
        Bt, Ct = _bc_tile(B_ptr, C_ptr, b, g, n, n_ok, p, t_ok, sbc_b, sbc_g, sbc_n, sbc_t)
        x, _, _, a, bx, u_off, dt_ok = _tile_inputs(u_ptr, delta_ptr, Bt, b, g, jd, d_ok, p, t_ok, A, bias,
                                                    su_b, su_g, su_d, su_t, sd_b, sd_g, sd_d, sd_t, HAS_BIAS, SOFTPLUS)
        ca, cb = tl.associative_scan((a, bx), 2, _linear)
        h = cb + ca * h0[:, :, None]
        y = tl.sum(h * Ct[None, :, :], axis=1) + Dv[:, None] * x
        if HAS_Z:
            zt = tl.load(z_ptr + u_off, mask=dt_ok, other=0.0).to(tl.float32)
            y = y * zt * tl.sigmoid(zt)
        tl.store(y_ptr + _offsets(b, g, jd, p, sy_b, sy_g, sy_d, sy_t), y.to(y_ptr.dtype.element_ty), mask=dt_ok)
        h0 = _last(h, tt, BLOCK_T)
    tl.store(last_ptr + bd[:, None] * N + n[None, :], h0, mask=dn_ok)


@tuning.autotune(BWD_CONFIGS, key=["L", "dpg", "N", "G", "slice_len"], variant=_variant, prune=functools.partial(_prune, BWD_ELEMENTS_PER_THREAD))
@triton.jit
def _selective_scan_bwd_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, gy_ptr, glast_ptr, ckpt_ptr, carry_ptr,
    gu_ptr, gdelta_ptr, gz_ptr, gB_ptr, gC_ptr, gA_ptr, gD_ptr, gbias_ptr,
    L, dim, dpg, N, G, n_tiles, height, width, slice_len,
    su_b, su_g, su_d, su_t, sd_b, sd_g, sd_d, sd_t, sbc_b, sbc_g, sbc_n, sbc_t, sy_b, sy_g, sy_d, sy_t,
    sg_b, sg_g, sg_d, sg_t,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    ROUTES: tl.constexpr, HAS_GLAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Gradients given ``gy`` (of ``y``, strides ``sg_*``) and ``glast`` (of the last state).

    Writes ``gu``, ``gdelta``, ``gz`` (strides ``sy_*``); ``gB``, ``gC`` per channel slice
    ``(batch, G, n_slices, N, L)`` fp32, by position; per tile ``gA`` ``(batch, dim, n_tiles, N)``, ``gD``,
    ``gbias`` ``(batch, dim, n_tiles)`` fp32. ``carry_ptr``: ``(batch, dim, N)`` fp32, the
    adjoint at the first step of the tile done last.
    """
    b = tl.program_id(0) // G
    g = tl.program_id(0) % G
    first = tl.program_id(1) * slice_len
    n_blocks = tl.cdiv(tl.minimum(slice_len, dpg - first), BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    n_ok = n < N
    tt = tl.arange(0, BLOCK_T)
    gbc = ((b * G + g) * tl.num_programs(1) + tl.program_id(1)).to(tl.int64) * N * L + n[:, None] * L
    for kk in range(0, n_tiles):
        k = n_tiles - 1 - kk
        t = k * BLOCK_T + tt
        t_ok = t < L
        p = _positions(t, g, L, height, width, ROUTES)
        p1 = _positions(t + 1, g, L, height, width, ROUTES)
        t1_ok = t + 1 < L
        gB = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
        gC = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
        Bt, Ct = _bc_tile(B_ptr, C_ptr, b, g, n, n_ok, p, t_ok, sbc_b, sbc_g, sbc_n, sbc_t)  # every block's
        tl.debug_barrier()  # the carries stored for the tile after this one are read below
        for i in range(0, n_blocks):  # channels first + i BLOCK_D ...: a multiple of BLOCK_D, for vector loads
            jd = first + i * BLOCK_D + tl.arange(0, BLOCK_D)
            d_ok = jd < dpg
            d = g * dpg + jd
            dn_ok = d_ok[:, None] & n_ok[None, :]
            A, bias, Dv = _channel_params(A_ptr, D_ptr, bias_ptr, d, d_ok, n, n_ok, N, HAS_D, HAS_BIAS, BLOCK_D)
            x, pre, dt, a, bx, u_off, dt_ok = _tile_inputs(
                u_ptr, delta_ptr, Bt, b, g, jd, d_ok, p, t_ok, A, bias,
                su_b, su_g, su_d, su_t, sd_b, sd_g, sd_d, sd_t, HAS_BIAS, SOFTPLUS)
            bd = b.to(tl.int64) * dim + d
            dn = bd[:, None] * N + n[None, :]
            h0 = tl.load(ckpt_ptr + (bd * n_tiles + k)[:, None] * N + n[None, :], mask=dn_ok, other=0.0)
            ca, cb = tl.associative_scan((a, bx), 2, _linear)
            h = cb + ca * h0[:, :, None]
            out = _offsets(b, g, jd, p, sy_b, sy_g, sy_d, sy_t)
            gy = tl.load(gy_ptr + _offsets(b, g, jd, p, sg_b, sg_g, sg_d, sg_t), mask=dt_ok, other=0.0).to(tl.float32)
            if HAS_Z:
                zt = tl.load(z_ptr + u_off, mask=dt_ok, other=0.0).to(tl.float32)
                sig = tl.sigmoid(zt)
                y = tl.sum(h * Ct[None, :, :], axis=1) + Dv[:, None] * x
                gz = gy * y * sig * (1.0 + zt * (1.0 - sig))  # silu'(z) = sig (1 + z (1 - sig))
                tl.store(gz_ptr + out, gz.to(gz_ptr.dtype.element_ty), mask=dt_ok)
                gy = gy * zt * sig
            # decay of the next step, exp(dt_{t+1} A): 1 past the end (the carry stands for lam_L)
            dt1_ok = d_ok[:, None] & t1_ok[None, :]
            pre1 = tl.load(delta_ptr + _offsets(b, g, jd, p1, sd_b, sd_g, sd_d, sd_t), mask=dt1_ok,
                           other=0.0).to(tl.float32)
            _, dt1 = _dt(pre1, dt1_ok, bias, HAS_BIAS, SOFTPLUS)
            a1 = tl.exp(dt1[:, None, :] * A[:, :, None])
            if k == n_tiles - 1:
                carry = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
                if HAS_GLAST:
                    carry = tl.load(glast_ptr + dn, mask=dn_ok, other=0.0).to(tl.float32)
            else:
                carry = tl.load(carry_ptr + dn, mask=dn_ok, other=0.0)
            la, lb = tl.associative_scan((a1, gy[:, None, :] * Ct[None, :, :]), 2, _linear, reverse=True)
            lam = lb + la * carry[:, :, None]
            tl.store(carry_ptr + dn, _first(lam, tt), mask=dn_ok)
            lam_hb = lam * (h - bx)  # lam_t exp(dt_t A) h_{t-1}: d loss / d (dt_t A)
            tl.store(gA_ptr + (bd * n_tiles + k)[:, None] * N + n[None, :],
                     tl.sum(lam_hb * dt[:, None, :], axis=2), mask=dn_ok)
            lam_b = tl.sum(lam * Bt[None, :, :], axis=1)
            gdt = x * lam_b + tl.sum(lam_hb * A[:, :, None], axis=1)
            if SOFTPLUS:
                gdt = tl.where(pre > 20.0, gdt, gdt * tl.sigmoid(pre))
            gdt = tl.where(dt_ok, gdt, 0.0)
            tl.store(gbias_ptr + bd * n_tiles + k, tl.sum(gdt, axis=1), mask=d_ok)
            tl.store(gD_ptr + bd * n_tiles + k, tl.sum(gy * x, axis=1), mask=d_ok)
            tl.store(gu_ptr + out, (gy * Dv[:, None] + dt * lam_b).to(gu_ptr.dtype.element_ty), mask=dt_ok)
            tl.store(gdelta_ptr + out, gdt.to(gdelta_ptr.dtype.element_ty), mask=dt_ok)
            gB += tl.sum(lam * (dt * x)[:, None, :], axis=0)
            gC += tl.sum(gy[:, None, :] * h, axis=0)
        tl.store(gB_ptr + gbc + p[None, :], gB, mask=n_ok[:, None] & t_ok[None, :])
        tl.store(gC_ptr + gbc + p[None, :], gC, mask=n_ok[:, None] & t_ok[None, :])


def tile_length(length: int, n_state: int, elements: int = TILE_ELEMENTS) -> int:
    """Time steps per tile: a power of two ``T``, at most ``elements / N`` and ``L`` rounded up,
    the one of the four largest that costs least, ``n_tiles * (T + 32 + 16 N)``: the padded steps
    plus a tile's fixed cost and state traffic (a state saved, carried and summed per tile)."""
    cap = min(max(elements // pow2(n_state), 1), pow2(length))
    candidates = [cap >> i for i in range(4) if cap >> i]
    return min(candidates, key=lambda t: (cdiv(length, t) * (t + 32 + 16 * n_state), -t))


def tile_states_shape(u_shape: tuple[int, int, int], n_state: int, tile: int | None = None) -> tuple[int, ...]:
    """Shape of the forward's tile-start states for ``u`` ``(batch, dim, L)``: ``(batch, dim, n_tiles, N)``."""
    batch, dim, length = u_shape
    return batch, dim, cdiv(length, tile or tile_length(length, n_state)), n_state


class Strides(NamedTuple):
    """Element strides of a family of tensors: batch, group, channel (or state for ``B``/``C``),
    and position."""

    b: int
    g: int
    d: int
    t: int


def sequence_strides(t: torch.Tensor, groups: int) -> Strides:
    """:class:`Strides` of a ``(batch, dim, L)`` view whose channels form ``groups`` groups."""
    return Strides(t.stride(0), t.shape[1] // groups * t.stride(1), t.stride(1), t.stride(2))


class Layout(NamedTuple):
    """Where a launch reads and writes: the strides of ``u`` (and ``z``), ``delta``, ``B`` (and
    ``C``), the outputs (``y``; ``du``, ``ddelta``, ``dz``) and ``dy``; ``routes``: ``(H, W)`` when
    the groups are VMamba's four routes over an ``H x W`` map (positions by :func:`_positions`),
    else None (position = time step)."""

    u: Strides
    delta: Strides
    bc: Strides
    out: Strides
    grad_out: Strides
    routes: tuple[int, int] | None = None


class Problem:
    """Sizes, inputs, layout and launch flags shared by the forward and backward launchers.

    ``u``, ``delta``, ``B``, ``C``, ``z`` are read through ``layout`` (their shapes are not used);
    ``A`` ``(dim, N)``, ``D``, ``delta_bias`` ``(dim,)``; ``sizes``: ``(batch, dim, G, L)``.
    """

    def __init__(self, u, delta, A, B, C, D, z, delta_bias, delta_softplus, tile, sizes, layout: Layout):
        self.batch, self.dim, self.groups, self.length = sizes
        self.device = u.device
        self.n_state = A.shape[1]
        self.dpg = self.dim // self.groups
        self.block_t = tile or tile_length(self.length, self.n_state)
        self.n_tiles = cdiv(self.length, self.block_t)
        D, delta_bias = (t.contiguous() if t is not None else None for t in (D, delta_bias))
        # An absent optional input is passed as u: the kernels never read it (HAS_* flags).
        self.tensors = [u, delta, A.contiguous(), B, C, *(t if t is not None else u for t in (D, z, delta_bias))]
        self.strides = (*layout.u, *layout.delta, *layout.bc, *layout.out)
        self.grad_strides = tuple(layout.grad_out)
        height, width = layout.routes or (1, 1)
        self.sizes = (self.length, self.dim, self.dpg, self.n_state, self.groups, self.n_tiles, height, width)
        self.flags = dict(HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None,
                          SOFTPLUS=bool(delta_softplus), ROUTES=layout.routes is not None,
                          BLOCK_N=pow2(self.n_state), BLOCK_T=self.block_t)

    def states(self, *shape):
        """An fp32 ``(batch, dim, *shape)`` buffer."""
        return torch.empty(self.batch, self.dim, *shape, dtype=torch.float32, device=self.device)



def slice_length(batch: int, groups: int, dpg: int) -> int:
    """Channels per backward slice: enough slices for :data:`BWD_PROGRAMS` programs, each a
    multiple of :data:`SLICE_MULTIPLE` channels."""
    slices = cdiv(BWD_PROGRAMS, batch * groups)
    return cdiv(cdiv(dpg, slices), SLICE_MULTIPLE) * SLICE_MULTIPLE


def launch_forward(p: Problem, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs the forward kernel into ``y``; returns ``(last_state, tile_states)`` fp32."""
    last, tile_states = p.states(p.n_state), p.states(p.n_tiles, p.n_state)

    def grid(meta):
        return p.batch * p.groups, cdiv(p.dpg, meta["BLOCK_D"])

    _selective_scan_fwd_kernel[grid](*p.tensors, y, last, tile_states, *p.sizes, *p.strides, **p.flags)
    return last, tile_states


def launch_backward(p: Problem, grad_y, grad_last, tile_states, gu, gdelta, gz):
    """Runs the backward kernel into ``gu``, ``gdelta``, ``gz`` (``gz`` ignored without ``z``);
    returns the fp32 sums ``(dA (dim, N), dB, dC (batch, G, N, L) by position, dD, d delta_bias
    (dim,))``, added over batch, tiles and channel slices in a fixed order."""
    slice_len = slice_length(p.batch, p.groups, p.dpg)
    n_slices = cdiv(p.dpg, slice_len)
    gB = torch.empty(p.batch, p.groups, n_slices, p.n_state, p.length, dtype=torch.float32, device=p.device)
    gC = torch.empty_like(gB)
    gA = p.states(p.n_tiles, p.n_state)
    gD, gbias = p.states(p.n_tiles), p.states(p.n_tiles)
    carry = p.states(p.n_state)
    has_glast = grad_last is not None
    _selective_scan_bwd_kernel[(p.batch * p.groups, n_slices)](
        *p.tensors, grad_y, grad_last.contiguous() if has_glast else carry, tile_states.contiguous(), carry,
        gu, gdelta, gz, gB, gC, gA, gD, gbias, *p.sizes, slice_len, *p.strides, *p.grad_strides,
        HAS_GLAST=has_glast, **p.flags,
    )
    return gA.sum((0, 2)), gB.sum(2), gC.sum(2), gD.sum((0, 2)), gbias.sum((0, 2))


def _sequence_problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus, tile) -> Problem:
    """A :class:`Problem` on ``(batch, dim, L)`` inputs of any strides, outputs contiguous."""
    batch, dim, length = u.shape
    if B.dim() == 3:
        B, C = B[:, None], C[:, None]
    if B.stride() != C.stride():  # one set of strides for B and C
        B, C = B.contiguous(), C.contiguous()
    if z is not None and z.stride() != u.stride():  # one set for u and z
        u, z = u.contiguous(), z.contiguous()
    groups = B.shape[1]
    out = Strides(dim * length, dim // groups * length, length, 1)
    layout = Layout(sequence_strides(u, groups), sequence_strides(delta, groups), Strides(*B.stride()), out, out)
    return Problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus, tile, (batch, dim, groups, length), layout)


def selective_scan_fwd(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                       out_dtype=None, tile=None):
    """Forward: ``(y, last_state, tile_states)``, ``y`` ``(batch, dim, L)`` contiguous in
    ``out_dtype`` (default ``u.dtype``), ``last_state`` ``(batch, dim, N)`` and ``tile_states``
    (the state at every tile start, :func:`tile_states_shape`) fp32. Shapes as
    :func:`ppma.ops.selective_scan` (B/C ``(batch, N, L)`` or ``(batch, G, N, L)``), any strides,
    any float dtypes, fp32 state. ``tile``: time steps per tile, a power of two (default
    :func:`tile_length`). No input checks."""
    p = _sequence_problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus, tile)
    y = torch.empty(u.shape, dtype=out_dtype or u.dtype, device=u.device)
    return (y, *launch_forward(p, y))


def selective_scan_bwd(grad_y, grad_last, tile_states, u, delta, A, B, C, D=None, z=None, delta_bias=None,
                       delta_softplus=False, tile=None):
    """Backward: gradients ``[du, ddelta, dA, dB, dC, dD, dz, ddelta_bias]`` shaped and typed like
    the inputs, contiguous (``None`` for an absent input), given ``grad_y`` ``(batch, dim, L)``,
    ``grad_last`` ``(batch, dim, N)`` (or None) and the forward's ``tile_states`` (same ``tile``):
    each tile's states are recomputed in registers from its start."""
    p = _sequence_problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus, tile)
    gu = torch.empty(u.shape, dtype=u.dtype, device=u.device)
    gdelta = torch.empty(delta.shape, dtype=delta.dtype, device=u.device)
    gz = torch.empty(z.shape, dtype=z.dtype, device=u.device) if z is not None else gu
    gA, gB, gC, gD, gbias = launch_backward(p, grad_y.contiguous(), grad_last, tile_states, gu, gdelta, gz)
    return [
        gu, gdelta, gA.to(A.dtype), gB.reshape(B.shape).to(B.dtype), gC.reshape(C.shape).to(C.dtype),
        gD.to(D.dtype) if D is not None else None,
        gz if z is not None else None,
        gbias.to(delta_bias.dtype) if delta_bias is not None else None,
    ]


def modelled_bytes(batch: int, dim: int, n_state: int, length: int, groups: int, itemsize: int, has_z: bool,
                   backward: bool) -> dict[str, int]:
    """Bytes the kernels move to and from GPU memory on ``(batch, dim, L)`` sequences whose inputs
    and ``y`` take ``itemsize`` bytes a value, against the least any implementation must move.

    ``minimum``: read ``u``, ``delta``, ``B``, ``C``, ``z`` and write ``y``; with ``backward``, read
    them again with ``dy`` and write their gradients. ``triton``: the same plus the tile-start
    states (written forward, read backward), the backward's per-tile sums and adjoint carries, its
    per-slice ``dB``/``dC`` in fp32 and their sum (``B``/``C``, read again by every program of a
    group, forward per channel block and backward per channel slice, are counted once: L2 hits).
    ``A``, ``D``, ``delta_bias`` are left out (``dim * N`` values)."""
    seq = batch * dim * length * itemsize
    bc = 2 * batch * groups * n_state * length * itemsize  # B and C
    inputs = (3 if has_z else 2) * seq + bc  # u, delta (z), B, C
    n_tiles = cdiv(length, tile_length(length, n_state))
    states = 4 * batch * dim * (n_tiles + 1) * n_state
    minimum = inputs + seq
    triton_bytes = minimum + states
    if backward:
        minimum += 2 * inputs + seq  # inputs and dy read, their gradients written
        n_slices = cdiv(dim // groups, slice_length(batch, groups, dim // groups))
        partials = 2 * 4 * batch * groups * n_slices * n_state * length
        tile_sums = 4 * batch * dim * n_tiles * (n_state + 2)
        carries = 2 * 4 * batch * dim * n_state * n_tiles
        dbc = 2 * 4 * batch * groups * n_state * length  # the fp32 sums of dB, dC, read again in their dtype
        triton_bytes += 2 * inputs + seq + states + 2 * partials + tile_sums + carries + 2 * dbc
    return {"minimum": minimum, "triton": triton_bytes}


def _largest_tile(config: triton.Config, block_n: int, per_thread: int, elements: int) -> int:
    """The longest tile (a power of two, at most ``elements / BLOCK_N``) on which the launcher
    may run ``config``."""
    block_t = max(elements // block_n, 1)
    while block_t > 1 and _elements_per_thread(config, block_n, block_t) > per_thread:
        block_t //= 2
    return block_t


def compile_cases() -> list[tuning.CompileCase]:
    """Every configuration of both kernels at its longest tile, for fp32, fp16 and bf16 inputs,
    ``N`` of 1 and 16: on ``(batch, dim, L)`` sequences (time strides 1, as contiguous inputs
    specialize) with every optional input; along VMamba's routes (channel strides 1, ``D``,
    ``delta_bias``, softplus, tiles of at most ``ROUTE_TILE_ELEMENTS``). Named ``'<kernel> |
    <variant> | <config>'`` (:func:`_variant`). fp16 rows take bf16's numbers (``same_as``: the
    same layout), uncompiled."""
    from .routes import ROUTE_TILE_ELEMENTS

    sequences = ("u_ptr", "delta_ptr", "B_ptr", "C_ptr", "z_ptr", "y_ptr", "gy_ptr", "gu_ptr", "gdelta_ptr", "gz_ptr")
    variants = [  # (unit-stride axis, options, tile elements)
        ("t", dict(HAS_D=True, HAS_Z=True, HAS_BIAS=True, SOFTPLUS=True, ROUTES=False), TILE_ELEMENTS),
        ("d", dict(HAS_D=True, HAS_Z=False, HAS_BIAS=True, SOFTPLUS=True, ROUTES=True), ROUTE_TILE_ELEMENTS),
    ]
    cases = []
    for tuned, prune_budget, extra in ((_selective_scan_fwd_kernel, FWD_ELEMENTS_PER_THREAD, {}),
                                       (_selective_scan_bwd_kernel, BWD_ELEMENTS_PER_THREAD, {"HAS_GLAST": True})):
        for dtype in ("fp32", "fp16", "bf16"):
            for axis, options, elements in variants:
                full = tuning.signature(tuned, {})  # every non-constexpr argument
                full.update({name: f"*{dtype}" if name in sequences else "*fp32" for name in full if name.endswith("_ptr")})
                unit = {name: 1 for name in (f"s{family}_{'n' if family == 'bc' and axis == 'd' else axis}"
                                             for family in ("u", "d", "bc", "y", "g")) if name in full}
                signature = {name: kind for name, kind in full.items() if name not in unit}
                for block_n in (1, 16):
                    tile = functools.partial(_largest_tile, block_n=block_n, per_thread=prune_budget, elements=elements)
                    cases += tuning.cases_of(tuned, signature, dict(unit, **options, **extra, BLOCK_N=block_n),
                                             lambda config, tile=tile: {"BLOCK_T": tile(config)}, fp16_as_bf16=True)
    return cases
