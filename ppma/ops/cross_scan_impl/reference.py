"""VMamba's four scan routes over a 2-D map, their adjoint, and the selective scan along them
with its projections (SS2D's core; written for clarity).

Routes over a ``(B, C, H, W)`` map, each a sequence of the ``L = H * W`` positions:
0: row-major (``(0,0), (0,1), ...``), 1: column-major (``(0,0), (1,0), ...``), 2: route 0
reversed, 3: route 1 reversed.
"""
from __future__ import annotations

import torch

from ..selective_scan_impl.reference import selective_scan_reference

ROUTES = 4


def route_sequences(maps: torch.Tensor) -> torch.Tensor:
    """``(B, 4, C, H, W)`` -> ``(B, 4, C, H*W)``: map ``k`` read along route ``k``."""
    def rows(m):
        return m.flatten(-2)

    def cols(m):
        return m.transpose(-1, -2).flatten(-2)

    sequences = [rows(maps[:, 0]), cols(maps[:, 1]), rows(maps[:, 2]).flip(-1), cols(maps[:, 3]).flip(-1)]
    return torch.stack(sequences, dim=1)


def route_maps(seq: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``(B, 4, C, H*W)`` -> ``(B, 4, C, H, W)``: sequence ``k`` put back on the map along
    route ``k`` (the inverse of :func:`route_sequences`)."""

    def rows(s):
        return s.unflatten(-1, (height, width))

    def cols(s):
        return s.unflatten(-1, (width, height)).transpose(-1, -2)

    return torch.stack([rows(seq[:, 0]), cols(seq[:, 1]), rows(seq[:, 2].flip(-1)), cols(seq[:, 3].flip(-1))], dim=1)


def cross_scan_reference(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, 4, C, H*W)``: the map read along the four routes."""
    return route_sequences(x[:, None].expand(-1, ROUTES, -1, -1, -1))


def cross_merge_reference(y: torch.Tensor) -> torch.Tensor:
    """``(B, 4, C, H, W)`` -> ``(B, C, H, W)``: every route's sequence put back on the map, summed.

    ``y[:, k]`` holds route ``k``'s sequence (length ``H*W``) viewed as ``(H, W)``, i.e. the
    ``(B, 4, C, H*W)`` scan output ``.view(B, 4, C, H, W)``. This is the adjoint of
    :func:`cross_scan_reference`: ``<cross_scan(x), y> = <x, cross_merge(y)>``.
    """
    return route_maps(y.flatten(3), *y.shape[3:]).sum(1)


def route_projections(x, x_proj_weight, dt_projs_weight):
    """The selective scan's inputs along the routes of ``x`` ``(batch, H, W, dim)``: ``xs``
    ``(batch, 4, dim, L)`` (:func:`cross_scan_reference`), ``dt = dt_projs_weight[k] @
    x_proj_weight[k, :R] @ xs[:, k]`` ``(batch, 4, dim, L)``, ``B``, ``C`` (the next ``N`` rows
    each) ``(batch, 4, N, L)``, contiguous."""
    rank = dt_projs_weight.shape[2]
    n_state = (x_proj_weight.shape[1] - rank) // 2
    xs = cross_scan_reference(x.permute(0, 3, 1, 2))
    dts, bs, cs = torch.einsum("bkdl,kcd->bkcl", xs, x_proj_weight).split([rank, n_state, n_state], dim=2)
    return xs, torch.einsum("bkrl,kdr->bkdl", dts, dt_projs_weight), bs.contiguous(), cs.contiguous()


def cross_selective_scan_reference(x, x_proj_weight, dt_projs_weight, dt_projs_bias, A, D,
                                   scan=selective_scan_reference) -> torch.Tensor:
    """VMamba's SS2D core (as released): the selective scan along the four routes of a
    channels-last map, with its projections, merged back onto the map.

    ``x`` ``(batch, H, W, dim)``; per route ``k``: ``x_proj_weight`` ``(4, R + 2N, dim)`` (rows
    ``dt``, ``B``, ``C``), ``dt_projs_weight`` ``(4, dim, R)``, ``dt_projs_bias`` ``(4, dim)``;
    ``A`` ``(4 dim, N)``, ``D`` ``(4 dim,)`` (route ``k``'s channels are ``k dim .. (k+1) dim -
    1``)::

        xs = cross_scan(x)                                   # (batch, 4, dim, L), L = H W
        dt, B, C = x_proj_weight[k] @ xs[:, k]               # (batch, 4, R / N / N, L)
        dt = dt_projs_weight[k] @ dt                         # (batch, 4, dim, L)
        ys = selective_scan(xs, dt, A, B, C, D, dt_projs_bias, softplus)  # the routes as B/C groups
        y = cross_merge(ys)

    ``scan``: the selective scan's form. Returns fp32 ``(batch, H, W, dim)``.
    """
    batch, height, width, dim = x.shape
    xs, dts, bs, cs = route_projections(x, x_proj_weight, dt_projs_weight)
    ys, _ = scan(xs.flatten(1, 2), dts.flatten(1, 2), A, bs, cs, D, delta_bias=dt_projs_bias.flatten(),
                 delta_softplus=True, out_dtype=torch.float32)
    return cross_merge_reference(ys.view(batch, ROUTES, dim, height, width)).permute(0, 2, 3, 1)
