"""The polyline path mask of PPMA (arXiv 2506.15940) and its application ``y = L x``.

All decays are passed in log space (``log_alpha``, ``log_beta``, ``log_gamma`` <= 0). Crossing
from index ``p - 1`` to ``p`` along an axis multiplies by that axis' decay at ``p``, so the 1-D mask
of a line is ``A[j, l] = exp(-|G_j - G_l|)`` with ``G = cumsum(-log_decay)``.

2-D grid ``H x W``, query ``(i, j)``, key ``(k, l)``; alpha decays along rows (the W axis), beta
along columns (the H axis):

- ``'v2h'``: the path leaves the key vertically, then runs horizontally to the query:
  ``L[(i,j),(k,l)] = alpha_{i, j:l} * beta_{i:k, l}``.
- ``'h2v'``: the transpose, ``L^T`` (horizontally first, then vertically).
- ``'both'``: ``L + L^T``.

3-D grid ``T x H x W`` (appendix C.2): the ``'v2h'`` path runs along T with gamma, then along H
with beta, then along W with alpha, so ``L`` is the product of three 1-D masks; ``'h2v'`` is its
transpose (W, then H, then T).

``polyline_scan`` computes ``L x`` in O(N) per channel by 1-D bidirectional decayed scans along
each axis in turn (Theorem 2); ``polyline_mask`` materializes ``L`` in O(N^2) (Theorem 1).
"""
from __future__ import annotations

import torch

from .backend import record_backend, select_backend

ORDERS = ("v2h", "h2v", "both")


def _check_order(order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")


def _check_decays(log_alpha, log_beta, log_gamma, grid_shape=None, x_name="x"):
    """Validate log-decays; returns the grid rank (2 or 3)."""
    names = ("log_alpha", "log_beta") + (("log_gamma",) if log_gamma is not None else ())
    tensors = (log_alpha, log_beta) + ((log_gamma,) if log_gamma is not None else ())
    rank = 5 if log_gamma is not None else 4
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{name} must be float32 (or float64), got {t.dtype}: log-decays are kept in fp32")
        if t.dim() != rank:
            layout = "(B, heads, T, H, W)" if log_gamma is not None else "(B, heads, H, W)"
            raise ValueError(f"{name} must have shape {layout}, got a rank-{t.dim()} tensor {tuple(t.shape)}")
        if t.shape != log_alpha.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but log_alpha has {tuple(log_alpha.shape)}")
        if t.device != log_alpha.device:
            raise ValueError(f"{name} is on {t.device} but log_alpha is on {log_alpha.device}")
        if any(s == 0 for s in t.shape[2:]):
            raise ValueError(f"{name} has an empty grid: shape {tuple(t.shape)}")
        # Value checks need the data on the host; on CUDA they would stall every call.
        if t.device.type == "cpu" and not torch.compiler.is_compiling():
            if torch.isnan(t).any():
                raise ValueError(f"{name} contains NaN")
            if (t > 0).any():
                raise ValueError(f"{name} must be <= 0 (a log-decay), max is {t.max().item():.4g}")
    if grid_shape is not None and tuple(grid_shape) != tuple(log_alpha.shape):
        raise ValueError(
            f"{x_name} has grid {tuple(grid_shape)} (its shape without the channel dim) but the "
            f"decays have shape {tuple(log_alpha.shape)}"
        )
    return rank - 2


def polyline_mask_1d(log_decay: torch.Tensor) -> torch.Tensor:
    """1-D decay mask ``(..., n) -> (..., n, n)``: ``exp(-|G_j - G_l|)``, ``G = cumsum(-log_decay)``.

    Symmetric with a unit diagonal; ``log_decay[..., 0]`` is never used.
    """
    return log_mask_1d(log_decay).exp()


def log_mask_1d(log_decay: torch.Tensor) -> torch.Tensor:
    """Log of :func:`polyline_mask_1d`: ``(..., n) -> (..., n, n)``, ``-|G_j - G_l|``.

    Built from segment sums, ``S[j, l] = sum_{l < p <= j} log_decay[p]`` (zero for ``j <= l``),
    as ``S + S^T``: each entry sums only the decays between ``l`` and ``j``, so it neither
    subtracts large cumulative sums nor loses the gradient where ``G_j - G_l`` rounds to 0.
    """
    if not isinstance(log_decay, torch.Tensor) or not log_decay.is_floating_point():
        raise ValueError("log_decay must be a floating-point tensor")
    if log_decay.dim() < 1:
        raise ValueError("log_decay must have at least one dim (..., n)")
    if log_decay.dtype != torch.float64:
        log_decay = log_decay.float()
    n = log_decay.shape[-1]
    below = torch.ones(n, n, dtype=torch.bool, device=log_decay.device).tril(-1)
    # terms[..., p, l] = log_decay[p] where p > l: cumsum over p gives S[..., j, l]
    terms = log_decay[..., :, None].expand(*log_decay.shape, n).masked_fill(~below, 0.0)
    segsum = terms.cumsum(dim=-2)
    return segsum + segsum.transpose(-1, -2)


def polyline_log_mask(
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    log_gamma: torch.Tensor | None = None,
    transpose: bool = False,
) -> torch.Tensor:
    """Log of the V2H polyline mask (or of its transpose, the H2V mask), materialized.

    Shapes: decays ``(B, heads, H, W)`` -> ``(B, heads, N, N)``, ``N = H*W``; with ``log_gamma``
    decays ``(B, heads, T, H, W)``, ``N = T*H*W``. Row index = query, column index = key. This is
    what the official PPMA adds to the attention logits before the softmax.
    """
    grid_rank = _check_decays(log_alpha, log_beta, log_gamma)
    if grid_rank == 2:  # a 2-D grid is a 3-D grid with T = 1 and no depth decay
        log_alpha, log_beta = log_alpha[:, :, None], log_beta[:, :, None]
    b, h, t, hh, ww = log_alpha.shape
    # Each factor indexed (t, i, j, s, k, l): query (t, i, j), key (s, k, l).
    la = log_mask_1d(log_alpha)  # (b, h, t, i, j, l): row i of frame t
    lb = log_mask_1d(log_beta.transpose(-1, -2)).permute(0, 1, 2, 4, 5, 3)  # (b, h, t, i, k, l): column l
    mask = la[:, :, :, :, :, None, None, :] + lb[:, :, :, :, None, None, :, :]
    if log_gamma is not None:
        lg = log_mask_1d(log_gamma.permute(0, 1, 3, 4, 2))  # (b, h, k, l, t, s): depth line at (k, l)
        mask = mask + lg.permute(0, 1, 4, 5, 2, 3)[:, :, :, None, None, :, :, :]
    n = t * hh * ww
    mask = mask.reshape(b, h, n, n)
    return mask.transpose(-1, -2) if transpose else mask


def polyline_mask(
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str = "both",
    log_gamma: torch.Tensor | None = None,
) -> torch.Tensor:
    """Materialized polyline path mask ``L`` (Theorem 1), O(N^2) memory.

    Shapes: decays ``(B, heads, H, W)`` -> ``(B, heads, H*W, H*W)``; with ``log_gamma`` decays
    ``(B, heads, T, H, W)`` -> ``(B, heads, T*H*W, T*H*W)``. ``order``: ``'v2h'``, ``'h2v'``
    (its transpose) or ``'both'`` (their sum). fp32 (fp64 for fp64 decays).
    """
    _check_order(order)
    mask = polyline_log_mask(log_alpha, log_beta, log_gamma).exp()
    if order == "v2h":
        return mask
    if order == "h2v":
        return mask.transpose(-1, -2)
    return mask + mask.transpose(-1, -2)


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
    """PyTorch reference of :func:`polyline_scan` (same contract; no input checks)."""
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


def polyline_scan(
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str = "both",
    log_gamma: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``y = L x`` without forming ``L`` (Theorem 2), O(N) per channel.

    Shapes: ``x`` ``(B, heads, H, W, C)`` with decays ``(B, heads, H, W)``, or, with ``log_gamma``,
    ``x`` ``(B, heads, T, H, W, C)`` with decays ``(B, heads, T, H, W)``. Any ``C`` and floating
    dtype; sums are accumulated in fp32 and returned in ``x.dtype``. Differentiable in ``x`` and
    every decay. ``order`` as in :func:`polyline_mask`. ``backend``: ``'torch'``, ``'triton'`` or
    ``'auto'`` (default: ``PPMA_BACKEND``, else auto; see :mod:`ppma.ops.backend`).
    """
    _check_order(order)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    want = 6 if log_gamma is not None else 5
    if x.dim() != want:
        layout = "(B, heads, T, H, W, C)" if log_gamma is not None else "(B, heads, H, W, C)"
        raise ValueError(f"x must have shape {layout}, got a rank-{x.dim()} tensor {tuple(x.shape)}")
    _check_decays(log_alpha, log_beta, log_gamma, grid_shape=x.shape[:-1])
    if x.device != log_alpha.device:
        raise ValueError(f"x is on {x.device} but the decays are on {log_alpha.device}")
    chosen = select_backend("polyline_scan", x.device, backend)
    record_backend("polyline_scan", chosen)
    if chosen == "triton":
        from ppma.kernels.polyline_scan import polyline_scan_triton

        return polyline_scan_triton(x, log_alpha, log_beta, order=order, log_gamma=log_gamma)
    return polyline_scan_reference(x, log_alpha, log_beta, order=order, log_gamma=log_gamma)
