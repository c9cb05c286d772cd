"""Selective scan in plain PyTorch for the CPU: a two-level chunked scan in O(sqrt L) Python steps.

The sequence is cut into ``n_chunks`` chunks of ``T ~ sqrt(L)`` steps (the last one padded with
steps of decay 1 and input 0, which leave the state unchanged). Then

1. every chunk scans from a zero state, all chunks at once: ``T`` vectorized steps;
2. the chunk-start states are carried across chunks: ``n_chunks`` small steps
   ``s_c = exp(sum of chunk c-1's log-decays) * s_{c-1} + (chunk c-1's local final state)``;
3. ``h_t = local_t + exp(cum_t) * s_c`` with ``cum_t`` the log-decays summed from the chunk start.

Every factor is ``exp`` of a sum of log-decays ``dt * A <= 0`` (for ``A <= 0``), so nothing is
divided by a cumulative product and nothing overflows, however large ``dt * |A|`` gets; fp32
throughout. Differentiable by autograd; memory O(batch * dim * N * L) for the states.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .reference import discretized_dt


def _grouped(bc: torch.Tensor, pad: int) -> torch.Tensor:
    """B or C ``(batch, [G,] N, L)`` -> fp32 ``(batch, G, 1, L + pad, N)`` (broadcasts over channels)."""
    if bc.dim() == 3:
        bc = bc[:, None]
    return F.pad(bc.float(), (0, pad)).transpose(-1, -2)[:, :, None]


def selective_scan_chunked(
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
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`~ppma.ops.selective_scan_impl.reference.selective_scan_reference`.

    ``chunk``: steps per chunk (default ``ceil(sqrt(L))``). Returns ``(y, last_state)``.
    """
    batch, dim, length = u.shape
    groups = B.shape[1] if B.dim() == 4 else 1
    n_state = A.shape[1]
    chunk = chunk or math.isqrt(max(length - 1, 0)) + 1  # ceil(sqrt(L))
    n_chunks = max(1, -(-length // chunk))
    pad = n_chunks * chunk - length
    split = (batch, groups, dim // groups, n_chunks, chunk, n_state)

    x = u.float()
    dt = discretized_dt(delta, delta_bias, delta_softplus)
    dt_p = F.pad(dt, (0, pad)).view(batch, groups, dim // groups, -1, 1)
    x_p = F.pad(x, (0, pad)).view(batch, groups, dim // groups, -1, 1)
    log_decay = (dt_p * A.float().view(groups, dim // groups, 1, n_state)).view(split)
    inputs = (dt_p * x_p * _grouped(B, pad)).view(split)

    # Steps are taken with unbind (its gradient is one stack, where indexing would add a
    # full-size zero tensor per step).
    decays, steps = log_decay.exp().unbind(-2), inputs.unbind(-2)
    local = [steps[0]]  # 1. scan inside every chunk from a zero state
    for i in range(1, chunk):
        local.append(decays[i] * local[-1] + steps[i])
    cum = log_decay.cumsum(dim=-2)
    chunk_decays, chunk_ends = cum[..., -1, :].exp().unbind(-2), local[-1].unbind(-2)
    starts = [torch.zeros_like(chunk_ends[0])]  # 2. carry the state across chunks
    for c in range(1, n_chunks):
        starts.append(chunk_decays[c - 1] * starts[-1] + chunk_ends[c - 1])
    local, starts = torch.stack(local, dim=-2), torch.stack(starts, dim=-2)
    h = local + cum.exp() * starts[..., None, :]  # 3. states (batch, G, dim/G, n_chunks, T, N)

    h = h.reshape(batch, groups, dim // groups, -1, n_state)
    y = (h * _grouped(C, pad)).sum(-1).reshape(batch, dim, -1)[..., :length]
    if D is not None:
        y = y + D.float()[:, None] * x
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(out_dtype or u.dtype), h[..., -1, :].reshape(batch, dim, n_state)
