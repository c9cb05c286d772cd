"""Public mask functions: :func:`polyline_mask` (the custom op ``ppma::polyline_mask``, registered
below), :func:`polyline_log_mask`, and the FLOPs of building a log mask."""
from __future__ import annotations

import math

import torch

from .._checks import ORDERS, check_choice, check_decays
from ..registry import register, select_backend
from .reference import polyline_log_mask_reference, polyline_mask_reference


def log_mask_flops(decay_shape: tuple[int, ...]) -> int:
    """FLOPs of :func:`polyline_log_mask` for decays of ``decay_shape`` ``(B, heads, [T,] H, W)``.

    Per ``(B, head)``, ``N`` tokens: each axis of length ``n`` has ``N / n`` lines whose 1-D log
    mask has ``n^2`` entries, each a segment sum and a symmetrization (2 FLOPs): ``2 N n`` per
    axis; adding the W and H masks gives ``N * H * W`` entries, adding the T mask ``N^2`` more.
    """
    bh, grid = math.prod(decay_shape[:2]), decay_shape[2:]
    n = math.prod(grid)
    one_d = sum(2 * n * size for size in grid)
    combine = n * grid[-1] * grid[-2] + (n * n if len(grid) == 3 else 0)
    return bh * (one_d + combine)


def _flops(log_alpha, log_beta, order, log_gamma):
    bh, n = math.prod(log_alpha[:2]), math.prod(log_alpha[2:])
    apply = bh * n * n * (2 if order == "both" else 1)  # exp (+ adding the transpose)
    return {"mask": log_mask_flops(log_alpha) + apply}


def _fake(log_alpha, log_beta, order, log_gamma):
    n = math.prod(log_alpha.shape[2:])
    return log_alpha.new_empty(*log_alpha.shape[:2], n, n)


OP = register(
    "polyline_mask",
    arguments="Tensor log_alpha, Tensor log_beta, str order, Tensor? log_gamma",
    reference=polyline_mask_reference,
    fake=_fake,
    flops=_flops,
)


def polyline_mask(
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str = "both",
    log_gamma: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Materialized polyline path mask ``L`` (Theorem 1), O(N^2) memory.

    Shapes: decays ``(B, heads, H, W)`` -> ``(B, heads, H*W, H*W)``; with ``log_gamma`` decays
    ``(B, heads, T, H, W)`` -> ``(B, heads, T*H*W, T*H*W)``. ``order``: ``'v2h'``, ``'h2v'``
    (its transpose) or ``'both'`` (their sum). fp32 (fp64 for fp64 decays). Differentiable in
    every decay. ``backend``: as in :func:`ppma.ops.select_backend` (only ``'torch'`` exists).
    """
    check_choice("order", order, ORDERS)
    check_decays(log_alpha, log_beta, log_gamma)
    return OP(log_alpha, log_beta, order, log_gamma, backend=select_backend("polyline_mask", log_alpha.device, backend))


def polyline_log_mask(
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    log_gamma: torch.Tensor | None = None,
    transpose: bool = False,
) -> torch.Tensor:
    """Log of the V2H polyline mask (or of its transpose, the H2V mask), materialized.

    Shapes: decays ``(B, heads, H, W)`` -> ``(B, heads, N, N)``, ``N = H*W``; with ``log_gamma``
    decays ``(B, heads, T, H, W)``, ``N = T*H*W``. Row index = query, column index = key. This is
    what the official PPMA adds to the attention logits before the softmax. A building block of
    the references (a plain function, not a custom op).
    """
    check_decays(log_alpha, log_beta, log_gamma)
    return polyline_log_mask_reference(log_alpha, log_beta, log_gamma, transpose)
