"""Tensor math as ops: plain PyTorch references, Triton kernels where they pay off.

One folder per op, ``ppma/ops/<op>_impl/`` (``reference.py``: the plain reference; ``op.py``: its
registration in :mod:`.registry` and the public function, exported here under the op's name:
``ppma.ops.polyline_scan`` is the function, ``ppma.ops.polyline_scan_impl`` its folder). See
docs/ops.md.
"""
from .._deprecation import moved_packages
from ._checks import ORDERS
from .cross_scan_impl import cross_merge, cross_scan, cross_selective_scan
from .depthwise_conv_impl import depthwise_conv
from .polyline_attention_impl import polyline_attention, polyline_attention_reference
from .polyline_decays_impl import polyline_decays
from .polyline_linear_attention_impl import polyline_linear_attention
from .polyline_mask_impl import log_mask_1d, polyline_log_mask, polyline_mask, polyline_mask_1d
from .polyline_scan_impl import decay_scan_1d, polyline_scan, polyline_scan_reference
from .registry import backend_report, registered_ops, select_backend
from .rotary_qk_impl import rotary_qk
from .selective_scan_impl import selective_scan

# The folders' names before they took the suffix ``_impl`` (each was hidden by its function).
moved_packages({
    f"{__name__}.{op}": f"{__name__}.{op}_impl"
    for op in ("cross_scan", "polyline_attention", "polyline_linear_attention", "polyline_mask", "polyline_scan",
               "selective_scan")
})

__all__ = [
    "ORDERS",
    "backend_report",
    "cross_merge",
    "cross_scan",
    "cross_selective_scan",
    "decay_scan_1d",
    "depthwise_conv",
    "log_mask_1d",
    "polyline_attention",
    "polyline_attention_reference",
    "polyline_decays",
    "polyline_linear_attention",
    "polyline_log_mask",
    "polyline_mask",
    "polyline_mask_1d",
    "polyline_scan",
    "polyline_scan_reference",
    "registered_ops",
    "rotary_qk",
    "select_backend",
    "selective_scan",
]
