"""Triton linear polyline attention on 2-D grids in row strips (:mod:`.tiled`): tensor-core tiles
inside a strip, per-column ``d x dv'`` states between strips."""
from .tiled import linear_attention_tiled_fwd

__all__ = ["linear_attention_tiled_fwd"]
