"""``polyline_scan`` (``y = L x`` without forming ``L``, Theorem 2): the plain reference.

``L x`` is a chain of 1-D scans, one per grid axis: V2H scans every column with beta and then
every row with alpha (3-D: first along T with gamma), H2V the same chain reversed, ``'both'``
sums the two. Each 1-D scan is ``y = A x`` along one axis with the symmetric 1-D mask ``A`` of
:func:`ppma.ops.polyline_mask_1d`.
"""
from __future__ import annotations

import torch

from .._autocast import autocast_off
from ..polyline_mask_impl.reference import log_mask_1d

# Lines up to this length are scanned as one matmul with their materialized 1-D mask (fast on
# CPU, O(N * n) with n bounded); longer lines run the O(N) recurrence.
DENSE_LINE_MAX = 64


def decay_scan_1d(x: torch.Tensor, log_decay: torch.Tensor, dim: int) -> torch.Tensor:
    """``y = A x`` along ``dim`` with ``A = polyline_mask_1d(log_decay)`` on every line.

    ``x``: ``(..., C)`` in fp32/fp64; ``log_decay``: ``x.shape[:-1]``; ``dim`` indexes both
    (a negative ``dim`` counts on ``log_decay``). Lines of length <= ``DENSE_LINE_MAX`` multiply by
    the 1-D mask; longer ones run two linear recurrences, ``y_p = h_p + g_p - x_p`` with the causal
    scan ``h_p = x_p + a_p h_{p-1}`` and the anti-causal scan ``g_p = x_p + a_{p+1} g_{p+1}``.
    Every recurrence step multiplies by a decay <= 1, so nothing cancels.
    """
    dim = dim % log_decay.dim()
    n = log_decay.shape[dim]
    if n <= DENSE_LINE_MAX:
        lines = x.movedim(dim, -2)  # (..., n, C)
        mask = log_mask_1d(log_decay.movedim(dim, -1)).exp().to(x.dtype)  # (..., n, n)
        return (mask @ lines).movedim(-2, dim)
    xs = x.movedim(dim, 0)
    decay = log_decay.exp().to(x.dtype).movedim(dim, 0).unsqueeze(-1)
    fwd = [xs[0]]
    for p in range(1, n):
        fwd.append(xs[p] + decay[p] * fwd[-1])
    bwd = [xs[n - 1]]
    for p in range(n - 2, -1, -1):
        bwd.append(xs[p] + decay[p + 1] * bwd[-1])
    y = torch.stack(fwd) + torch.stack(bwd[::-1]) - xs
    return y.movedim(0, dim)


def polyline_scan_reference(
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str = "both",
    log_gamma: torch.Tensor | None = None,
) -> torch.Tensor:
    """PyTorch reference of :func:`ppma.ops.polyline_scan` (same contract; no input checks).

    fp32 inside (fp64 for fp64 ``x``) whatever ``x``'s dtype, autocast or not; the output has
    ``x``'s dtype."""
    with autocast_off(x.device.type):  # the 1-D masks' products stay fp32
        return _scan_reference(x, log_alpha, log_beta, order, log_gamma)


def _scan_reference(x, log_alpha, log_beta, order, log_gamma):
    acc = x.double() if x.dtype == torch.float64 else x.float()
    # Grid axes of the decays: -1 is W (alpha), -2 is H (beta), -3 is T (gamma).
    v2h_axes = ([(log_gamma, -3)] if log_gamma is not None else []) + [(log_beta, -2), (log_alpha, -1)]

    def run(axes):
        y = acc
        for log_decay, dim in axes:
            y = decay_scan_1d(y, log_decay, dim)
        return y

    if order == "v2h":
        y = run(v2h_axes)
    elif order == "h2v":
        y = run(v2h_axes[::-1])
    else:
        y = run(v2h_axes) + run(v2h_axes[::-1])
    return y.to(x.dtype)
