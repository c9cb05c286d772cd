"""The polyline path mask of PPMA (arXiv 2506.15940), materialized: the plain reference.

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
transpose (W, then H, then T). Materializing ``L`` costs O(N^2) (Theorem 1).

No input checks here: the public functions (:mod:`.op`) check.
"""
from __future__ import annotations

import torch


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


def polyline_mask_1d(log_decay: torch.Tensor) -> torch.Tensor:
    """1-D decay mask ``(..., n) -> (..., n, n)``: ``exp(-|G_j - G_l|)``, ``G = cumsum(-log_decay)``.

    Symmetric with a unit diagonal; ``log_decay[..., 0]`` is never used.
    """
    return log_mask_1d(log_decay).exp()


def polyline_log_mask_reference(
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    log_gamma: torch.Tensor | None = None,
    transpose: bool = False,
) -> torch.Tensor:
    """Log of the V2H polyline mask (or of its transpose, the H2V mask), materialized.

    Shapes: decays ``(B, heads, H, W)`` -> ``(B, heads, N, N)``, ``N = H*W``; with ``log_gamma``
    decays ``(B, heads, T, H, W)``, ``N = T*H*W``. Row index = query, column index = key.
    """
    if log_gamma is None:  # a 2-D grid is a 3-D grid with T = 1 and no depth decay
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


def polyline_mask_reference(
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str = "both",
    log_gamma: torch.Tensor | None = None,
) -> torch.Tensor:
    """The polyline path mask ``L`` (``'v2h'``), ``L^T`` (``'h2v'``) or ``L + L^T`` (``'both'``),
    ``(B, heads, N, N)``, fp32 (fp64 for fp64 decays)."""
    mask = polyline_log_mask_reference(log_alpha, log_beta, log_gamma).exp()
    if order == "v2h":
        return mask
    if order == "h2v":
        return mask.transpose(-1, -2)
    return mask + mask.transpose(-1, -2)
