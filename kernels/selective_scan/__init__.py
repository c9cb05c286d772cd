"""Triton selective scan (Mamba, grouped B/C, fp32 state): :func:`selective_scan_fwd` and
:func:`selective_scan_bwd` (:mod:`.scan`)."""
from .scan import chunk_states_shape, selective_scan_bwd, selective_scan_fwd

__all__ = ["chunk_states_shape", "selective_scan_bwd", "selective_scan_fwd"]
