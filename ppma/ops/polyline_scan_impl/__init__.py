"""The ``polyline_scan`` op: ``y = L x`` in O(N) per channel (reference + public, Triton kernel)."""
from .op import polyline_scan
from .reference import decay_scan_1d, polyline_scan_reference

__all__ = ["decay_scan_1d", "polyline_scan", "polyline_scan_reference"]
