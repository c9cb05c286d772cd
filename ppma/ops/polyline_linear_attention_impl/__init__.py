"""The ``polyline_linear_attention`` op: linear polyline attention in O(N) (reference, chunked
PyTorch path that never holds the whole grid's ``d x dv`` state, public function)."""
from .chunked import polyline_linear_attention_chunked
from .op import polyline_linear_attention
from .reference import polyline_linear_attention_reference

__all__ = [
    "polyline_linear_attention",
    "polyline_linear_attention_chunked",
    "polyline_linear_attention_reference",
]
