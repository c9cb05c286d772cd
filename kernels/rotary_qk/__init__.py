"""Triton ``rotary_qk`` (PPMA's rotary embedding of ``q`` and ``k``, ``k`` scaled): :func:`forward`
and :func:`backward` of the ``ppma::rotary_qk`` op (:mod:`.rotate`)."""
from .rotate import backward, forward

__all__ = ["backward", "forward"]
