"""The ``polyline_attention`` op: vanilla and criss-cross polyline masked attention (reference +
public; the seam for a fused kernel)."""
from .op import polyline_attention
from .reference import FORMS, KINDS, polyline_attention_reference

__all__ = ["FORMS", "KINDS", "polyline_attention", "polyline_attention_reference"]
