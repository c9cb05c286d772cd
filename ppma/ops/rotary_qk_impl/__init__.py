"""The ``rotary_qk`` op: PPMA's rotary embedding of ``q`` and ``k`` (reference + public, Triton kernel)."""
from .op import rotary_qk
from .reference import rotary_qk_reference, rotate_pairs

__all__ = ["rotary_qk", "rotary_qk_reference", "rotate_pairs"]
