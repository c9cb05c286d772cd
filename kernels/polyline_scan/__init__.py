"""Triton ``polyline_scan`` (``y = L x``): :func:`forward` and :func:`backward` of the
``ppma::polyline_scan`` op: fused 2-D kernels (:mod:`.plane_scan`), else 1-D decay scans
(:mod:`.decay_scan`)."""
from .scan import backward, forward

__all__ = ["backward", "forward"]
