"""Triton ``polyline_decays`` (PPMA's per-head log-decays of the tokens): :func:`forward` and
:func:`backward` of the ``ppma::polyline_decays`` op (:mod:`.projection`)."""
from .projection import backward, forward

__all__ = ["backward", "forward"]
