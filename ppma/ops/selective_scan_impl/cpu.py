"""CPU kernel of ``selective_scan``: the in-place time-major scan of :mod:`ppma.ops._inplace_scan`
over the inputs ``x_t = dt_t B_t u_t`` (one ``addcmul_`` per step, chunked when a step is small).
Decays are ``exp(dt A) <= 1`` (``A <= 0``), products of them never overflow. fp32 throughout; the
large temporaries live in per-thread scratch buffers kept between calls
(:mod:`ppma.ops._scratch`). The backward is the ``torch`` backend's (``torch.func.vjp`` through
:func:`~.chunked.selective_scan_chunked`): the in-place scan has no autograd formula.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._inplace_scan import chunk_length, scan_, softplus_
from .._scratch import scratch
from ..registry import Impl


def _time_major(t: torch.Tensor, n_steps: int, slot: str) -> torch.Tensor:
    """``(batch, C, L)`` -> fp32 ``(n_steps, batch, C)`` contiguous in scratch ``slot``, zero after
    step ``L``: one pass, PyTorch's blocked 2-D transpose (a 3-D permuted copy takes 3-5x as long)."""
    batch, channels, length = t.shape
    out = scratch(f"selective_scan.{slot}", (n_steps, batch, channels))
    out[:length].view(length, -1).copy_(t.reshape(-1, length).t())
    out[length:].zero_()
    return out


def selective_scan_cpu(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, out_dtype=None,
                       chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`~ppma.ops.selective_scan_impl.reference.selective_scan_reference`.

    ``chunk``: steps per chunk (default :func:`chunk_length`). Returns ``(y, last_state)``.
    """
    batch, dim, length = u.shape
    groups, n_state = (B.shape[1] if B.dim() == 4 else 1), A.shape[1]
    chunk = min(chunk or chunk_length(length, batch * dim * n_state), length)
    n_chunks = -(-length // chunk)
    lead = (n_chunks, chunk, batch, groups)  # time index = chunk index * T + step
    states = (*lead, n_state, dim // groups)  # channels innermost, where the products vectorize

    dt = _time_major(delta, n_chunks * chunk, "dt")
    if delta_bias is not None:
        dt[:length] += delta_bias.float()
    if delta_softplus:
        softplus_(dt)
        dt[length:].zero_()  # decay 1, input 0
    dt = dt.view(*lead, 1, -1)
    b_t, c_t = (_time_major(t.flatten(1, -2), n_chunks * chunk, name).view(*lead, n_state, 1)
                for t, name in ((B, "B"), (C, "C")))
    x = _time_major(u, n_chunks * chunk, "x").view(*lead, 1, -1)
    a = A.float().view(groups, dim // groups, n_state).transpose(1, 2)
    decay = torch.mul(dt, a, out=scratch("selective_scan.decay", states)).exp_()
    h = scratch("selective_scan.h", (1 + (n_chunks > 1), 1, *states))
    torch.mul(dt.mul_(x), b_t, out=h[0, 0])  # the inputs dt B u, scanned in place into the states
    scan_(h.flatten(4), decay[None].flatten(3))
    h = h[0, 0]

    last = h.view(n_chunks * chunk, batch, groups, n_state, -1)[length - 1]
    last = last.transpose(-1, -2).reshape(batch, dim, n_state)  # a copy: h is scratch
    y_t = scratch("selective_scan.y", (*lead, 1, dim // groups))
    torch.matmul(c_t.transpose(-1, -2), h, out=y_t) if n_state > 1 else torch.mul(h, c_t, out=y_t)
    y_t = y_t.view(-1, batch, dim)[:length]
    if D is not None:  # time-major, where y_t and x are contiguous alike
        y_t.addcmul_(x.view(-1, batch, dim)[:length], D.float())
    y = torch.empty(batch, dim, length, dtype=torch.float32)
    y.view(-1, length).copy_(y_t.view(length, -1).t())
    if z is not None:
        y.mul_(F.silu(z.float()))
    return y.to(out_dtype or u.dtype), last


def load() -> Impl:
    """The CPU :class:`~ppma.ops.registry.Impl`: the in-place scan forward, no residuals, no
    backward of its own (the registry's torch backward recomputes the chunked form)."""
    return Impl(lambda *args: (selective_scan_cpu(*args), ()))
