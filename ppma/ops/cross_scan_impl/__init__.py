"""The ``cross_scan`` / ``cross_merge`` ops, VMamba's four scan routes over a 2-D map and their
adjoint (data movement only), and ``cross_selective_scan``, the selective scan along them
(references, public functions, its CPU kernel)."""
from .op import cross_merge, cross_scan, cross_selective_scan
from .reference import cross_merge_reference, cross_scan_reference, cross_selective_scan_reference

__all__ = ["cross_merge", "cross_merge_reference", "cross_scan", "cross_scan_reference", "cross_selective_scan",
           "cross_selective_scan_reference"]
