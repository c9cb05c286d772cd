"""Linear polyline attention: the plain reference (every token's ``d x dv`` state at once).

``q``, ``k``: ``(B, heads, *grid, d)`` non-negative features (callers apply the feature map,
e.g. ``elu + 1``); ``v``: ``(B, heads, *grid, dv)``; decays ``(B, heads, *grid)`` on a 2-D
``(H, W)`` or 3-D ``(T, H, W)`` grid of ``N`` tokens. With ``L2D = L + L^T`` (V2H plus H2V
polyline mask)::

    out_n = q_n^T (L2D (k (x) v))_n / (q_n . (L2D k)_n + eps)

i.e. ``out_n = sum_m L2D[n, m] (q_n . k_m) v_m / (sum_m L2D[n, m] (q_n . k_m) + eps)``. Both
``L2D`` products are one :func:`ppma.ops.polyline_scan` (order ``'both'``) over the
``d*dv + d`` channels of ``[k (x) v, k]``, formed for every token: memory ``O(N d dv)`` for the
whole grid. State, scan, contraction with ``q`` and division are fp32 (fp64 for fp64 inputs)
whatever the inputs' dtype (a state summed over a grid of fp16 tokens outgrows fp16); the
output has ``v``'s dtype.
"""
from __future__ import annotations

import torch

from .._autocast import autocast_off
from ..polyline_attention_impl.reference import _at_least_fp32
from ..polyline_scan_impl.reference import polyline_scan_reference


def polyline_linear_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    log_gamma: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """PyTorch reference of :func:`ppma.ops.polyline_linear_attention` (same contract; no checks)."""
    d, dv = k.shape[-1], v.shape[-1]
    with autocast_off(q.device.type):  # its products stay fp32 under autocast too
        q, k, v_acc = _at_least_fp32(q), _at_least_fp32(k), _at_least_fp32(v)
        state = torch.cat([(k.unsqueeze(-1) * v_acc.unsqueeze(-2)).flatten(-2), k], dim=-1)
        state = polyline_scan_reference(state, log_alpha, log_beta, "both", log_gamma)
        num = torch.einsum("...d,...de->...e", q, state[..., : d * dv].unflatten(-1, (d, dv)))
        den = (q * state[..., d * dv :]).sum(-1, keepdim=True)
    return (num / (den + eps)).to(v.dtype)
