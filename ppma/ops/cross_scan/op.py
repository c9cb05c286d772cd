"""Public :func:`cross_scan` and :func:`cross_merge`: the custom ops ``ppma::cross_scan`` and
``ppma::cross_merge``, registered below. Pure data movement: no kernel, 0 FLOPs; each one's
gradient is the other (they are adjoint), which the torch backend gets by ``torch.func.vjp``."""
from __future__ import annotations

import torch

from ..registry import register, select_backend
from .reference import cross_merge_reference, cross_scan_reference

ROUTES = 4


def _no_flops(x):
    return {"copy": 0}


SCAN_OP = register(
    "cross_scan",
    arguments="Tensor x",
    reference=cross_scan_reference,
    fake=lambda x: x.new_empty(x.shape[0], ROUTES, x.shape[1], x.shape[2] * x.shape[3]),
    flops=_no_flops,
)
MERGE_OP = register(
    "cross_merge",
    arguments="Tensor y",
    reference=cross_merge_reference,
    fake=lambda y: y.new_empty(y.shape[0], *y.shape[2:]),
    flops=_no_flops,
)


def cross_scan(x: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """VMamba's four routes: ``(B, C, H, W)`` -> ``(B, 4, C, H*W)``.

    Route 0 reads the map row-major, 1 column-major, 2 and 3 are 0 and 1 reversed.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a (B, C, H, W) tensor, got {getattr(x, 'shape', type(x).__name__)}")
    return SCAN_OP(x, backend=select_backend("cross_scan", x.device, backend))


def cross_merge(y: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """Adjoint of :func:`cross_scan`: ``(B, 4, C, H, W)`` -> ``(B, C, H, W)``, the four routes'
    sequences put back on the map and summed.

    ``y[:, k]`` is route ``k``'s sequence viewed as ``(H, W)``: pass the ``(B, 4, C, H*W)`` scan
    output as ``.view(B, 4, C, H, W)`` (the map's size cannot be read from ``H*W``).
    """
    if not isinstance(y, torch.Tensor) or y.dim() != 5 or y.shape[1] != ROUTES:
        raise ValueError(f"y must be a (B, 4, C, H, W) tensor, got {getattr(y, 'shape', type(y).__name__)}")
    return MERGE_OP(y, backend=select_backend("cross_merge", y.device, backend))
