"""``polyline_scan`` for ``torch.export`` and ONNX: every 1-D scan a product with its 1-D mask.

The reference runs lines longer than ``DENSE_LINE_MAX`` as a Python loop over tokens, which
neither ONNX nor dynamic sizes allow; here every line of length ``n`` multiplies by its
``n x n`` mask (from segment sums, :func:`~ppma.ops.polyline_mask_impl.reference.log_mask_1d`), at
any size: memory and FLOPs O(N n) per axis of length ``n``.
"""
from __future__ import annotations

import torch

from ..polyline_mask_impl.reference import log_mask_1d


def _masked_scan_1d(x: torch.Tensor, log_decay: torch.Tensor, dim: int) -> torch.Tensor:
    """``y = A x`` along ``dim`` (of ``log_decay``; ``x`` has one more, channel, dim) with the 1-D mask."""
    mask = log_mask_1d(log_decay.movedim(dim, -1)).exp().to(x.dtype)  # (..., n, n)
    return (mask @ x.movedim(dim, -2)).movedim(-2, dim)


def polyline_scan_export(
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str = "both",
    log_gamma: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as :func:`~ppma.ops.polyline_scan_impl.reference.polyline_scan_reference`."""
    acc = x.double() if x.dtype == torch.float64 else x.float()
    w_axis = log_alpha.dim() - 1
    v2h_axes = ([(log_gamma, w_axis - 2)] if log_gamma is not None else []) + [(log_beta, w_axis - 1),
                                                                                 (log_alpha, w_axis)]

    def run(axes):
        y = acc
        for log_decay, dim in axes:
            y = _masked_scan_1d(y, log_decay, dim)
        return y

    if order == "v2h":
        y = run(v2h_axes)
    elif order == "h2v":
        y = run(v2h_axes[::-1])
    else:
        y = run(v2h_axes) + run(v2h_axes[::-1])
    return y.to(x.dtype)
