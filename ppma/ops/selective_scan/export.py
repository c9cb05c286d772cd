"""Selective scan for ``torch.export`` and ONNX: plain ATen ops, a graph that does not grow with L.

The linear recurrence ``h_t = exp(a_t) h_{t-1} + x_t`` (``a = dt A``, ``x = dt B u``) is solved in
Mamba-2's segment-sum form on a fixed hierarchy of chunks of :data:`CHUNK` steps:

- inside a chunk, ``h_t = sum_{s <= t} exp(S[t, s]) x_s`` with the segment sums
  ``S[t, s] = a_{s+1} + ... + a_t`` (a ``CHUNK x CHUNK`` matrix per line, from a masked cumulative
  sum: nothing large is subtracted);
- the chunks' end states obey the same recurrence over chunks (decay: the chunk's summed ``a``),
  solved the same way one level up; :data:`LEVELS` levels, then one dense segment sum over the
  remaining (dynamic) number of top chunks;
- ``h_t = local_t + exp(a_{start} + ... + a_t) * h_{start - 1}``.

Each level pads its length to a multiple of ``CHUNK`` (by ``CHUNK + 1`` to ``2 CHUNK`` steps) with steps of decay 1 and input 0, which
leave the state unchanged. Memory O(L * CHUNK + (L / CHUNK ** LEVELS) ** 2) per (batch, channel, state),
FLOPs the same; every exponent is a sum of ``a <= 0`` (``A <= 0``), so nothing overflows. fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import discretized_dt, per_channel

CHUNK = 16
LEVELS = 2


def segment_sums(a: torch.Tensor) -> torch.Tensor:
    """``(..., n) -> (..., n, n)``: ``S[t, s] = a_{s+1} + ... + a_t`` for ``t >= s``, ``-inf`` above."""
    n = a.shape[-1]
    ones = torch.ones(n, n, dtype=torch.bool, device=a.device)
    # terms[..., p, s] = a_p where p > s: the cumulative sum over p is S[..., t, s]
    segsum = a[..., :, None].expand(*a.shape, n).masked_fill(~ones.tril(-1), 0.0).cumsum(dim=-2)
    return segsum.masked_fill(ones.triu(1), float("-inf"))


def _dense_scan(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """The recurrence along the last dim of ``x``, ``a`` ``(..., n)``, from a zero state: ``h`` ``(..., n)``."""
    return (segment_sums(a).exp() * x[..., None, :]).sum(-1)


def linear_scan(x: torch.Tensor, a: torch.Tensor, levels: int = LEVELS) -> torch.Tensor:
    """``h_t = exp(a_t) h_{t-1} + x_t`` along the last dim, ``h_{-1} = 0``; ``x``, ``a`` ``(..., L)``.
    Returns ``h`` ``(..., L)``.

    Sizes are only padded and narrowed (never cut by a size-dependent amount such as ``[:-1]``),
    so ``torch.export`` keeps every length symbolic, whatever the example's length.
    """
    if levels == 0:
        return _dense_scan(x, a)
    length = x.shape[-1]
    # At least CHUNK + 1 steps of padding: a pad of 0 or a single chunk would be specialized on
    # by torch.export (sizes 0 and 1 are), fixing the graph to the example's length.
    pad = 2 * CHUNK - length % CHUNK
    chunks = (length + pad) // CHUNK
    xc, ac = (F.pad(t, (0, pad)).view(*t.shape[:-1], chunks, CHUNK) for t in (x, a))  # (..., chunks, CHUNK)
    local = _dense_scan(xc, ac)
    # The state entering chunk c is the state after chunk c - 1: scan the chunks' end states
    # behind a zero (decay 1) step, so that entry c is the state before chunk c.
    ends, decays = (F.pad(t, (1, 0)) for t in (local[..., -1], ac.sum(-1)))
    starts = linear_scan(ends, decays, levels - 1).narrow(-1, 0, chunks)
    h = local + ac.cumsum(-1).exp() * starts[..., None]
    return h.flatten(-2).narrow(-1, 0, length)


def selective_scan_export(
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
    """Same contract as :func:`~ppma.ops.selective_scan.reference.selective_scan_reference`:
    ``(y, last_state)``, ``y`` ``(batch, dim, L)``, ``last_state`` ``(batch, dim, N)`` fp32."""
    dim = u.shape[1]
    x = u.float()
    dt = discretized_dt(delta, delta_bias, delta_softplus)
    a = dt[:, :, None, :] * A.float()[None, :, :, None]  # (batch, dim, N, L)
    h = linear_scan(dt[:, :, None, :] * x[:, :, None, :] * per_channel(B, dim), a)  # (batch, dim, N, L)
    y = (h * per_channel(C, dim)).sum(2)
    if D is not None:
        y = y + D.float()[:, None] * x
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(out_dtype or u.dtype), h[..., -1]
