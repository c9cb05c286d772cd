"""Fused Triton kernels of the polyline scan on 2-D and 3-D grids: all the passes of an order in
one kernel.

On an ``(H, W)`` grid, ``y = L x`` is ``W(H(x))`` for V2H, ``H(W(x))`` for H2V and their sum for
``'both'``, where ``H`` / ``W`` are the bidirectional 1-D decayed scans along the columns (decays
``beta``) / rows (``alpha``) of :mod:`.decay_scan` (``y_p = h_p + g_p - u_p``, causal ``h`` and
anti-causal ``g``). On a ``(T, H, W)`` grid the frame scan ``F`` (decays ``gamma``) joins them:
``W(H(F(x)))`` for V2H, ``F(H(W(x)))`` for H2V.

One program owns one ``(batch, head)`` plane (or volume: every frame) and ``BLOCK_C`` channels and
walks it in tiles of ``TILE_H`` whole rows of every frame, ``(BLOCK_T, TILE_H, BLOCK_W, BLOCK_C)``
(``BLOCK_T = 1`` on 2-D grids) with the channels (the contiguous axis) innermost, so loads and
stores are coalesced vectors. Inside a tile every 1-D scan along frames or rows is a parallel
linear scan in registers (``tl.associative_scan`` of ``u -> a * state + u``; decays ``<= 1``, so
nothing overflows or cancels); across tiles the scans along ``H`` are joined by carried states:

- sweep 1, top to bottom: the causal ``H``-scan's state entering each tile (of ``F x`` for V2H,
  of ``W x`` for H2V) is stored, ``TILE_H`` times smaller than ``x``;
- sweep 2, bottom to top: each tile's ``H``-scans start from the stored state (causal) and from
  the state carried in registers from the tile below (anti-causal); the ``W``- and ``F``-scans run
  on whole rows and frame lines; ``y`` is written once.

Forward traffic: ``x`` read twice and ``y`` written once, plus ``2 * 4 / TILE_H`` bytes per element
and carried quantity (the model of ``kernels/bench/polyline_scan.py``), on 3-D grids as on 2-D.

Backward: ``dx = L^T dy`` is the forward of the swapped order (every 1-D mask is symmetric);
:func:`decay_grads` gives the decay gradients in the same two sweeps. For a 1-D scan with input
``u`` and output gradient ``g``, ``dlog_a_p = sum_c G_p (h_p - u_p) + (H_p - g_p) X_p`` (``h``/``X``
causal/anti-causal scans of ``u``, ``H``/``G`` of ``g``; ``h_p - u_p = a_p h_{p-1}``, the paths
crossing the edge ``p-1 -> p``). V2H: ``F`` step ``u = x``, ``g = H W dy``; ``H`` step ``u = F x``,
``g = W dy``; ``W`` step ``u = H F x``, ``g = dy``. H2V: ``W`` step ``u = x``, ``g = H F dy``; ``H``
step ``u = W x``, ``g = F dy``; ``F`` step ``u = H W x``, ``g = dy`` (2-D: ``F`` is the identity).
Channel sums are written per channel block and summed afterwards (no atomics).

Rows of more than :data:`MAX_BLOCK_W` tokens (3-D: frames times row tokens, each padded to a power
of two, more than half as many) do not fit a tile: :mod:`.scan` runs them as 1-D passes of :mod:`.decay_scan`. Under
Triton's interpreter the scans run by doubling steps of ``tl.gather`` (same results; the
interpreter runs ``tl.associative_scan`` one element at a time), see :func:`_scan`.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.runtime import interpreted
from ..common.strided import accumulation_dtype, cdiv, pow2, tl_dtype
from . import decay_scan

# Most tokens (frames x row tokens, each padded to a power of two) a tile row holds.
MAX_BLOCK_W = 256
# The oldest Triton whose GPU compiler lowers every configuration's scans. Triton 3.6 (the
# torch 2.11 images') fails on narrow tiles, 2-D rows of 4 to 16 tokens and most 3-D tiles, in
# ScanOpToLLVM (a layout assertion; checked compile-only for sm_80/sm_90, channels-last launches).
# With an older Triton every grid runs the 1-D passes of :mod:`.decay_scan`, which compile there.
FUSED_SINCE = (3, 8)
# Tile elements per thread that the configurations may use on 2-D and 3-D grids (about fifteen
# tiles are live forward and thirty backward, more with the frame scans): the most that compile
# without spills on sm_80 and sm_90 (the resource table, tests/kernels/test_plane_scan_compiles.py).
FWD_ELEMENTS_PER_THREAD = (16, 8)
BWD_ELEMENTS_PER_THREAD = (8, 4)


def _configs(shapes):
    return [triton.Config({"TILE_H": th, "BLOCK_C": bc}, num_warps=w) for th, bc, w in shapes]


# (TILE_H, BLOCK_C, num_warps); the first one is the interpreter's.
# (2, 8, 4) forward at 128-token rows, (2, 8, 8) at 256, and backward (8, 8, 8) at 32, (4, 8, 8)
# at 64 and (1, 8, 8) at 256 spilled on sm_80/sm_90: left out.
FWD_CONFIGS = _configs([(8, 16, 8), (8, 8, 8), (4, 16, 8), (4, 8, 8), (4, 8, 4), (1, 8, 8)])
BWD_CONFIGS = _configs([(4, 16, 4), (4, 8, 4), (2, 8, 4), (2, 8, 8), (1, 4, 4)])


def _register_fit(per_thread, configs, nargs, **launch):
    """``early_config_prune`` of the kernels (:func:`tuning.autotune`'s ``prune``): the
    configurations whose tile fills half to all of ``per_thread`` (2-D, 3-D) elements a thread at
    the launch's ``BLOCK_T x BLOCK_W`` (smaller tiles move more carried state) with no more
    channels than needed; else the largest that fits, else the smallest."""
    args = {**nargs, **launch}
    per_thread = per_thread[args["BLOCK_T"] > 1]

    def per_thread_of(c):
        return c.kwargs["TILE_H"] * args["BLOCK_T"] * args["BLOCK_W"] * c.kwargs["BLOCK_C"] / (32 * c.num_warps)

    fit = [c for c in configs if per_thread_of(c) <= per_thread and c.kwargs["BLOCK_C"] <= max(pow2(args["C"]), 4)]
    full = [c for c in fit if per_thread_of(c) >= per_thread / 2]
    return full or sorted(fit, key=per_thread_of)[-1:] or [min(configs, key=per_thread_of)]


def _launchable(kernel, per_thread: tuple[int, int], block_t: int, block_w: int, channels: int):
    """The configurations a launch of ``kernel`` may run (the interpreter's single one, or
    :func:`_register_fit`'s)."""
    if len(kernel.configs) == 1:
        return kernel.configs
    return _register_fit(per_thread, kernel.configs, {"C": channels}, BLOCK_T=block_t, BLOCK_W=block_w)


def _variant(args) -> str:
    """``'bf16 acc fp32 V2H=True H2V=True BLOCK_T=1 BLOCK_W=64'``: a launch's dtypes and constexprs."""
    return (f"{args['x_ptr'][1:]} acc {args['ACC']} V2H={args['V2H']} H2V={args['H2V']} BLOCK_T={args['BLOCK_T']} "
            f"BLOCK_W={args['BLOCK_W']}")


@triton.jit
def _link(a_l, u_l, a_r, u_r):
    """Two steps of ``state -> a * state + u``, left first, as one."""
    return a_l * a_r, u_l * a_r + u_r


@triton.jit
def _axis_positions(u, AXIS: tl.constexpr):
    """Index along ``AXIS`` of every element of the 4-D ``u``."""
    if AXIS == 0:
        pos = tl.arange(0, u.shape[0])[:, None, None, None]
    elif AXIS == 1:
        pos = tl.arange(0, u.shape[1])[None, :, None, None]
    elif AXIS == 2:
        pos = tl.arange(0, u.shape[2])[None, None, :, None]
    else:
        pos = tl.arange(0, u.shape[3])[None, None, None, :]
    return tl.broadcast_to(pos, u.shape)


@triton.jit
def _scan(a, u, AXIS: tl.constexpr, REVERSE: tl.constexpr, INTERPRET: tl.constexpr):
    """``(prod, state)`` along ``AXIS`` of the 4-D ``a``, ``u`` (same shape): ``state_p = u_p +
    a_p state_{p-1}`` (``REVERSE``: ``state_{p+1}``), ``prod_p`` the product of ``a`` from the scan's
    first element through ``p``. Under the interpreter by ``log2(n)`` doubling steps
    (Hillis-Steele) of whole-tensor gathers, inline (each nested call costs the interpreter more
    than the step)."""
    if INTERPRET:
        pos = _axis_positions(u, AXIS)
        n: tl.constexpr = u.shape[AXIS]
        for step in tl.static_range(16):
            if (1 << step) < n:
                if REVERSE:
                    src = pos + (1 << step)
                    ok = src < n
                else:
                    src = pos - (1 << step)
                    ok = src >= 0
                src = tl.where(ok, src, pos)
                a_prev, u_prev = tl.gather(a, src, AXIS), tl.gather(u, src, AXIS)
                u = tl.where(ok, u_prev * a + u, u)
                a = tl.where(ok, a_prev * a, a)
        out = a, u
    else:
        out = tl.associative_scan((a, u), AXIS, _link, reverse=REVERSE)
    return out


@triton.jit
def _line_scans(a, a_next, u, AXIS: tl.constexpr, INTERPRET: tl.constexpr):
    """Causal and anti-causal scans of ``u`` along ``AXIS`` (lines wholly in the tile: frames,
    axis 0, or rows, axis 2): ``h_p = u_p + a_p h_{p-1}``, ``g_p = u_p + a_next_p g_{p+1}``."""
    _, h = _scan(a, u, AXIS, False, INTERPRET)
    _, g = _scan(a_next, u, AXIS, True, INTERPRET)
    return h, g


@triton.jit
def _column_scans(a, a_next, u, carry_in, carry_below, INTERPRET: tl.constexpr):
    """Causal and anti-causal scans of ``u`` down the tile's columns (axis 1), joined to the rest
    of the columns by ``carry_in`` (causal state of the row above the tile) and ``carry_below``
    (anti-causal state of the row below it), both ``(BLOCK_T, BLOCK_W, BLOCK_C)``."""
    into, h = _scan(a, u, 1, False, INTERPRET)
    out_of, g = _scan(a_next, u, 1, True, INTERPRET)
    return h + into * carry_in[:, None, :, :], g + out_of * carry_below[:, None, :, :]


@triton.jit
def _first_row(t):
    """Row 0 of the tile ``t``: ``(BLOCK_T, BLOCK_W, BLOCK_C)``."""
    return tl.sum(tl.where(_axis_positions(t, 1) == 0, t, 0.0), axis=1)


@triton.jit
def _carry_down(state, log_b, u):
    """The causal column state after the tile, from the state before it (sweep 1): ``sum_p
    exp(sum_{r > p} log_b_r) u_p + exp(sum_r log_b_r) state`` (sums of log decays in the tile)."""
    after = tl.cumsum(log_b, axis=1, reverse=True) - log_b
    return tl.sum(tl.exp(after) * u, axis=1) + tl.exp(tl.sum(log_b, axis=1)) * state


@triton.jit
def _tile(ptr, base, frames, rows, cols, chans, s_t, s_row, s_col, s_chan, T, H, W, C, ACC: tl.constexpr):
    """``(BLOCK_T, TILE_H, BLOCK_W, BLOCK_C)`` tile of a ``(T, H, W, C)`` volume in ``ACC``, zero
    outside."""
    mask = (frames < T) & (rows < H) & (cols < W) & (chans < C)
    offs = frames * s_t + rows * s_row + cols * s_col + chans * s_chan
    return tl.load(ptr + base + offs, mask=mask, other=0.0).to(ACC)


@triton.jit
def _decays(ptr, base, frames, rows, cols, s_t, s_row, s_col, T, H, W, ACC: tl.constexpr):
    """``(BLOCK_T, TILE_H, BLOCK_W, 1)`` log decays and decays at ``(frames, rows, cols)``: 0 and 0
    outside the grid (a scan stops there)."""
    inside = (frames < T) & (rows < H) & (cols < W)
    log = tl.load(ptr + base + frames * s_t + rows * s_row + cols * s_col, mask=inside, other=0.0).to(ACC)
    return log, tl.where(inside, tl.exp(log), 0.0)


@triton.jit
def _decay_pair(ptr, base, frames, rows, cols, s_t, s_row, s_col, T, H, W, AXIS: tl.constexpr, like,
                ACC: tl.constexpr):
    """The decays ``a`` at ``(frames, rows, cols)`` and ``a_next`` one step further along
    ``AXIS`` (0 frames, 1 rows, 2 columns), broadcast to the shape of the tile ``like``."""
    _, a = _decays(ptr, base, frames, rows, cols, s_t, s_row, s_col, T, H, W, ACC)
    if AXIS == 0:
        _, a_next = _decays(ptr, base, frames + 1, rows, cols, s_t, s_row, s_col, T, H, W, ACC)
    elif AXIS == 1:
        _, a_next = _decays(ptr, base, frames, rows + 1, cols, s_t, s_row, s_col, T, H, W, ACC)
    else:
        _, a_next = _decays(ptr, base, frames, rows, cols + 1, s_t, s_row, s_col, T, H, W, ACC)
    return tl.broadcast_to(a, like.shape), tl.broadcast_to(a_next, like.shape)


@tuning.autotune(FWD_CONFIGS, key=["T", "H", "W", "C"], variant=_variant,
                 prune=functools.partial(_register_fit, FWD_ELEMENTS_PER_THREAD))
@triton.jit
def _plane_fwd_kernel(
    x_ptr, la_ptr, lb_ptr, lc_ptr, y_ptr, carry_ptr,
    heads, T, H, W, C,
    sx0, sx1, sxt, sxr, sxw, sxc,
    sa0, sa1, sat, sar, saw,
    sb0, sb1, sbt, sbr, sbw,
    sc0, sc1, sct, scr, scw,
    sy0, sy1, syt, syr, syw, syc,
    V2H: tl.constexpr, H2V: tl.constexpr, ACC: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr, INTERPRET: tl.constexpr, TILE_H: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """``y = L x`` on one plane's (or volume's) channel block (module docstring); ``carry_ptr``:
    ``ACC`` scratch of at least ``planes * n_cblocks * n_tiles * (V2H + H2V) * BLOCK_T * BLOCK_W *
    BLOCK_C``. ``lc_ptr``: the frame decays (read when ``T > 1``)."""
    HAS_T: tl.constexpr = BLOCK_T > 1  # frame scans (one frame: none, the identity)
    cb, plane = tl.program_id(0), tl.program_id(1)
    b, hd = (plane // heads).to(tl.int64), (plane % heads).to(tl.int64)
    x_base, y_base = b * sx0 + hd * sx1, b * sy0 + hd * sy1
    a_base, b_base, c_base = b * sa0 + hd * sa1, b * sb0 + hd * sb1, b * sc0 + hd * sc1
    frames = tl.arange(0, BLOCK_T)[:, None, None, None]
    r = tl.arange(0, TILE_H)[None, :, None, None]
    cols = tl.arange(0, BLOCK_W)[None, None, :, None]
    chans = cb * BLOCK_C + tl.arange(0, BLOCK_C)[None, None, None, :]
    n_tiles = tl.cdiv(H, TILE_H)
    NQ: tl.constexpr = V2H + H2V
    STATE: tl.constexpr = BLOCK_T * BLOCK_W * BLOCK_C
    state_offs = ((tl.arange(0, BLOCK_T)[:, None, None] * BLOCK_W + tl.arange(0, BLOCK_W)[None, :, None]) * BLOCK_C
                  + tl.arange(0, BLOCK_C)[None, None, :])
    carry_base = carry_ptr + (plane.to(tl.int64) * tl.num_programs(0) + cb) * n_tiles * NQ * STATE + state_offs

    state_x = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)  # causal column state of T x
    state_w = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)  # ... of W x
    for t in range(n_tiles):  # sweep 1, top to bottom: the states entering each tile
        rows = t * TILE_H + r
        slot = carry_base + t * NQ * STATE
        x = _tile(x_ptr, x_base, frames, rows, cols, chans, sxt, sxr, sxw, sxc, T, H, W, C, ACC)
        log_b, _ = _decays(lb_ptr, b_base, frames, rows, cols, sbt, sbr, sbw, T, H, W, ACC)
        if V2H:
            u = x
            if HAS_T:
                a_t, a_t_next = _decay_pair(lc_ptr, c_base, frames, rows, cols, sct, scr, scw, T, H, W, 0, x, ACC)
                h, g = _line_scans(a_t, a_t_next, x, 0, INTERPRET)
                u = h + g - x
            tl.store(slot, state_x)
            state_x = _carry_down(state_x, log_b, u)
        if H2V:
            a_w, a_w_next = _decay_pair(la_ptr, a_base, frames, rows, cols, sat, sar, saw, T, H, W, 2, x, ACC)
            h, g = _line_scans(a_w, a_w_next, x, 2, INTERPRET)
            tl.store(slot + V2H * STATE, state_w)
            state_w = _carry_down(state_w, log_b, h + g - x)
    tl.debug_barrier()  # sweep 2 reads the states sweep 1 stored

    below_x = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)  # anti-causal column state of T x below the tile
    below_w = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)  # ... of W x
    for i in range(n_tiles):  # sweep 2, bottom to top
        t = n_tiles - 1 - i
        rows = t * TILE_H + r
        slot = carry_base + t * NQ * STATE
        x = _tile(x_ptr, x_base, frames, rows, cols, chans, sxt, sxr, sxw, sxc, T, H, W, C, ACC)
        a_w, a_w_next = _decay_pair(la_ptr, a_base, frames, rows, cols, sat, sar, saw, T, H, W, 2, x, ACC)
        a_h, a_h_next = _decay_pair(lb_ptr, b_base, frames, rows, cols, sbt, sbr, sbw, T, H, W, 1, x, ACC)
        if HAS_T:
            a_t, a_t_next = _decay_pair(lc_ptr, c_base, frames, rows, cols, sct, scr, scw, T, H, W, 0, x, ACC)
        y = tl.zeros(x.shape, dtype=ACC)
        if V2H:  # W(H(T x))
            u = x
            if HAS_T:
                h, g = _line_scans(a_t, a_t_next, x, 0, INTERPRET)
                u = h + g - x
            h, g = _column_scans(a_h, a_h_next, u, tl.load(slot), below_x, INTERPRET)
            below_x = _first_row(g)
            hx = h + g - u
            h, g = _line_scans(a_w, a_w_next, hx, 2, INTERPRET)
            y += h + g - hx
        if H2V:  # T(H(W x))
            h, g = _line_scans(a_w, a_w_next, x, 2, INTERPRET)
            wx = h + g - x
            h, g = _column_scans(a_h, a_h_next, wx, tl.load(slot + V2H * STATE), below_w, INTERPRET)
            below_w = _first_row(g)
            hwx = h + g - wx
            if HAS_T:
                h, g = _line_scans(a_t, a_t_next, hwx, 0, INTERPRET)
                hwx = h + g - hwx
            y += hwx
        mask = (frames < T) & (rows < H) & (cols < W) & (chans < C)
        offs = frames * syt + rows * syr + cols * syw + chans * syc
        tl.store(y_ptr + y_base + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _edge_grad(h_u, x_u, u, h_g, x_g, g):
    """Per element, the decay gradient's term of one 1-D scan (module docstring), summed over
    channels: ``(BLOCK_T, TILE_H, BLOCK_W)``."""
    return tl.sum(x_g * (h_u - u) + (h_g - g) * x_u, axis=3)


@tuning.autotune(BWD_CONFIGS, key=["T", "H", "W", "C"], variant=_variant,
                 prune=functools.partial(_register_fit, BWD_ELEMENTS_PER_THREAD))
@triton.jit
def _plane_bwd_kernel(
    x_ptr, g_ptr, la_ptr, lb_ptr, lc_ptr, dla_ptr, dlb_ptr, dlc_ptr, carry_ptr,
    heads, T, H, W, C,
    sx0, sx1, sxt, sxr, sxw, sxc,
    sg0, sg1, sgt, sgr, sgw, sgc,
    sa0, sa1, sat, sar, saw,
    sb0, sb1, sbt, sbr, sbw,
    sc0, sc1, sct, scr, scw,
    V2H: tl.constexpr, H2V: tl.constexpr, ACC: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr, INTERPRET: tl.constexpr, TILE_H: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Per channel block, the decay gradients of ``y = L x`` for the output gradient ``g``
    (module docstring). ``dla_ptr``/``dlb_ptr``/``dlc_ptr`` (the last only with ``HAS_T``):
    ``(n_cblocks, planes, T, H, W)`` partial sums; ``carry_ptr``: ``ACC`` scratch of at least
    ``planes * n_cblocks * n_tiles * 2 (V2H + H2V) * BLOCK_T * BLOCK_W * BLOCK_C``."""
    HAS_T: tl.constexpr = BLOCK_T > 1  # frame scans (one frame: none, the identity)
    cb, plane = tl.program_id(0), tl.program_id(1)
    b, hd = (plane // heads).to(tl.int64), (plane % heads).to(tl.int64)
    x_base, g_base = b * sx0 + hd * sx1, b * sg0 + hd * sg1
    a_base, b_base, c_base = b * sa0 + hd * sa1, b * sb0 + hd * sb1, b * sc0 + hd * sc1
    frames = tl.arange(0, BLOCK_T)[:, None, None, None]
    r = tl.arange(0, TILE_H)[None, :, None, None]
    cols = tl.arange(0, BLOCK_W)[None, None, :, None]
    chans = cb * BLOCK_C + tl.arange(0, BLOCK_C)[None, None, None, :]
    n_tiles = tl.cdiv(H, TILE_H)
    NQ: tl.constexpr = 2 * (V2H + H2V)
    STATE: tl.constexpr = BLOCK_T * BLOCK_W * BLOCK_C
    state_offs = ((tl.arange(0, BLOCK_T)[:, None, None] * BLOCK_W + tl.arange(0, BLOCK_W)[None, :, None]) * BLOCK_C
                  + tl.arange(0, BLOCK_C)[None, None, :])
    carry_base = carry_ptr + (plane.to(tl.int64) * tl.num_programs(0) + cb) * n_tiles * NQ * STATE + state_offs

    # Causal column states: V2H of T x and W dy, H2V of W x and T dy.
    state_x = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)
    state_wg = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)
    state_wx = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)
    state_g = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)
    for t in range(n_tiles):  # sweep 1, top to bottom
        rows = t * TILE_H + r
        slot = carry_base + t * NQ * STATE
        x = _tile(x_ptr, x_base, frames, rows, cols, chans, sxt, sxr, sxw, sxc, T, H, W, C, ACC)
        g = _tile(g_ptr, g_base, frames, rows, cols, chans, sgt, sgr, sgw, sgc, T, H, W, C, ACC)
        log_b, _ = _decays(lb_ptr, b_base, frames, rows, cols, sbt, sbr, sbw, T, H, W, ACC)
        a_w, a_w_next = _decay_pair(la_ptr, a_base, frames, rows, cols, sat, sar, saw, T, H, W, 2, x, ACC)
        if HAS_T:
            a_t, a_t_next = _decay_pair(lc_ptr, c_base, frames, rows, cols, sct, scr, scw, T, H, W, 0, x, ACC)
        if V2H:
            tx = x
            if HAS_T:
                h, anti = _line_scans(a_t, a_t_next, x, 0, INTERPRET)
                tx = h + anti - x
            h, anti = _line_scans(a_w, a_w_next, g, 2, INTERPRET)
            tl.store(slot, state_x)
            tl.store(slot + STATE, state_wg)
            state_x = _carry_down(state_x, log_b, tx)
            state_wg = _carry_down(state_wg, log_b, h + anti - g)
        if H2V:
            tg = g
            if HAS_T:
                h, anti = _line_scans(a_t, a_t_next, g, 0, INTERPRET)
                tg = h + anti - g
            h, anti = _line_scans(a_w, a_w_next, x, 2, INTERPRET)
            tl.store(slot + 2 * V2H * STATE, state_wx)
            tl.store(slot + (2 * V2H + 1) * STATE, state_g)
            state_wx = _carry_down(state_wx, log_b, h + anti - x)
            state_g = _carry_down(state_g, log_b, tg)
    tl.debug_barrier()  # sweep 2 reads the states sweep 1 stored

    below_x = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)  # anti-causal column states below the tile
    below_wg = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)
    below_wx = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)
    below_g = tl.zeros((BLOCK_T, BLOCK_W, BLOCK_C), dtype=ACC)
    grad_frames = tl.arange(0, BLOCK_T)[:, None, None]
    grad_rows = tl.arange(0, TILE_H)[None, :, None]
    grad_cols = tl.arange(0, BLOCK_W)[None, None, :]
    grad_base = (cb * tl.num_programs(1) + plane).to(tl.int64) * T * H * W
    for i in range(n_tiles):  # sweep 2, bottom to top
        t = n_tiles - 1 - i
        rows = t * TILE_H + r
        slot = carry_base + t * NQ * STATE
        x = _tile(x_ptr, x_base, frames, rows, cols, chans, sxt, sxr, sxw, sxc, T, H, W, C, ACC)
        g = _tile(g_ptr, g_base, frames, rows, cols, chans, sgt, sgr, sgw, sgc, T, H, W, C, ACC)
        a_w, a_w_next = _decay_pair(la_ptr, a_base, frames, rows, cols, sat, sar, saw, T, H, W, 2, x, ACC)
        a_h, a_h_next = _decay_pair(lb_ptr, b_base, frames, rows, cols, sbt, sbr, sbw, T, H, W, 1, x, ACC)
        if HAS_T:
            a_t, a_t_next = _decay_pair(lc_ptr, c_base, frames, rows, cols, sct, scr, scw, T, H, W, 0, x, ACC)
        grad_a = tl.zeros((BLOCK_T, TILE_H, BLOCK_W), dtype=ACC)
        grad_b = tl.zeros((BLOCK_T, TILE_H, BLOCK_W), dtype=ACC)
        grad_c = tl.zeros((BLOCK_T, TILE_H, BLOCK_W), dtype=ACC)
        if V2H:  # y = W(H(T x)): T step u = x, g = H W dy; H step u = T x, g = W dy; W step u = H T x, g = dy
            tx = x
            if HAS_T:
                h_t, x_t = _line_scans(a_t, a_t_next, x, 0, INTERPRET)
                tx = h_t + x_t - x
            h_g, x_g = _line_scans(a_w, a_w_next, g, 2, INTERPRET)
            wg = h_g + x_g - g
            h_x, x_x = _column_scans(a_h, a_h_next, tx, tl.load(slot), below_x, INTERPRET)
            h_wg, x_wg = _column_scans(a_h, a_h_next, wg, tl.load(slot + STATE), below_wg, INTERPRET)
            below_x, below_wg = _first_row(x_x), _first_row(x_wg)
            grad_b += _edge_grad(h_x, x_x, tx, h_wg, x_wg, wg)
            hx = h_x + x_x - tx
            h_hx, x_hx = _line_scans(a_w, a_w_next, hx, 2, INTERPRET)
            grad_a += _edge_grad(h_hx, x_hx, hx, h_g, x_g, g)
            if HAS_T:
                hwg = h_wg + x_wg - wg
                h_hwg, x_hwg = _line_scans(a_t, a_t_next, hwg, 0, INTERPRET)
                grad_c += _edge_grad(h_t, x_t, x, h_hwg, x_hwg, hwg)
        if H2V:  # y = T(H(W x)): W step u = x, g = H T dy; H step u = W x, g = T dy; T step u = H W x, g = dy
            tg = g
            if HAS_T:
                h_tg, x_tg = _line_scans(a_t, a_t_next, g, 0, INTERPRET)
                tg = h_tg + x_tg - g
            h_x, x_x = _line_scans(a_w, a_w_next, x, 2, INTERPRET)
            wx = h_x + x_x - x
            h_wx, x_wx = _column_scans(a_h, a_h_next, wx, tl.load(slot + 2 * V2H * STATE), below_wx, INTERPRET)
            h_g, x_g = _column_scans(a_h, a_h_next, tg, tl.load(slot + (2 * V2H + 1) * STATE), below_g, INTERPRET)
            below_wx, below_g = _first_row(x_wx), _first_row(x_g)
            grad_b += _edge_grad(h_wx, x_wx, wx, h_g, x_g, tg)
            hg = h_g + x_g - tg
            h_hg, x_hg = _line_scans(a_w, a_w_next, hg, 2, INTERPRET)
            grad_a += _edge_grad(h_x, x_x, x, h_hg, x_hg, hg)
            if HAS_T:
                hwx = h_wx + x_wx - wx
                h_hwx, x_hwx = _line_scans(a_t, a_t_next, hwx, 0, INTERPRET)
                grad_c += _edge_grad(h_hwx, x_hwx, hwx, h_tg, x_tg, g)
        grad_r = t * TILE_H + grad_rows
        offs = grad_base + (grad_frames * H + grad_r) * W + grad_cols
        inside = (grad_frames < T) & (grad_r < H) & (grad_cols < W)
        tl.store(dla_ptr + offs, grad_a, mask=inside)
        tl.store(dlb_ptr + offs, grad_b, mask=inside)
        if HAS_T:
            tl.store(dlc_ptr + offs, grad_c, mask=inside)


ORDERS = {"v2h": (True, False), "h2v": (False, True), "both": (True, True)}


def compiler_fuses(version: str = triton.__version__) -> bool:
    """Whether this Triton's GPU compiler compiles the fused kernels (:data:`FUSED_SINCE`)."""
    return tuple(int(p) for p in version.split(".")[:2]) >= FUSED_SINCE


def fits(width: int, frames: int = 1) -> bool:
    """Whether rows of ``width`` tokens, across ``frames`` frames (3-D grids), fit a tile (else
    :mod:`.scan` runs 1-D passes): :data:`MAX_BLOCK_W` tokens, half as many with frames (half the
    register budget, so that the smallest configuration keeps to it), where they run: Triton's
    interpreter, or a GPU compiler that compiles them (:func:`compiler_fuses`)."""
    return (interpreted() or compiler_fuses()) and pow2(frames) * pow2(width) <= MAX_BLOCK_W // (2 if pow2(frames) > 1 else 1)


def _volumes(x, decays):
    """6-D ``x`` ``(B, heads, T, H, W, C)`` and 5-D decays: 2-D inputs gain a frame axis of 1
    (views)."""
    if x.dim() == 6:
        return x, decays
    return x.unsqueeze(2), [d.unsqueeze(2) for d in decays]


def _decay_args(log_alpha, log_beta, log_gamma):
    """The kernels' decay pointers and strides; without ``log_gamma`` (2-D) ``log_alpha``
    stands in for it, never read."""
    decays = (log_alpha, log_beta, log_alpha if log_gamma is None else log_gamma)
    return decays, [s for d in decays for s in d.stride()]


def _scratch_elements(configs, planes: int, T: int, H: int, W: int, C: int, quantities: int) -> int:
    """Carried-state elements that any of ``configs`` may store."""
    per_state = max(cdiv(H, c.kwargs["TILE_H"]) * cdiv(C, c.kwargs["BLOCK_C"]) * c.kwargs["BLOCK_C"]
                    for c in configs)
    return planes * quantities * pow2(T) * pow2(W) * per_state


def forward(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor, order: str,
            log_gamma: torch.Tensor | None = None) -> torch.Tensor:
    """``L x`` for ``x`` ``(B, heads, H, W, C)`` with decays ``(B, heads, H, W)``, or ``x`` ``(B,
    heads, T, H, W, C)`` with decays ``(B, heads, T, H, W)`` and ``log_gamma`` (any strides; rows
    :func:`fits`). Returns ``x.dtype``, laid out like ``x`` when ``x`` is dense."""
    v2h, h2v = ORDERS[order]
    y = decay_scan._buffer(x, x.dtype)
    if x.numel() == 0:
        return y
    x6, (y6, *decays) = _volumes(x, [y, log_alpha, log_beta] + ([log_gamma] if log_gamma is not None else []))
    batch, heads, T, H, W, C = x6.shape
    acc = accumulation_dtype(x)
    configs = _launchable(_plane_fwd_kernel, FWD_ELEMENTS_PER_THREAD, pow2(T), pow2(W), C)
    carry = decay_scan._buffer(x, acc, (_scratch_elements(configs, batch * heads, T, H, W, C, v2h + h2v),))
    decays, decay_strides = _decay_args(*decays[:2], decays[2] if len(decays) == 3 else None)

    def grid(meta):
        return cdiv(C, meta["BLOCK_C"]), batch * heads

    _plane_fwd_kernel[grid](
        x6, *decays, y6, carry, heads, T, H, W, C, *x6.stride(), *decay_strides, *y6.stride(),
        V2H=v2h, H2V=h2v, ACC=tl_dtype(acc), BLOCK_T=pow2(T), BLOCK_W=pow2(W),
        INTERPRET=interpreted(),
    )
    return y


def decay_grads(x: torch.Tensor, grad: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor,
                order: str, log_gamma: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """``(dlog_alpha, dlog_beta)`` (+ ``dlog_gamma`` with ``log_gamma``) of :func:`forward` for the
    output gradient ``grad`` (shaped like ``x``, any strides), each shaped and typed like its
    decay; sums in fp32 (fp64 for fp64 ``x``)."""
    v2h, h2v = ORDERS[order]
    given = [log_alpha, log_beta] + ([log_gamma] if log_gamma is not None else [])
    if x.numel() == 0:
        return tuple(torch.zeros_like(d) for d in given)
    x6, (g6, *decays) = _volumes(x, [grad, *given])
    batch, heads, T, H, W, C = x6.shape
    acc = accumulation_dtype(x)
    configs = _launchable(_plane_bwd_kernel, BWD_ELEMENTS_PER_THREAD, pow2(T), pow2(W), C)
    n_cblocks = max(cdiv(C, c.kwargs["BLOCK_C"]) for c in configs)
    partial = [decay_scan._buffer(x, acc, (n_cblocks, batch * heads, T, H, W)) for _ in given[:3 if T > 1 else 2]]
    carry = decay_scan._buffer(x, acc, (_scratch_elements(configs, batch * heads, T, H, W, C, 2 * (v2h + h2v)),))
    decays, decay_strides = _decay_args(*decays[:2], decays[2] if len(decays) == 3 else None)

    def grid(meta):
        return cdiv(C, meta["BLOCK_C"]), batch * heads

    _plane_bwd_kernel[grid](
        x6, g6, *decays, *partial, *partial[:3 - len(partial)], carry, heads, T, H, W, C, *x6.stride(), *g6.stride(), *decay_strides,
        V2H=v2h, H2V=h2v, ACC=tl_dtype(acc), BLOCK_T=pow2(T), BLOCK_W=pow2(W),
        INTERPRET=interpreted(),
    )
    used = cdiv(C, _plane_bwd_kernel.best_config.kwargs["BLOCK_C"])
    sums = [torch.empty_like(d).copy_(p[:used].sum(0).view(d.shape)) for p, d in zip(partial, given)]
    return (*sums, *[torch.zeros_like(d) for d in given[len(sums):]])  # one frame: no frame decay is used


# Frames of the 3-D compile cases: each configuration's tile holds its widest rows' tokens as
# ``FRAMES_3D`` frames of a quarter of that width.
FRAMES_3D = 4
# Dtypes of the compile cases, 2-D and 3-D: the 3-D fp32 rows are left out (the table's compile
# time on a shared 2-core machine), tests/kernels/test_plane_scan_compiles.py compiles a sample.
CASE_DTYPES = {1: ("fp32", "fp16", "bf16"), FRAMES_3D: ("fp16", "bf16")}


def compile_cases() -> list[tuning.CompileCase]:
    """Every configuration of both kernels, order ``'both'`` (the most registers), at the widest
    rows its register budget admits (:func:`_register_fit`), 2-D (``BLOCK_T = 1``) and 3-D
    (:data:`FRAMES_3D` frames), in the dtypes of :data:`CASE_DTYPES` (fp16's rows take bf16's
    numbers, uncompiled: the same layout)."""
    cases = []
    for tuned, per_thread, io in [(_plane_fwd_kernel, FWD_ELEMENTS_PER_THREAD, ("x_ptr", "y_ptr")),
                                  (_plane_bwd_kernel, BWD_ELEMENTS_PER_THREAD, ("x_ptr", "g_ptr"))]:
        for config in tuned.tuning.configs:
            tile_h, block_c = config.kwargs["TILE_H"], config.kwargs["BLOCK_C"]
            for block_t, dtype in [(t, d) for t, dtypes in CASE_DTYPES.items() for d in dtypes]:
                budget = per_thread[block_t > 1] * 32 * config.num_warps // (tile_h * block_c)
                row = min(MAX_BLOCK_W // (2 if block_t > 1 else 1), pow2(budget + 1) // 2)  # as fits()
                pointers = {name: f"*{dtype}" if name in io else "*fp32" for name in tuned.arg_names
                            if name.endswith("_ptr")}
                signature = tuning.signature(tuned, pointers)
                constexprs = {"V2H": True, "H2V": True, "ACC": tl.float32, "BLOCK_T": block_t,
                              "BLOCK_W": row // block_t, "INTERPRET": False}
                variant = tuned.tuning.variant({**signature, **constexprs})
                same_as = tuning.row_name(tuned.tuning.kernel_id, variant.replace("fp16", "bf16", 1), config)
                cases.append(tuning.CompileCase(tuning.row_name(tuned.tuning.kernel_id, variant, config), tuned.fn,
                                                signature, {**constexprs, **config.kwargs}, config.num_warps,
                                                config.num_stages, same_as=same_as if dtype == "fp16" else None))
    return cases
