"""The ``polyline_attention`` op: vanilla and criss-cross polyline masked attention (reference,
public op with the fused Triton kernels of ``ppma.kernels.polyline_attention``, FlexAttention
form in :mod:`.flex`)."""
from .op import polyline_attention
from .reference import FORMS, KINDS, polyline_attention_reference

__all__ = ["FORMS", "KINDS", "polyline_attention", "polyline_attention_reference"]
