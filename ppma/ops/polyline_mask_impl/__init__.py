"""The ``polyline_mask`` op: the polyline path mask materialized, O(N^2) (reference + public)."""
from .op import log_mask_flops, polyline_log_mask, polyline_mask
from .reference import log_mask_1d, polyline_log_mask_reference, polyline_mask_1d, polyline_mask_reference

__all__ = [
    "log_mask_1d",
    "log_mask_flops",
    "polyline_log_mask",
    "polyline_log_mask_reference",
    "polyline_mask",
    "polyline_mask_1d",
    "polyline_mask_reference",
]
