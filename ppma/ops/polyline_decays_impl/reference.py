"""Plain PyTorch reference of ``polyline_decays``: a per-head linear map of the tokens, then
Mamba-2's ``-softplus(t + dt_bias) * exp(A_log)`` (the log-decays of PPMA's polyline path mask)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def decays_of_projection(t: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor) -> torch.Tensor:
    """``-softplus(t + dt_bias[h]) * exp(A_log[h])`` of the projected tokens ``t`` ``(B, *grid,
    heads, n_axes)``, as ``(n_axes, B, heads, *grid)``: contiguous, fp32 (fp64 kept), each axis'
    decays a contiguous ``(B, heads, *grid)`` plane. One copy makes ``t`` so, then the elementwise
    ops run along whole grids."""
    t = t.movedim(-1, 0).movedim(-1, 2)
    t = t.contiguous() if t.dtype in (torch.float32, torch.float64) else t.to(torch.float32, memory_format=torch.contiguous_format)
    per_head = (dt_bias.shape[0],) + (1,) * (t.dim() - 3)
    return -F.softplus(t + dt_bias.to(t.dtype).view(per_head)) * A_log.to(t.dtype).exp().view(per_head)


def polyline_decays_reference(x: torch.Tensor, weight: torch.Tensor, dt_bias: torch.Tensor,
                              A_log: torch.Tensor) -> torch.Tensor:
    """Log-decays ``(n_axes, B, heads, *grid)`` of the tokens ``x`` ``(B, *grid, C)``: each head's
    slice ``x_h`` (``d = C / heads`` channels) mapped by ``weight`` ``(n_axes, d)``, shared by the
    heads, then :func:`decays_of_projection` with ``dt_bias`` and ``A_log`` ``(heads,)``. The
    projection runs in ``x``'s dtype (autocast's where it is on), as the Triton kernels take any
    mix of dtypes."""
    t = F.linear(x.unflatten(-1, (dt_bias.shape[0], -1)), weight.to(x.dtype))
    return decays_of_projection(t, dt_bias, A_log)
