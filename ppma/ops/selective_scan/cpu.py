"""CPU kernel of ``selective_scan``: a time-major scan of one in-place op per step, chunked
when a step is too small to amortize PyTorch's per-op overhead.

All per-step tensors are laid out time-major, ``(n_chunks, T, batch, G, N, dim/G)`` contiguous
(channels innermost, where the broadcast products vectorize), so that step ``t`` of a chunk is
one contiguous slab of ``batch * dim * N`` elements and the recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t`` is one
``addcmul_`` per step, written in place over the inputs ``dt_t B_t u_t`` (no copy per step, no
stack). With one chunk (``T = L``) that is all; with several (chunks of ``T`` steps, the last
one padded with steps of decay 1 and input 0):

1. every chunk scans from a zero state, all chunks at once: ``T - 1`` steps;
2. the chunk-end states are carried across chunks: ``n_chunks - 1`` steps on a copy of them,
   ``e_c = P_c e_{c-1} + (local end of chunk c)``, ``P_c`` the chunk's decay product;
3. ``h_t += exp(cum_t) e_{c-1}``, ``cum_t`` the log-decays summed from the chunk start: one pass.

``chunk_length`` picks ``T``: one chunk when a step already holds :data:`STEP_ELEMENTS`
elements, else enough chunks to fill a step with that many. Every decay factor is ``exp`` of a
sum of ``dt A <= 0``, as in :mod:`.chunked`. fp32 throughout; memory: the ``(L, batch, dim,
N)`` states and decays, in per-thread scratch buffers kept between calls
(:mod:`ppma.ops._scratch`). The backward is the ``torch`` backend's (``torch.func.vjp`` through
:func:`~.chunked.selective_scan_chunked`): the in-place scan has no autograd formula.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .._custom_op import torch_backward
from .._scratch import scratch
from ..registry import Impl
from .chunked import selective_scan_chunked
from .reference import discretized_dt

# Elements per scan step below which the sequence is cut into chunks. Measured on 2 x86 threads:
# at VMamba-T's stage 1 (L = 3136) one chunk beat chunks filling 2^12 to 2^15 per step by 1.5-2x
# at batch 8 (3072 per step: the extra cumsum / exp / add passes cost more than ~3000 steps of
# ~3 us), and chunks of 56 to 1046 steps were within noise of one chunk at batch 1 (384 per step).
STEP_ELEMENTS = 1 << 10


def unavailable(device: torch.device) -> str | None:
    return None if torch.device(device).type == "cpu" else "the cpu backend runs on CPU tensors"


def chunk_length(length: int, step_elements: int) -> int:
    """Steps per chunk ``T`` for a sequence of ``length`` steps of ``step_elements`` each."""
    n_chunks = min(length, max(1, -(-STEP_ELEMENTS // step_elements)))
    return -(-length // n_chunks)


def _time_major(t: torch.Tensor, n_steps: int, slot: str) -> torch.Tensor:
    """``(batch, C, L)`` -> fp32 ``(n_steps, batch, C)`` contiguous in scratch ``slot``, zero after
    step ``L``: one pass (the transpose and the cast are the copy)."""
    out = scratch(f"selective_scan.{slot}", (n_steps, t.shape[0], t.shape[1]))
    out[: t.shape[2]].copy_(t.permute(2, 0, 1))
    out[t.shape[2]:].zero_()
    return out


def selective_scan_cpu(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, out_dtype=None,
                       chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`~ppma.ops.selective_scan.reference.selective_scan_reference`.

    ``chunk``: steps per chunk (default :func:`chunk_length`). Returns ``(y, last_state)``.
    """
    batch, dim, length = u.shape
    groups, n_state = (B.shape[1] if B.dim() == 4 else 1), A.shape[1]
    chunk = min(chunk or chunk_length(length, batch * dim * n_state), length)
    n_chunks = -(-length // chunk)
    lead = (n_chunks, chunk, batch, groups)  # time index = chunk index * T + step
    states = (*lead, n_state, dim // groups)  # channels innermost, where the products vectorize

    dt = _time_major(delta, n_chunks * chunk, "dt")  # (chunks * T, batch, dim), zero in the padding
    if delta_bias is not None:
        dt[:length] += delta_bias.float()
    if delta_softplus:
        torch.ops.aten.softplus.out(dt[:length], 1, 20, out=dt[:length])
    dt = dt.view(*lead, 1, -1)
    b_t, c_t = (_time_major(t.flatten(1, -2), n_chunks * chunk, name).view(*lead, n_state, 1)
                for t, name in ((B, "B"), (C, "C")))
    x = _time_major(u, n_chunks * chunk, "x").view(*lead, 1, -1)
    # the inputs, scanned in place into the states
    h = torch.mul(x.mul_(dt), b_t, out=scratch("selective_scan.h", states))
    a = A.float().view(groups, dim // groups, n_state).transpose(1, 2)
    log_decay = torch.mul(dt, a, out=scratch("selective_scan.log_decay", states))
    decay = torch.exp(log_decay, out=scratch("selective_scan.decay", states)) if n_chunks > 1 else log_decay.exp_()
    for t in range(1, chunk):  # 1. scan inside every chunk
        h[:, t].addcmul_(decay[:, t], h[:, t - 1])
    if n_chunks > 1:
        cum = log_decay.cumsum_(1).exp_()  # decay products from each chunk start
        ends = h[:, -1].clone()
        for c in range(1, n_chunks):  # 2. carry across chunks
            ends[c].addcmul_(cum[c, -1], ends[c - 1])
        h[1:].addcmul_(cum[1:], ends[:-1, None])  # 3. add each chunk's start state

    last = h.view(n_chunks * chunk, batch, groups, n_state, -1)[length - 1]
    last = last.transpose(-1, -2).reshape(batch, dim, n_state)  # a copy: h is scratch
    y_t = scratch("selective_scan.y", (*lead, 1, dim // groups))
    torch.matmul(c_t.transpose(-1, -2), h, out=y_t) if n_state > 1 else torch.mul(h, c_t, out=y_t)
    y_t = y_t.view(-1, batch, dim)[:length].permute(1, 2, 0)
    y = torch.empty(batch, dim, length, dtype=torch.float32)
    if D is not None:
        torch.addcmul(y_t, u.float(), D.float()[:, None], out=y)
    else:
        y.copy_(y_t)
    if z is not None:
        y.mul_(F.silu(z.float()))
    return y.to(out_dtype or u.dtype), last


def load() -> Impl:
    """The CPU :class:`~ppma.ops.registry.Impl`: the in-place scan forward, no residuals; the
    backward recomputes the forward differentiably (the ``torch`` backend's gradient)."""
    from .op import OP

    backward = functools.partial(torch_backward, OP.name, OP.arguments, selective_scan_chunked)

    def forward(*args):
        return selective_scan_cpu(*args), ()

    def backward_fake(grads, residuals, u, delta, A, B, C, D, z, delta_bias, delta_softplus, out_dtype):
        return [torch.empty_like(t, memory_format=torch.contiguous_format)
                for t in (u, delta, A, B, C, D, z, delta_bias) if t is not None]

    return Impl(forward, backward, backward_fake)
