"""Triton polyline masked attention, no ``N x N``: the vanilla kind (:mod:`.vanilla`) and the
criss-cross kind (:mod:`.criss_cross`, built on the 1-D line attention of :mod:`.line`)."""
from .criss_cross import criss_cross_attention_bwd, criss_cross_attention_fwd
from .vanilla import vanilla_attention_bwd, vanilla_attention_fwd

__all__ = ["criss_cross_attention_bwd", "criss_cross_attention_fwd", "vanilla_attention_bwd", "vanilla_attention_fwd"]
