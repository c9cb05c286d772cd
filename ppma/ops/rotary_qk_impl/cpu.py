"""CPU backend of ``ppma::rotary_qk``: the reference forward, and a backward that applies the
transposed rotation to the outputs' gradients (the torch backend would run the forward again under
``torch.func.vjp``)."""
from __future__ import annotations

import torch

from ..registry import Impl
from .reference import rotary_qk_reference, rotate_pairs


def load() -> Impl:
    def forward(q, k, rotation, k_scale):
        return rotary_qk_reference(q, k, rotation, k_scale), ()

    def backward(grads, residuals, q, k, rotation, k_scale):
        transposed = torch.view_as_complex(rotation).conj_physical()  # a lazy conj() is lost under dispatch modes
        dq = rotate_pairs(grads[0], transposed).to(q.dtype)
        dk = rotate_pairs(grads[1], transposed).mul_(k_scale).to(k.dtype)
        return [dq, dk, torch.zeros_like(rotation)]

    return Impl(forward, backward)
