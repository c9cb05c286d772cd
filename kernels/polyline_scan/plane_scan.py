"""Fused Triton kernels of the 2-D polyline scan: all the passes of an order in one kernel.

On an ``(H, W)`` grid, ``y = L x`` is ``W(H(x))`` for V2H, ``H(W(x))`` for H2V and their sum for
``'both'``, where ``H`` / ``W`` are the bidirectional 1-D decayed scans along the columns (decays
``beta``) / rows (``alpha``) of :mod:`.decay_scan` (``y_p = h_p + g_p - u_p``, causal ``h`` and
anti-causal ``g``).

One program owns one ``(batch, head)`` plane and ``BLOCK_C`` channels and walks it in tiles of
``TILE_H`` whole rows, ``(TILE_H, BLOCK_W, BLOCK_C)`` with the channels (the contiguous axis)
innermost, so loads and stores are coalesced vectors. Inside a tile every 1-D scan is a parallel
linear scan in registers (``tl.associative_scan`` of ``u -> a * state + u``; decays ``<= 1``, so
nothing overflows or cancels); across tiles the scans along ``H`` are joined by carried states:

- sweep 1, top to bottom: the causal ``H``-scan's state entering each tile (of ``x`` for V2H, of
  ``W x`` for H2V) is stored, ``TILE_H`` times smaller than ``x``;
- sweep 2, bottom to top: each tile's ``H``-scans start from the stored state (causal) and from
  the state carried in registers from the tile below (anti-causal); the ``W``-scans run on whole
  rows; ``y`` is written once.

Forward traffic: ``x`` read twice and ``y`` written once, plus ``2 * 4 / TILE_H`` bytes per element
and carried quantity (the model of ``kernels/bench/polyline_scan.py``).

Backward: ``dx = L^T dy`` is the forward of the swapped order (every 1-D mask is symmetric);
:func:`decay_grads` gives the decay gradients in the same two sweeps. For a 1-D scan with input
``u`` and output gradient ``g``, ``dlog_a_p = sum_c G_p (h_p - u_p) + (H_p - g_p) X_p`` (``h``/``X``
causal/anti-causal scans of ``u``, ``H``/``G`` of ``g``; ``h_p - u_p = a_p h_{p-1}``, the paths
crossing the edge ``p-1 -> p``): V2H's ``W`` step has ``u = H x``, ``g = dy`` and its ``H`` step
``u = x``, ``g = W dy``; H2V's ``H`` step ``u = W x``, ``g = dy`` and its ``W`` step ``u = x``,
``g = H dy``. Channel sums are written per channel block and summed afterwards (no atomics).

Rows of more than :data:`MAX_BLOCK_W` tokens do not fit a tile: :mod:`.scan` runs them (and 3-D
grids) as 1-D passes of :mod:`.decay_scan`. Under Triton's interpreter the scans run by
doubling steps of ``tl.gather`` (same results; the interpreter runs ``tl.associative_scan`` one
element at a time), see :func:`_scan`.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.runtime import interpreted
from ..common.strided import accumulation_dtype, pow2, tl_dtype
from . import decay_scan

# Widest row (padded to a power of two) a tile holds.
MAX_BLOCK_W = 256
# Tile elements per thread that the configurations may use (about fifteen tiles are live forward
# and thirty backward): the most that compile without spills (tests/kernels/test_decay_scan_compiles.py).
FWD_ELEMENTS_PER_THREAD = 16
BWD_ELEMENTS_PER_THREAD = 8


def _configs(shapes):
    return [triton.Config({"TILE_H": th, "BLOCK_C": bc}, num_warps=w) for th, bc, w in shapes]


# (TILE_H, BLOCK_C, num_warps); the first one is the interpreter's.
# (2, 8, 4) forward at 128-token rows and (8, 8, 8) backward at 32 spilled on sm_90: left out.
FWD_CONFIGS = _configs([(8, 16, 8), (8, 8, 8), (4, 16, 8), (4, 8, 8), (4, 8, 4), (1, 8, 8)])
BWD_CONFIGS = _configs([(4, 16, 4), (4, 8, 4), (4, 8, 8), (2, 8, 4), (2, 8, 8), (1, 8, 8), (1, 4, 4)])


def _register_fit(per_thread, configs, nargs, **launch):
    """``early_config_prune`` of the kernels (:func:`tuning.autotune`'s ``prune``): the
    configurations whose tile fills half to all of ``per_thread`` elements a thread at the
    launch's ``BLOCK_W`` (smaller tiles move more carried state) with no more channels than
    needed; else the largest that fits, else the smallest."""
    args = {**nargs, **launch}

    def per_thread_of(c):
        return c.kwargs["TILE_H"] * args["BLOCK_W"] * c.kwargs["BLOCK_C"] / (32 * c.num_warps)

    fit = [c for c in configs if per_thread_of(c) <= per_thread and c.kwargs["BLOCK_C"] <= max(pow2(args["C"]), 4)]
    full = [c for c in fit if per_thread_of(c) >= per_thread / 2]
    return full or sorted(fit, key=per_thread_of)[-1:] or [min(configs, key=per_thread_of)]


def _launchable(kernel, per_thread: int, block_w: int, channels: int):
    """The configurations a launch of ``kernel`` may run (the interpreter's single one, or
    :func:`_register_fit`'s)."""
    if len(kernel.configs) == 1:
        return kernel.configs
    return _register_fit(per_thread, kernel.configs, {"C": channels}, BLOCK_W=block_w)


def _variant(args) -> str:
    """``'bf16 acc fp32 V2H=True H2V=True BLOCK_W=64'``: a launch's dtypes and constexprs."""
    return f"{args['x_ptr'][1:]} acc {args['ACC']} V2H={args['V2H']} H2V={args['H2V']} BLOCK_W={args['BLOCK_W']}"


@triton.jit
def _link(a_l, u_l, a_r, u_r):
    """Two steps of ``state -> a * state + u``, left first, as one."""
    return a_l * a_r, u_l * a_r + u_r


@triton.jit
def _axis_positions(u, AXIS: tl.constexpr):
    """Index along ``AXIS`` of every element of the 3-D ``u``."""
    if AXIS == 0:
        pos = tl.arange(0, u.shape[0])[:, None, None]
    elif AXIS == 1:
        pos = tl.arange(0, u.shape[1])[None, :, None]
    else:
        pos = tl.arange(0, u.shape[2])[None, None, :]
    return tl.broadcast_to(pos, u.shape)


@triton.jit
def _scan(a, u, AXIS: tl.constexpr, REVERSE: tl.constexpr, INTERPRET: tl.constexpr):
    """``(prod, state)`` along ``AXIS`` of the 3-D ``a``, ``u`` (same shape): ``state_p = u_p +
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
def _row_scans(a, a_next, u, INTERPRET: tl.constexpr):
    """Causal and anti-causal scans of ``u`` along the rows (axis 1): ``h_p = u_p + a_p
    h_{p-1}``, ``g_p = u_p + a_next_p g_{p+1}``."""
    _, h = _scan(a, u, 1, False, INTERPRET)
    _, g = _scan(a_next, u, 1, True, INTERPRET)
    return h, g


@triton.jit
def _column_scans(a, a_next, u, carry_in, carry_below, INTERPRET: tl.constexpr):
    """Causal and anti-causal scans of ``u`` down the tile's columns (axis 0), joined to the rest
    of the columns by ``carry_in`` (causal state of the row above the tile) and ``carry_below``
    (anti-causal state of the row below it), both ``(BLOCK_W, BLOCK_C)``."""
    into, h = _scan(a, u, 0, False, INTERPRET)
    out_of, g = _scan(a_next, u, 0, True, INTERPRET)
    return h + into * carry_in[None, :, :], g + out_of * carry_below[None, :, :]


@triton.jit
def _first_row(t):
    """Row 0 of the tile ``t``: ``(BLOCK_W, BLOCK_C)``."""
    return tl.sum(tl.where(_axis_positions(t, 0) == 0, t, 0.0), axis=0)


@triton.jit
def _carry_down(state, log_b, u):
    """The causal column state after the tile, from the state before it (sweep 1): ``sum_p
    exp(sum_{r > p} log_b_r) u_p + exp(sum_r log_b_r) state`` (sums of log decays in the tile)."""
    after = tl.cumsum(log_b, axis=0, reverse=True) - log_b
    return tl.sum(tl.exp(after) * u, axis=0) + tl.exp(tl.sum(log_b, axis=0)) * state


@triton.jit
def _tile(ptr, base, rows, cols, chans, s_row, s_col, s_chan, H, W, C, ACC: tl.constexpr):
    """``(TILE_H, BLOCK_W, BLOCK_C)`` tile of a ``(H, W, C)`` plane in ``ACC``, zero outside."""
    mask = (rows < H) & (cols < W) & (chans < C)
    return tl.load(ptr + base + rows * s_row + cols * s_col + chans * s_chan, mask=mask, other=0.0).to(ACC)


@triton.jit
def _decays(ptr, base, rows, cols, s_row, s_col, H, W, ACC: tl.constexpr):
    """``(TILE_H, BLOCK_W, 1)`` log decays and decays at ``(rows, cols)``: 0 and 0 outside the
    grid (a scan stops there)."""
    inside = (rows < H) & (cols < W)
    log = tl.load(ptr + base + rows * s_row + cols * s_col, mask=inside, other=0.0).to(ACC)
    return log, tl.where(inside, tl.exp(log), 0.0)


@tuning.autotune(FWD_CONFIGS, key=["H", "W", "C"], variant=_variant,
                 prune=functools.partial(_register_fit, FWD_ELEMENTS_PER_THREAD))
@triton.jit
def _plane_fwd_kernel(
    x_ptr, la_ptr, lb_ptr, y_ptr, carry_ptr,
    heads, H, W, C,
    sx0, sx1, sxr, sxw, sxc,
    sa0, sa1, sar, saw,
    sb0, sb1, sbr, sbw,
    sy0, sy1, syr, syw, syc,
    V2H: tl.constexpr, H2V: tl.constexpr, ACC: tl.constexpr, BLOCK_W: tl.constexpr,
    INTERPRET: tl.constexpr, TILE_H: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """``y = L x`` on one plane's channel block (module docstring); ``carry_ptr``: ``ACC``
    scratch of at least ``planes * n_cblocks * n_tiles * (V2H + H2V) * BLOCK_W * BLOCK_C``."""
    cb, plane = tl.program_id(0), tl.program_id(1)
    b, hd = (plane // heads).to(tl.int64), (plane % heads).to(tl.int64)
    x_base, y_base = b * sx0 + hd * sx1, b * sy0 + hd * sy1
    a_base, b_base = b * sa0 + hd * sa1, b * sb0 + hd * sb1
    r = tl.arange(0, TILE_H)[:, None, None]
    cols = tl.arange(0, BLOCK_W)[None, :, None]
    chans = cb * BLOCK_C + tl.arange(0, BLOCK_C)[None, None, :]
    n_tiles = tl.cdiv(H, TILE_H)
    NQ: tl.constexpr = V2H + H2V
    STATE: tl.constexpr = BLOCK_W * BLOCK_C
    state_offs = tl.arange(0, BLOCK_W)[:, None] * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    carry_base = carry_ptr + (plane.to(tl.int64) * tl.num_programs(0) + cb) * n_tiles * NQ * STATE + state_offs

    state_x = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)  # causal column state of x
    state_w = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)  # ... of W x
    for t in range(n_tiles):  # sweep 1, top to bottom: the states entering each tile
        rows = t * TILE_H + r
        slot = carry_base + t * NQ * STATE
        x = _tile(x_ptr, x_base, rows, cols, chans, sxr, sxw, sxc, H, W, C, ACC)
        log_b, _ = _decays(lb_ptr, b_base, rows, cols, sbr, sbw, H, W, ACC)
        if V2H:
            tl.store(slot, state_x)
            state_x = _carry_down(state_x, log_b, x)
        if H2V:
            _, a_w = _decays(la_ptr, a_base, rows, cols, sar, saw, H, W, ACC)
            _, a_w_next = _decays(la_ptr, a_base, rows, cols + 1, sar, saw, H, W, ACC)
            h, g = _row_scans(tl.broadcast_to(a_w, x.shape), tl.broadcast_to(a_w_next, x.shape), x, INTERPRET)
            tl.store(slot + V2H * STATE, state_w)
            state_w = _carry_down(state_w, log_b, h + g - x)
    tl.debug_barrier()  # sweep 2 reads the states sweep 1 stored

    below_x = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)  # anti-causal column state of x below the tile
    below_w = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)  # ... of W x
    for i in range(n_tiles):  # sweep 2, bottom to top
        t = n_tiles - 1 - i
        rows = t * TILE_H + r
        slot = carry_base + t * NQ * STATE
        x = _tile(x_ptr, x_base, rows, cols, chans, sxr, sxw, sxc, H, W, C, ACC)
        _, a_w = _decays(la_ptr, a_base, rows, cols, sar, saw, H, W, ACC)
        _, a_w_next = _decays(la_ptr, a_base, rows, cols + 1, sar, saw, H, W, ACC)
        _, a_h = _decays(lb_ptr, b_base, rows, cols, sbr, sbw, H, W, ACC)
        _, a_h_next = _decays(lb_ptr, b_base, rows + 1, cols, sbr, sbw, H, W, ACC)
        a_w, a_w_next = tl.broadcast_to(a_w, x.shape), tl.broadcast_to(a_w_next, x.shape)
        a_h, a_h_next = tl.broadcast_to(a_h, x.shape), tl.broadcast_to(a_h_next, x.shape)
        y = tl.zeros(x.shape, dtype=ACC)
        if V2H:  # W(H x)
            h, g = _column_scans(a_h, a_h_next, x, tl.load(slot), below_x, INTERPRET)
            below_x = _first_row(g)
            hx = h + g - x
            h, g = _row_scans(a_w, a_w_next, hx, INTERPRET)
            y += h + g - hx
        if H2V:  # H(W x)
            h, g = _row_scans(a_w, a_w_next, x, INTERPRET)
            wx = h + g - x
            h, g = _column_scans(a_h, a_h_next, wx, tl.load(slot + V2H * STATE), below_w, INTERPRET)
            below_w = _first_row(g)
            y += h + g - wx
        mask = (rows < H) & (cols < W) & (chans < C)
        tl.store(y_ptr + y_base + rows * syr + cols * syw + chans * syc, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _edge_grad(h_u, x_u, u, h_g, x_g, g):
    """Per element, the decay gradient's term of one 1-D scan (module docstring), summed over
    channels: ``(TILE_H, BLOCK_W)``."""
    return tl.sum(x_g * (h_u - u) + (h_g - g) * x_u, axis=2)


@tuning.autotune(BWD_CONFIGS, key=["H", "W", "C"], variant=_variant,
                 prune=functools.partial(_register_fit, BWD_ELEMENTS_PER_THREAD))
@triton.jit
def _plane_bwd_kernel(
    x_ptr, g_ptr, la_ptr, lb_ptr, dla_ptr, dlb_ptr, carry_ptr,
    heads, H, W, C,
    sx0, sx1, sxr, sxw, sxc,
    sg0, sg1, sgr, sgw, sgc,
    sa0, sa1, sar, saw,
    sb0, sb1, sbr, sbw,
    V2H: tl.constexpr, H2V: tl.constexpr, ACC: tl.constexpr, BLOCK_W: tl.constexpr,
    INTERPRET: tl.constexpr, TILE_H: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Per channel block, the decay gradients of ``y = L x`` for the output gradient ``g``
    (module docstring). ``dla_ptr``/``dlb_ptr``: ``(n_cblocks, planes, H, W)`` partial sums;
    ``carry_ptr``: ``ACC`` scratch of at least ``planes * n_cblocks * n_tiles * 2 (V2H + H2V) *
    BLOCK_W * BLOCK_C``."""
    cb, plane = tl.program_id(0), tl.program_id(1)
    b, hd = (plane // heads).to(tl.int64), (plane % heads).to(tl.int64)
    x_base, g_base = b * sx0 + hd * sx1, b * sg0 + hd * sg1
    a_base, b_base = b * sa0 + hd * sa1, b * sb0 + hd * sb1
    r = tl.arange(0, TILE_H)[:, None, None]
    cols = tl.arange(0, BLOCK_W)[None, :, None]
    chans = cb * BLOCK_C + tl.arange(0, BLOCK_C)[None, None, :]
    n_tiles = tl.cdiv(H, TILE_H)
    NQ: tl.constexpr = 2 * (V2H + H2V)
    STATE: tl.constexpr = BLOCK_W * BLOCK_C
    state_offs = tl.arange(0, BLOCK_W)[:, None] * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    carry_base = carry_ptr + (plane.to(tl.int64) * tl.num_programs(0) + cb) * n_tiles * NQ * STATE + state_offs

    # Causal column states: V2H of x and W dy, H2V of W x and dy.
    state_x = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)
    state_wg = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)
    state_wx = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)
    state_g = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)
    for t in range(n_tiles):  # sweep 1, top to bottom
        rows = t * TILE_H + r
        slot = carry_base + t * NQ * STATE
        x = _tile(x_ptr, x_base, rows, cols, chans, sxr, sxw, sxc, H, W, C, ACC)
        g = _tile(g_ptr, g_base, rows, cols, chans, sgr, sgw, sgc, H, W, C, ACC)
        log_b, _ = _decays(lb_ptr, b_base, rows, cols, sbr, sbw, H, W, ACC)
        _, a_w = _decays(la_ptr, a_base, rows, cols, sar, saw, H, W, ACC)
        _, a_w_next = _decays(la_ptr, a_base, rows, cols + 1, sar, saw, H, W, ACC)
        a_w, a_w_next = tl.broadcast_to(a_w, x.shape), tl.broadcast_to(a_w_next, x.shape)
        if V2H:
            h, anti = _row_scans(a_w, a_w_next, g, INTERPRET)
            tl.store(slot, state_x)
            tl.store(slot + STATE, state_wg)
            state_x = _carry_down(state_x, log_b, x)
            state_wg = _carry_down(state_wg, log_b, h + anti - g)
        if H2V:
            h, anti = _row_scans(a_w, a_w_next, x, INTERPRET)
            tl.store(slot + 2 * V2H * STATE, state_wx)
            tl.store(slot + (2 * V2H + 1) * STATE, state_g)
            state_wx = _carry_down(state_wx, log_b, h + anti - x)
            state_g = _carry_down(state_g, log_b, g)
    tl.debug_barrier()  # sweep 2 reads the states sweep 1 stored

    below_x = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)  # anti-causal column states below the tile
    below_wg = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)
    below_wx = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)
    below_g = tl.zeros((BLOCK_W, BLOCK_C), dtype=ACC)
    grad_rows = tl.arange(0, TILE_H)[:, None]
    grad_cols = tl.arange(0, BLOCK_W)[None, :]
    grad_base = (cb * tl.num_programs(1) + plane).to(tl.int64) * H * W
    for i in range(n_tiles):  # sweep 2, bottom to top
        t = n_tiles - 1 - i
        rows = t * TILE_H + r
        slot = carry_base + t * NQ * STATE
        x = _tile(x_ptr, x_base, rows, cols, chans, sxr, sxw, sxc, H, W, C, ACC)
        g = _tile(g_ptr, g_base, rows, cols, chans, sgr, sgw, sgc, H, W, C, ACC)
        _, a_w = _decays(la_ptr, a_base, rows, cols, sar, saw, H, W, ACC)
        _, a_w_next = _decays(la_ptr, a_base, rows, cols + 1, sar, saw, H, W, ACC)
        _, a_h = _decays(lb_ptr, b_base, rows, cols, sbr, sbw, H, W, ACC)
        _, a_h_next = _decays(lb_ptr, b_base, rows + 1, cols, sbr, sbw, H, W, ACC)
        a_w, a_w_next = tl.broadcast_to(a_w, x.shape), tl.broadcast_to(a_w_next, x.shape)
        a_h, a_h_next = tl.broadcast_to(a_h, x.shape), tl.broadcast_to(a_h_next, x.shape)
        grad_a = tl.zeros((TILE_H, BLOCK_W), dtype=ACC)
        grad_b = tl.zeros((TILE_H, BLOCK_W), dtype=ACC)
        if V2H:  # y = W(H x): H step u = x, g = W dy; W step u = H x, g = dy
            h_g, x_g = _row_scans(a_w, a_w_next, g, INTERPRET)
            wg = h_g + x_g - g
            h_x, x_x = _column_scans(a_h, a_h_next, x, tl.load(slot), below_x, INTERPRET)
            h_wg, x_wg = _column_scans(a_h, a_h_next, wg, tl.load(slot + STATE), below_wg, INTERPRET)
            below_x, below_wg = _first_row(x_x), _first_row(x_wg)
            grad_b += _edge_grad(h_x, x_x, x, h_wg, x_wg, wg)
            hx = h_x + x_x - x
            h_hx, x_hx = _row_scans(a_w, a_w_next, hx, INTERPRET)
            grad_a += _edge_grad(h_hx, x_hx, hx, h_g, x_g, g)
        if H2V:  # y = H(W x): W step u = x, g = H dy; H step u = W x, g = dy
            h_x, x_x = _row_scans(a_w, a_w_next, x, INTERPRET)
            wx = h_x + x_x - x
            h_wx, x_wx = _column_scans(a_h, a_h_next, wx, tl.load(slot + 2 * V2H * STATE), below_wx, INTERPRET)
            h_g, x_g = _column_scans(a_h, a_h_next, g, tl.load(slot + (2 * V2H + 1) * STATE), below_g, INTERPRET)
            below_wx, below_g = _first_row(x_wx), _first_row(x_g)
            grad_b += _edge_grad(h_wx, x_wx, wx, h_g, x_g, g)
            hg = h_g + x_g - g
            h_hg, x_hg = _row_scans(a_w, a_w_next, hg, INTERPRET)
            grad_a += _edge_grad(h_x, x_x, x, h_hg, x_hg, hg)
        grad_r = t * TILE_H + grad_rows
        offs = grad_base + grad_r * W + grad_cols
        inside = (grad_r < H) & (grad_cols < W)
        tl.store(dla_ptr + offs, grad_a, mask=inside)
        tl.store(dlb_ptr + offs, grad_b, mask=inside)


ORDERS = {"v2h": (True, False), "h2v": (False, True), "both": (True, True)}


def fits(width: int) -> bool:
    """Whether rows of ``width`` tokens fit a tile (else :mod:`.scan` runs 1-D passes)."""
    return pow2(width) <= MAX_BLOCK_W


def _scratch_elements(configs, planes: int, H: int, W: int, C: int, quantities: int) -> int:
    """Carried-state elements that any of ``configs`` may store."""
    per_state = max(triton.cdiv(H, c.kwargs["TILE_H"]) * triton.cdiv(C, c.kwargs["BLOCK_C"]) * c.kwargs["BLOCK_C"]
                    for c in configs)
    return planes * quantities * pow2(W) * per_state


def forward(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor, order: str) -> torch.Tensor:
    """``L x`` for ``x`` ``(B, heads, H, W, C)`` (any strides; rows :func:`fits`), decays ``(B,
    heads, H, W)``. Returns ``x.dtype``, laid out like ``x`` when ``x`` is dense."""
    v2h, h2v = ORDERS[order]
    batch, heads, H, W, C = x.shape
    acc = accumulation_dtype(x)
    y = decay_scan._buffer(x, x.dtype)
    if x.numel() == 0:
        return y
    configs = _launchable(_plane_fwd_kernel, FWD_ELEMENTS_PER_THREAD, pow2(W), C)
    carry = decay_scan._buffer(x, acc, (_scratch_elements(configs, batch * heads, H, W, C, v2h + h2v),))

    def grid(meta):
        return triton.cdiv(C, meta["BLOCK_C"]), batch * heads

    _plane_fwd_kernel[grid](
        x, log_alpha, log_beta, y, carry, heads, H, W, C,
        *x.stride(), *log_alpha.stride(), *log_beta.stride(), *y.stride(),
        V2H=v2h, H2V=h2v, ACC=tl_dtype(acc), BLOCK_W=pow2(W), INTERPRET=interpreted(),
    )
    return y


def decay_grads(x: torch.Tensor, grad: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor,
                order: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dlog_alpha, dlog_beta)`` of :func:`forward` for the output gradient ``grad`` (shaped like
    ``x``, any strides), each shaped and typed like its decay; sums in fp32 (fp64 for fp64 ``x``)."""
    v2h, h2v = ORDERS[order]
    batch, heads, H, W, C = x.shape
    acc = accumulation_dtype(x)
    if x.numel() == 0:
        return tuple(torch.zeros_like(d) for d in (log_alpha, log_beta))
    configs = _launchable(_plane_bwd_kernel, BWD_ELEMENTS_PER_THREAD, pow2(W), C)
    n_cblocks = max(triton.cdiv(C, c.kwargs["BLOCK_C"]) for c in configs)
    partial = [decay_scan._buffer(x, acc, (n_cblocks, batch * heads, H, W)) for _ in range(2)]
    carry = decay_scan._buffer(x, acc, (_scratch_elements(configs, batch * heads, H, W, C, 2 * (v2h + h2v)),))

    def grid(meta):
        return triton.cdiv(C, meta["BLOCK_C"]), batch * heads

    _plane_bwd_kernel[grid](
        x, grad, log_alpha, log_beta, *partial, carry, heads, H, W, C,
        *x.stride(), *grad.stride(), *log_alpha.stride(), *log_beta.stride(),
        V2H=v2h, H2V=h2v, ACC=tl_dtype(acc), BLOCK_W=pow2(W), INTERPRET=interpreted(),
    )
    used = triton.cdiv(C, _plane_bwd_kernel.best_config.kwargs["BLOCK_C"])
    return tuple(torch.empty_like(d).copy_(p[:used].sum(0).view(d.shape))
                 for p, d in zip(partial, (log_alpha, log_beta)))


def compile_cases() -> list[tuning.CompileCase]:
    """Every configuration of both kernels, order ``'both'`` (the most registers), at the widest
    rows its register budget admits (:func:`_register_fit`), in fp32, fp16 and bf16 (fp16's rows
    take bf16's numbers, uncompiled: the same layout)."""
    cases = []
    for tuned, per_thread, io in [(_plane_fwd_kernel, FWD_ELEMENTS_PER_THREAD, ("x_ptr", "y_ptr")),
                                  (_plane_bwd_kernel, BWD_ELEMENTS_PER_THREAD, ("x_ptr", "g_ptr"))]:
        for config in tuned.tuning.configs:
            tile_h, block_c = config.kwargs["TILE_H"], config.kwargs["BLOCK_C"]
            block_w = min(MAX_BLOCK_W, pow2(per_thread * 32 * config.num_warps // (tile_h * block_c) + 1) // 2)
            for dtype in ("fp32", "fp16", "bf16"):
                pointers = {name: f"*{dtype}" if name in io else "*fp32" for name in tuned.arg_names
                            if name.endswith("_ptr")}
                signature = tuning.signature(tuned, pointers)
                constexprs = {"V2H": True, "H2V": True, "ACC": tl.float32, "BLOCK_W": block_w, "INTERPRET": False}
                variant = tuned.tuning.variant({**signature, **constexprs})
                same_as = tuning.row_name(tuned.tuning.kernel_id, variant.replace("fp16", "bf16", 1), config)
                cases.append(tuning.CompileCase(tuning.row_name(tuned.tuning.kernel_id, variant, config), tuned.fn,
                                                signature, {**constexprs, **config.kwargs}, config.num_warps,
                                                config.num_stages, same_as=same_as if dtype == "fp16" else None))
    return cases
