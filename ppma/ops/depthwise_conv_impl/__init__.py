"""The ``depthwise_conv`` op: a depthwise convolution on channels-last grids, its input optionally
added (reference + public, Triton kernel)."""
from .op import depthwise_conv
from .reference import depthwise_conv_reference

__all__ = ["depthwise_conv", "depthwise_conv_reference"]
