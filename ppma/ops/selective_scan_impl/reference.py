"""Sequential fp32 reference of Mamba's selective scan: the oracle the fast paths are tested on.

Per channel ``c`` of batch ``b`` (group ``g = c // (dim // G)``), with state ``h`` of size ``N``:

    dt_t = softplus(delta_t + delta_bias)        (or delta_t + delta_bias without softplus)
    h_t  = exp(dt_t * A) * h_{t-1} + dt_t * B_t * u_t,      h_{-1} = 0
    y_t  = C_t . h_t + D * u_t,   times silu(z_t) when z is given
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def discretized_dt(delta: torch.Tensor, delta_bias: torch.Tensor | None, delta_softplus: bool) -> torch.Tensor:
    """``(batch, dim, L)`` step sizes in fp32: ``delta + delta_bias``, through softplus if asked."""
    dt = delta.float()
    if delta_bias is not None:
        dt = dt + delta_bias.float()[:, None]
    return F.softplus(dt) if delta_softplus else dt


def per_channel(bc: torch.Tensor, dim: int) -> torch.Tensor:
    """B or C, ``(batch, N, L)`` or grouped ``(batch, G, N, L)``, as ``(batch, dim, N, L)`` fp32."""
    if bc.dim() == 3:
        bc = bc[:, None]
    return bc.float().repeat_interleave(dim // bc.shape[1], dim=1)


def selective_scan_reference(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One time step at a time, in fp32. Same contract as :func:`ppma.ops.selective_scan` (no checks).

    Returns ``(y, last_state)``: ``y`` ``(batch, dim, L)`` in ``out_dtype`` (default ``u.dtype``),
    ``last_state`` ``(batch, dim, N)`` fp32 (``h`` after the last step).
    """
    batch, dim, length = u.shape
    dt = discretized_dt(delta, delta_bias, delta_softplus)
    x = u.float()
    A = A.float()
    B, C = per_channel(B, dim), per_channel(C, dim)
    h = x.new_zeros(batch, dim, A.shape[1])
    ys = []
    for dt_t, x_t, B_t, C_t in zip(dt.unbind(-1), x.unbind(-1), B.unbind(-1), C.unbind(-1)):
        h = torch.exp(dt_t[:, :, None] * A) * h + (dt_t * x_t)[:, :, None] * B_t
        ys.append((h * C_t).sum(-1))
    y = torch.stack(ys, dim=-1)
    if D is not None:
        y = y + D.float()[:, None] * x
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(out_dtype or u.dtype), h


def random_inputs(
    batch: int,
    dim: int,
    n_state: int,
    length: int,
    groups: int = 1,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    D: bool = False,
    z: bool = False,
    delta_bias: bool = False,
    delta_softplus: bool = False,
    a_max: float = 2.0,
) -> dict[str, torch.Tensor | None]:
    """Random arguments of :func:`selective_scan_reference` by name (tests and benchmarks).

    ``u``, ``delta``, ``B``, ``C``, ``z`` in ``dtype``, ``A``, ``D``, ``delta_bias`` in fp32;
    ``A`` uniform in ``[-a_max, 0]``; B/C grouped ``(batch, G, N, L)`` when ``groups > 1``. The
    flags say which optional inputs to make; without softplus, ``delta`` and ``delta_bias`` are
    positive (``dt >= 0``).
    """
    bc = (batch, groups, n_state, length) if groups > 1 else (batch, n_state, length)
    delta = torch.randn(batch, dim, length)
    inputs = dict(
        u=torch.randn(batch, dim, length), delta=delta if delta_softplus else delta.abs() * 0.5,
        A=-torch.rand(dim, n_state) * a_max, B=torch.randn(bc), C=torch.randn(bc),
        D=torch.randn(dim) if D else None, z=torch.randn(batch, dim, length) if z else None,
        delta_bias=(torch.randn(dim) if delta_softplus else torch.rand(dim)) if delta_bias else None,
    )
    low = ("u", "delta", "B", "C", "z")
    return {k: None if v is None else v.to(device, dtype if k in low else torch.float32) for k, v in inputs.items()}
