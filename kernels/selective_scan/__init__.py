"""Triton selective scan (Mamba, grouped B/C, fp32 state): :func:`selective_scan_fwd` and
:func:`selective_scan_bwd` (:mod:`.scan`)."""
from .scan import selective_scan_bwd, selective_scan_fwd

__all__ = ["selective_scan_bwd", "selective_scan_fwd"]
