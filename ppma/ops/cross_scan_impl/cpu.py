"""CPU kernel of ``cross_selective_scan``: VMamba's four routes scanned straight from the map.

The scan of :mod:`ppma.ops._inplace_scan` (:func:`~ppma.ops._inplace_scan.scan_`,
one in-place ``addcmul_`` per step, chunked when a step is small) over buffers ``(2, 2,
n_chunks * T, batch, N, dim)``: direction (routes 0, 1 forwards; routes 2, 3, their reverses,
backwards), order (routes 0, 2 store map position ``(i, j)`` at ``i W + j``, routes 1, 3 at
``j H + i``), position, then channels innermost. Route ``k = 2 direction + order`` reads its
step ``t`` at position ``t`` of its order (``L - 1 - t`` backwards), so a route's slice of a
buffer is a permuted view of the map (:func:`_map_view`), and so the routes are never copied:

- ``dt = softplus(dt_projs[k] x_proj[k, :R] x + bias[k])``: the low-rank ``x_proj[k, :R] x``
  (``R`` channels) is put in the route's order, and its product with ``dt_projs[k]`` (and the
  bias) written into the buffer by one ``bmm``; softplus in place;
- decays ``exp(dt A)``, inputs ``dt B u`` read ``x`` and ``B`` through the map views;
- the scan in place; ``y = D x + sum over routes of C h``, added onto the map from the views.

Copies left per call: the low-rank ``dt`` inputs into the routes' order (``4 R`` values per
position, vs ``4 dim`` a copy of the routes would take) and, when ``N > 1``, ``C`` into the
buffers' layout (``4 N`` per position). ``x`` itself is read in place, never copied.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._inplace_scan import chunk_length, scan_, softplus_
from .._scratch import scratch
from ..registry import Impl
from .reference import ROUTES


def _map_view(t: torch.Tensor, height: int, width: int, order: int) -> torch.Tensor:
    """``t`` ``(2, 2, n_steps, batch, *rest)`` -> the routes of ``order`` on the map: ``(2,
    batch, H, W, *rest)`` (direction first), a view of ``t[:, order, :H W]``."""
    t = t[:, order, : height * width]
    if order == 0:
        return t.unflatten(1, (height, width)).movedim(3, 1)
    return t.unflatten(1, (width, height)).permute(0, 3, 2, 1, *range(4, t.dim() + 1))


def _routes(t: torch.Tensor, order: int) -> torch.Tensor:
    """Per-route maps ``(batch, H, W, 4, c)`` -> routes ``order`` and ``order + 2``: ``(2, batch, H, W, c)``."""
    return t[..., order::2, :].movedim(3, 0)


def cross_selective_scan_cpu(x, x_proj_weight, dt_projs_weight, dt_projs_bias, A, D,
                             chunk: int | None = None) -> torch.Tensor:
    """Same contract as :func:`~ppma.ops.cross_scan_impl.reference.cross_selective_scan_reference`.

    ``chunk``: steps per chunk (default :func:`~ppma.ops._inplace_scan.chunk_length`).
    Returns fp32 ``(batch, H, W, dim)``.
    """
    batch, height, width, dim = x.shape
    rank, n_state, length = dt_projs_weight.shape[2], A.shape[1], height * width
    chunk = min(chunk or chunk_length(length, ROUTES * batch * n_state * dim), length)
    n_chunks = -(-length // chunk)
    lead = (2, 2, n_chunks * chunk, batch)  # direction, order, position, batch

    def on_map(t, order):
        return _map_view(t, height, width, order)

    x_dbl = F.linear(x.float(), x_proj_weight.float().flatten(0, 1)).unflatten(-1, (ROUTES, -1))
    dt_low, B, C = x_dbl.split([rank, n_state, n_state], dim=-1)  # (batch, H, W, 4, R / N / N)
    # dt = [low-rank dt, 1] @ [dt_projs, bias]^T, the low-rank dt put in the routes' order: one bmm
    # (the bias as a column: baddbmm would first copy it into the product)
    low = scratch("cross_selective_scan.dt_low", (*lead, rank + 1))
    low[..., rank] = 1
    for order in (0, 1):
        on_map(low[..., :rank], order).copy_(_routes(dt_low, order))
    weight = torch.cat([dt_projs_weight, dt_projs_bias[..., None]], dim=-1).float()  # (4, dim, R + 1)
    dt = scratch("cross_selective_scan.dt", (*lead, 1, dim))
    torch.bmm(low.view(ROUTES, -1, rank + 1), weight.transpose(1, 2), out=dt.view(ROUTES, -1, dim))
    softplus_(dt)
    dt[:, :, length:].zero_()  # decay 1, input 0
    a = A.float().view(2, 2, dim, n_state).transpose(-1, -2)[:, :, None, None]  # (direction, order, 1, 1, N, dim)
    decay = torch.mul(dt, a, out=scratch("cross_selective_scan.decay", (*lead, n_state, dim))).exp_()
    states = scratch("cross_selective_scan.states", (1 + (n_chunks > 1), *lead, n_state, dim))
    h = states[0]
    for order in (0, 1):  # the inputs dt B u, scanned in place into the states
        dtu = on_map(dt, order).mul_(x[..., None, :])
        torch.mul(dtu, _routes(B, order)[..., None], out=on_map(h, order))
    h[:, :, length:].zero_()
    # (lead, direction, chunk, T, order, step): order moves next to the step, in every view of the scan
    scan_(states.view(len(states), 2, 2, n_chunks, chunk, -1).movedim(2, -2),
          decay.view(2, 2, n_chunks, chunk, -1).movedim(1, -2))

    y = torch.mul(x, D.float().view(ROUTES, dim).sum(0))
    if n_state == 1:  # y += C h, route by route, straight from the states
        for order in (0, 1):
            for h_route, c_route in zip(on_map(h, order)[..., 0, :], _routes(C, order)):
                y.addcmul_(h_route, c_route)
        return y
    c = scratch("cross_selective_scan.C", (*lead, 1, n_state))
    for order in (0, 1):
        on_map(c, order).copy_(_routes(C, order)[..., None, :])
    y_t = torch.matmul(c, h, out=scratch("cross_selective_scan.y", (*lead, 1, dim)))
    for order in (0, 1):
        for y_route in on_map(y_t, order)[..., 0, :]:
            y.add_(y_route)
    return y


def load() -> Impl:
    """The CPU :class:`~ppma.ops.registry.Impl`: the forward above, no residuals, no backward of its
    own (the registry's torch backward recomputes the ``torch`` form)."""
    return Impl(lambda *args: (cross_selective_scan_cpu(*args), ()))
