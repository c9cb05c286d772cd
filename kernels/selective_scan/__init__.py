"""Triton selective scan (Mamba, grouped B/C, fp32 state) in time tiles: :func:`selective_scan_fwd`
and :func:`selective_scan_bwd` (:mod:`.scan`); VMamba's four routes read straight from the map
(:mod:`.routes`)."""
from .scan import compile_cases, selective_scan_bwd, selective_scan_fwd, tile_states_shape

__all__ = ["compile_cases", "selective_scan_bwd", "selective_scan_fwd", "tile_states_shape"]
