"""Tensor math as plain functions: references in PyTorch, Triton kernels where they pay off."""
from .backend import backend_report, select_backend
from .polyline import (
    ORDERS,
    decay_scan_1d,
    log_mask_1d,
    polyline_log_mask,
    polyline_mask,
    polyline_mask_1d,
    polyline_scan,
    polyline_scan_reference,
)

__all__ = [
    "ORDERS",
    "backend_report",
    "decay_scan_1d",
    "log_mask_1d",
    "polyline_log_mask",
    "polyline_mask",
    "polyline_mask_1d",
    "polyline_scan",
    "polyline_scan_reference",
    "select_backend",
]
