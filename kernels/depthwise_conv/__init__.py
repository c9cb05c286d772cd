"""Triton ``depthwise_conv`` (a depthwise conv on channels-last grids, its input optionally added):
:func:`forward` and :func:`backward` of the ``ppma::depthwise_conv`` op (:mod:`.conv`)."""
from .conv import backward, forward

__all__ = ["backward", "forward"]
