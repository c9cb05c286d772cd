"""``polyline_linear_attention`` for ``torch.export`` and ONNX: the whole grid's state at once.

Channel ``(i, j)`` of the state is ``k_i v'_j`` with ``v' = [v, 1]`` (the last column gives the
denominator); it is scanned by :func:`~ppma.ops.polyline_scan_impl.export.polyline_scan_export`
(masks, no loop) and contracted with ``q``. Memory O(N d (dv + 1)): no chunk loop, whose length
would depend on the sizes. fp32 (fp64 for fp64 inputs); the output has ``v``'s dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..polyline_attention_impl.reference import _at_least_fp32
from ..polyline_scan_impl.export import polyline_scan_export
from .chunked import output_from_numerator


def polyline_linear_attention_export(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    log_gamma: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Same contract as :func:`~ppma.ops.polyline_linear_attention_impl.reference.polyline_linear_attention_reference`."""
    q, k, v_ones = _at_least_fp32(q), _at_least_fp32(k), F.pad(_at_least_fp32(v), (0, 1), value=1.0)
    state = (k.unsqueeze(-1) * v_ones.unsqueeze(-2)).flatten(-2)  # (..., d * (dv + 1))
    state = polyline_scan_export(state, log_alpha, log_beta, "both", log_gamma).unflatten(-1, (k.shape[-1], -1))
    num = torch.einsum("...d,...de->...e", q, state)
    return output_from_numerator(num, eps, v.dtype)
