"""The ``cross_scan`` / ``cross_merge`` ops: VMamba's four scan routes over a 2-D map and their
adjoint (reference + public functions; data movement only)."""
from .op import cross_merge, cross_scan
from .reference import cross_merge_reference, cross_scan_reference

__all__ = ["cross_merge", "cross_merge_reference", "cross_scan", "cross_scan_reference"]
