"""``cross_selective_scan`` for ``torch.export`` and ONNX: the routes built time-major.

The reference (:func:`~ppma.ops.cross_scan_impl.reference.cross_selective_scan_reference`) copies the
routes out channels-first, projects them by einsums and transposes every input into the scan's
time-major layout: in ONNX, each of those is a ``Transpose`` node that copies (a quarter of
VMamba-T's ONNX Runtime time). Here every tensor is laid out once, in the order the scan reads:

- the projections run on the map, channels-last: ``x @ x_proj_weight`` for all four routes in one
  product, ``(batch, H, W, 4, R + 2N)``;
- only those ``R + 2N`` channels a route are put in the routes' orders, time-major ``(L, batch,
  4, R + 2N)`` (row-major, column-major, both reversed), and ``x`` once ``(L, batch, 4, dim)``;
- ``dt = softplus(dt_projs[k] @ dt_k + bias[k])`` is one product of the routes' low-rank ``dt``
  ``(L, batch, 4 R)`` with the block-diagonal matrix of the four ``dt_projs``: it comes out
  time-major ``(L, batch, 4 dim)``;
- :func:`~ppma.ops.selective_scan_impl.export.scan_time_major` (one ONNX ``Scan`` over chunks);
- the merge adds each route to its reverse in time, puts both orders back on the map, and adds
  ``x * sum_k D_k`` (``D_k x`` summed over the routes).

Same arithmetic as the reference up to the order of sums. fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..selective_scan_impl.export import scan_time_major
from .reference import ROUTES


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """``(batch, H, W, ...)`` -> ``(H W, batch, ...)``: the map read row by row."""
    return t.permute(1, 2, 0, *range(3, t.dim())).flatten(0, 1)


def _column_major(t: torch.Tensor) -> torch.Tensor:
    """``(batch, H, W, ...)`` -> ``(W H, batch, ...)``: the map read column by column."""
    return t.permute(2, 1, 0, *range(3, t.dim())).flatten(0, 1)


def _routes(route0: torch.Tensor, route1: torch.Tensor, route2: torch.Tensor, route3: torch.Tensor) -> torch.Tensor:
    """Four time-major sequences ``(L, batch, c)``, routes 2 and 3 still in the order of 0 and 1,
    -> ``(L, batch, 4, c)`` with routes 2 and 3 reversed."""
    return torch.stack([route0, route1, route2.flip(0), route3.flip(0)], dim=2)


def _block_diagonal(dt_projs_weight: torch.Tensor) -> torch.Tensor:
    """``(4, dim, R)`` -> ``(4 R, 4 dim)``: route ``k``'s ``dt_projs_weight[k]^T`` on the diagonal."""
    routes, dim, rank = dt_projs_weight.shape
    eye = torch.eye(routes, dtype=dt_projs_weight.dtype, device=dt_projs_weight.device)
    return (eye[:, None, :, None] * dt_projs_weight.transpose(1, 2)[:, :, None, :]).reshape(routes * rank, routes * dim)


def cross_selective_scan_export(x, x_proj_weight, dt_projs_weight, dt_projs_bias, A, D) -> torch.Tensor:
    """Same contract as :func:`~ppma.ops.cross_scan_impl.reference.cross_selective_scan_reference`:
    ``x`` ``(batch, H, W, dim)`` -> fp32 ``(batch, H, W, dim)``."""
    _, height, width, dim = x.shape
    rank, n_state = dt_projs_weight.shape[2], A.shape[1]
    x = x.float()
    proj = (x @ x_proj_weight.float().flatten(0, 1).T).unflatten(-1, (ROUTES, -1))  # (batch, H, W, 4, R + 2N)
    rows, cols = _row_major(proj[:, :, :, 0::2]), _column_major(proj[:, :, :, 1::2])  # routes 0, 2 / 1, 3
    dts, bs, cs = _routes(rows[:, :, 0], cols[:, :, 0], rows[:, :, 1], cols[:, :, 1]).split([rank, n_state, n_state], -1)
    dt = F.softplus(dts.flatten(2) @ _block_diagonal(dt_projs_weight.float()) + dt_projs_bias.float().flatten())
    rows, cols = _row_major(x), _column_major(x)
    u = _routes(rows, cols, rows, cols)  # (L, batch, 4, dim)
    a = A.float().view(ROUTES, dim, n_state).transpose(1, 2)  # (4, N, dim)
    y, _ = scan_time_major(dt.unflatten(-1, (ROUTES, 1, dim)), u[:, :, :, None], bs[..., None], cs[..., None], a)
    from_rows = (y[:, :, 0] + y[:, :, 2].flip(0)).unflatten(0, (height, width)).permute(2, 0, 1, 3)  # routes 0, 2
    from_cols = (y[:, :, 1] + y[:, :, 3].flip(0)).unflatten(0, (width, height)).permute(2, 1, 0, 3)  # routes 1, 3
    return from_rows + from_cols + x * D.float().view(ROUTES, dim).sum(0)
