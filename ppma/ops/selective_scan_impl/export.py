"""Selective scan for ``torch.export`` and ONNX: plain ATen ops around one ``scan`` over chunks.

The recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t``, ``y_t = C_t . h_t`` runs as one
:func:`torch._higher_order_ops.scan.scan` (``torch.export`` keeps it as one ``scan`` node; the
ONNX exporter writes it as one ONNX ``Scan``) over chunks of :data:`CHUNK` time steps. Its body
forms the chunk's decays ``exp(dt A) <= 1`` (``A <= 0``) and inputs ``dt B u``, runs the
recurrence unrolled over the chunk's steps (one multiply-add each, on the slices of one split)
and contracts the chunk's states with ``C``: the exact sequential arithmetic of the reference,
``L / CHUNK`` loop iterations instead of ``L``, and no ``(L, batch, dim, N)`` tensor outside the
loop. The graph does not grow with ``L``, and ``L`` stays symbolic.

Layout: time-major, channels innermost (``(T, batch, G, N, dim / G)`` states), as the ``cpu``
kernel: :func:`scan_time_major` is the loop on inputs already in it (``cross_selective_scan``'s
export form lays its routes out so), :func:`selective_scan_export` transposes the ``(batch, dim,
L)`` inputs and B/C into it before the loop. (Measured in
ONNX Runtime 1.32 on the CPU, one thread: at VMamba-T's and Vim-T's shapes this form takes
0.5-1.1x the ``cpu`` kernel's time; transposing inside the body, or broadcasting the states
before the loop, was 1.2-2x slower.) The time axis is padded to whole chunks with steps of
``dt = 0`` (decay 1) and ``u = 0`` (input 0), which leave the state unchanged, by ``CHUNK + 1``
to ``2 CHUNK`` steps: a pad of 0 or a single chunk would be specialized on by ``torch.export``
(sizes 0 and 1 are), fixing the graph to the example's length. fp32.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch._higher_order_ops.scan import scan

from .reference import discretized_dt

CHUNK = 16


def _chunk(a: torch.Tensor, h: torch.Tensor, chunk: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Scan one chunk of ``T`` steps from the state ``h`` ``(1, batch, G, N, dim / G)``: ``a = A``
    ``(G, N, dim / G)``; ``dt``, ``u`` ``(T, batch, G, 1, dim / G)``; B, C ``(T, batch, G, N, 1)``.
    Returns the state after the chunk (carried) and ``y`` ``(T, batch, G, 1, dim / G)``."""
    dt, u, b, c = chunk
    decays, inputs = (dt * a).exp(), dt * u * b
    states = []
    for decay, x in zip(decays.split(1), inputs.split(1)):  # steps keep their axis: no squeeze nodes
        h = x + decay * h  # not addcmul: its ONNX form multiplies by its scale too
        states.append(h)
    y = torch.cat(states) * c
    return h, y.sum(-2, keepdim=True) if y.shape[-2] > 1 else y  # a sum over one state is slow in ONNX Runtime


def scan_time_major(dt: torch.Tensor, u: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                    a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The scan on time-major fp32 inputs: ``dt``, ``u`` ``(L, batch, G, 1, dim / G)``; ``b``,
    ``c`` ``(L, batch, G, N, 1)``; ``a = A`` ``(G, N, dim / G)``. Returns ``y = C . h``
    ``(L, batch, G, dim / G)`` and the last state ``(batch, G, N, dim / G)``."""
    length = dt.shape[0]
    pad = 2 * CHUNK - length % CHUNK
    chunks = (length + pad) // CHUNK

    def chunked(t):  # (L, ...) -> (chunks, T, ...), zero in the padding
        return F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)).unflatten(0, (chunks, CHUNK))

    state = dt.new_zeros(1, *dt.shape[1:3], b.shape[3], dt.shape[4])
    last, y = scan(functools.partial(_chunk, a), state, [chunked(t) for t in (dt, u, b, c)])
    return y.flatten(0, 1).narrow(0, 0, length).squeeze(3), last[0]


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
    """Same contract as :func:`~ppma.ops.selective_scan_impl.reference.selective_scan_reference`:
    ``(y, last_state)``, ``y`` ``(batch, dim, L)``, ``last_state`` ``(batch, dim, N)`` fp32."""
    batch, dim, length = u.shape
    n_state = A.shape[1]
    groups = B.shape[1] if B.dim() == 4 else 1

    def time_major(t, *shape):  # (batch, ..., L) -> fp32 (L, batch, *shape)
        return t.float().view(batch, *shape, length).movedim(-1, 0)

    x = u.float()
    per_channel, per_group = (groups, 1, dim // groups), (groups, n_state, 1)
    a = A.float().view(groups, -1, n_state).transpose(1, 2)  # (G, N, dim / G)
    y, last = scan_time_major(time_major(discretized_dt(delta, delta_bias, delta_softplus), *per_channel),
                              time_major(x, *per_channel), time_major(B, *per_group), time_major(C, *per_group), a)
    y = y.flatten(2).permute(1, 2, 0)  # (batch, dim, L)
    if D is not None:
        y = y + D.float()[:, None] * x
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(out_dtype or u.dtype), last.transpose(2, 3).reshape(batch, dim, n_state)
