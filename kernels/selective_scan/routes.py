"""VMamba's four routes scanned straight from the map: the selective-scan kernels launched with
route positions (:class:`~.scan.Layout` ``routes``), so no route is ever copied.

Channels-last over a ``(batch, H, W)`` map: ``x`` ``(batch, H, W, dim)`` (every route reads it),
``dts`` ``(batch, H, W, 4, dim)`` (route ``k``'s ``dt`` inputs), ``B``, ``C`` ``(batch, H, W, 4, N)``
(views with equal strides, e.g. slices of one projection); ``A`` ``(4 dim, N)``, ``D``,
``delta_bias`` ``(4 dim,)``; softplus. Route ``k``'s step ``t`` reads the map at the position its
route visits then (0: row-major, 1: column-major, 2, 3: those reversed). Its output goes back to
that position: ``y`` ``(batch, H, W, 4, dim)`` fp32, so merging the routes is ``y.sum(3)``.

On the map the channel axis is the contiguous one: the loads coalesce across a program's channels
(``BLOCK_D`` of them; its positions are ``dim`` apart), so the routes run shorter tiles
(:func:`route_tile`) that leave registers for wide channel blocks.
"""
from __future__ import annotations

import torch

from .scan import Layout, Problem, Strides, launch_backward, launch_forward, tile_length

ROUTES = 4
# Time steps x states of one channel in a route's tile.
ROUTE_TILE_ELEMENTS = 128


def route_tile(length: int, n_state: int) -> int:
    """Time steps per tile along a route of ``length`` positions (:func:`~.scan.tile_length`)."""
    return tile_length(length, n_state, ROUTE_TILE_ELEMENTS)


def _map_strides(t: torch.Tensor) -> Strides:
    """:class:`Strides` of a ``(batch, H, W, 4, c)`` view (route as group), or of a ``(batch, H,
    W, c)`` one read by every route (group stride 0)."""
    if t.dim() == 4:
        return Strides(t.stride(0), 0, t.stride(3), t.stride(2))
    return Strides(t.stride(0), t.stride(3), t.stride(4), t.stride(2))


def _on_positions(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when position ``i W + j`` is one stride apart (``stride(H) == W stride(W)``),
    else a contiguous copy."""
    return t if t.stride(1) == t.shape[2] * t.stride(2) else t.contiguous()


def _problem(x, dts, B, C, A, D, delta_bias, tile) -> Problem:
    batch, height, width, dim = x.shape
    x, dts = _on_positions(x), _on_positions(dts)
    if B.stride() != C.stride() or B.stride(1) != width * B.stride(2):
        B, C = B.contiguous(), C.contiguous()
    length = height * width
    tile = tile or route_tile(length, A.shape[1])
    out = Strides(length * ROUTES * dim, dim, 1, ROUTES * dim)  # (batch, H, W, 4, dim) contiguous
    grad_out = Strides(length * dim, 0, 1, dim)  # (batch, H, W, dim) contiguous, read by every route
    layout = Layout(_map_strides(x), _map_strides(dts), _map_strides(B), out, grad_out, (height, width))
    return Problem(x, dts, A, B, C, D, None, delta_bias, True, tile, (batch, ROUTES * dim, ROUTES, length), layout)


def cross_scan_fwd(x, dts, B, C, A, D, delta_bias, tile=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward along the four routes: ``(y, tile_states)``, ``y`` ``(batch, H, W, 4, dim)`` fp32
    (route ``k``'s output at the map positions), ``tile_states`` ``(batch, 4 dim, n_tiles, N)``
    fp32 (:func:`~.scan.tile_states_shape` of ``(batch, 4 dim, H W)`` and :func:`route_tile`)."""
    p = _problem(x, dts, B, C, A, D, delta_bias, tile)
    y = torch.empty(*x.shape[:3], ROUTES, x.shape[3], dtype=torch.float32, device=x.device)
    _, tile_states = launch_forward(p, y)
    return y, tile_states


def cross_scan_bwd(grad_y, tile_states, x, dts, B, C, A, D, delta_bias, tile=None) -> list[torch.Tensor]:
    """Backward given ``grad_y`` ``(batch, H, W, dim)``, the gradient of ``y.sum(3)``:
    ``[dx, ddts, dB, dC, dA, dD, ddelta_bias]`` (the arguments' order): ``dx`` and ``ddts``
    ``(batch, H, W, 4, dim)`` (per route: add ``dx`` over routes), ``dB``, ``dC`` ``(batch, H, W,
    4, N)`` fp32, the rest fp32 shaped like ``A``, ``D``, ``delta_bias``."""
    p = _problem(x, dts, B, C, A, D, delta_bias, tile)
    batch, height, width, dim = x.shape
    gx = torch.empty(batch, height, width, ROUTES, dim, dtype=x.dtype, device=x.device)
    gdts = torch.empty(gx.shape, dtype=dts.dtype, device=x.device)
    gA, gB, gC, gD, gbias = launch_backward(p, grad_y.contiguous(), None, tile_states, gx, gdts, gx)

    def on_map(g):  # (batch, 4, N, H W) -> (batch, H, W, 4, N)
        return g.permute(0, 3, 1, 2).unflatten(1, (height, width))

    return [gx, gdts, on_map(gB), on_map(gC), gA, gD, gbias]
