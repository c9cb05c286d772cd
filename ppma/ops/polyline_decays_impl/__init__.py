"""The ``polyline_decays`` op: PPMA's per-head log-decays of the tokens (reference + public, Triton kernel)."""
from .op import polyline_decays
from .reference import decays_of_projection, polyline_decays_reference

__all__ = ["decays_of_projection", "polyline_decays", "polyline_decays_reference"]
