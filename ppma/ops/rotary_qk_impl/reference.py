"""Plain PyTorch reference of ``rotary_qk``: PPMA's rotary embedding of ``q`` and ``k`` (``k`` scaled
first), each channel pair a complex number times the token's rotation."""
from __future__ import annotations

import torch


def rotate_pairs(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Channel pairs ``(2m, 2m+1)`` of ``x`` ``(..., *grid, d)`` as complex numbers times ``rotation``
    (complex ``(*grid, d // 2)``): one pass over ``x`` in fp32 (fp64 kept), the result in ``x``'s
    dtype, contiguous."""
    work = torch.promote_types(x.dtype, torch.float32)
    pairs = x.contiguous() if x.dtype == work else x.to(work, memory_format=torch.contiguous_format)
    return torch.view_as_real(torch.view_as_complex(pairs.unflatten(-1, (-1, 2))) * rotation).flatten(-2).to(x.dtype)


def rotary_qk_reference(q: torch.Tensor, k: torch.Tensor, rotation: torch.Tensor,
                        k_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rope(q), rope(k * k_scale))`` for ``q``, ``k`` ``(B, heads, *grid, d)`` and ``rotation``
    fp32 ``(*grid, d // 2, 2)``: each token's ``(cos, sin)`` per channel pair."""
    table = torch.view_as_complex(rotation)
    return rotate_pairs(q, table), rotate_pairs(k * k_scale, table)
