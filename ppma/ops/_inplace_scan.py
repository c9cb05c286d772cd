"""The in-place time-major scan that the CPU kernels of ``selective_scan`` and
``cross_selective_scan`` share: :func:`scan_` (with :func:`steps` and :func:`chunk_length`) and
:func:`softplus_`.

:func:`scan_` runs ``h_t = decay_t h_{t-1} + x_t`` over time-major buffers ``(dirs, n_chunks, T,
*step)`` (channels innermost, where the products vectorize): step ``t`` of every chunk is one
slab, and one ``addcmul_`` per step scans it in place over the inputs (no copy per step, no
stack). A second direction (``dirs = 2``) runs backwards in the same ops: its step ``t`` is stored
at ``T - 1 - t`` of the same chunk, and one strided view (:func:`steps`) holds both directions'
step, so nothing is flipped. With one chunk (``T = L``) that is all; with several (the sequence
cut into chunks of ``T`` steps, the last one padded with steps of decay 1 and input 0, which leave
a state unchanged, and a zero state zero, whichever way it runs):

1. every chunk scans from a zero state, all chunks at once: ``T - 1`` steps, whose ``addcmul_``
   also carries each chunk's decay products ``P_t`` from its start (stacked under the states);
2. the chunk-end states are carried across chunks: ``n_chunks - 1`` steps on a copy of them,
   ``e_c = P_c e_{c-1} + (local end of chunk c)``, ``P_c`` the chunk's whole decay product;
3. ``h_t += P_t e_{c-1}``: one pass.

:func:`chunk_length` picks ``T``: one chunk when a step already holds :data:`STEP_ELEMENTS`
elements, else chunks of ``ceil(sqrt(L))`` steps.
"""
from __future__ import annotations

import math

import torch

from ._scratch import scratch

# Elements per scan step below which the sequence is cut into chunks of ~sqrt(L) steps. Measured
# (CPU time, 1 thread) on cross_selective_scan at VMamba-T's four stages, batch 1, 2 and 8: steps
# of 384-1536 elements ran 1.3-2.3x faster in chunks of 16-128 steps than in one chunk (flat
# across that range), 3072 within +-6% either way, 6144 and more faster in one chunk.
STEP_ELEMENTS = 1 << 11


def chunk_length(length: int, step_elements: int) -> int:
    """Steps per chunk ``T`` for a sequence of ``length`` steps of ``step_elements`` each: all of
    them from :data:`STEP_ELEMENTS` on, else ``ceil(sqrt(length))``."""
    return length if step_elements >= STEP_ELEMENTS else math.isqrt(max(length - 1, 0)) + 1


def softplus_(x: torch.Tensor) -> torch.Tensor:
    """``x <- softplus(x)`` in place, ``x`` fp32; within a few ulp of ``F.softplus``.

    ``max(x, log1p(e))`` with ``e = exp(min(x, 20))`` (``log1p(e) >= x`` up to 20, and
    ``softplus(x) = x`` in fp32 beyond), ``log1p(e) = log(w) + (e - (w - 1)) / w`` for ``w =
    fl(1 + e)`` (the rounding of ``w`` corrected to first order; ``w - 1`` is exact). ATen's
    softplus runs a scalar loop on the CPU; these eight vectorized passes take under half its time. They run on the whole tensor: in blocks that stay in the cache they
    took 30% less time alone, but every pass is a parallel region, and with more threads than free
    cores (a shared machine) each region may wait a time slice for a thread: VMamba-T then took
    2x as long.
    """
    e, w, r = (scratch(f"softplus.{name}", x.shape) for name in "ewr")
    torch.clamp(x, max=20, out=e).exp_()
    torch.add(e, 1, out=w)
    torch.sub(e, torch.sub(w, 1, out=r), out=r)
    return torch.maximum(x, torch.log(w, out=e).addcdiv_(r, w), out=x)


def steps(t: torch.Tensor, axis: int, dirs_axis: int = 0, indices=None) -> list[torch.Tensor]:
    """Steps ``indices`` (default: all) of a scan along ``axis`` of ``t``, whose ``dirs_axis``
    (before ``axis``) holds one direction or two: ``t.select(axis, i)``, or one strided view
    holding direction 0 at ``i`` and direction 1 at ``size - 1 - i`` (it runs backwards)."""
    length = t.shape[axis]
    indices = range(length) if indices is None else indices
    if t.shape[dirs_axis] == 1:
        return [t.select(axis, i) for i in indices]
    size, stride = list(t.shape), list(t.stride())
    del size[axis]
    step_stride, dirs_stride = stride.pop(axis), stride[dirs_axis]
    views = []
    for i in indices:
        stride[dirs_axis] = dirs_stride + (length - 1 - 2 * i) * step_stride
        views.append(t.as_strided(size, stride, t.storage_offset() + i * step_stride))
    return views


def scan_(states: torch.Tensor, decay: torch.Tensor) -> None:
    """The scan in place (module docstring): ``decay`` ``(dirs, n_chunks, T, *step)``;
    ``states`` ``(1 + (n_chunks > 1), dirs, n_chunks, T, *step)``: ``states[0]`` holds the
    inputs and becomes the states, ``states[1]`` (several chunks) is scratch for the decay
    products. Any strides with the directions outermost in memory (:func:`steps`); direction 1
    runs backwards, chunks and steps alike."""
    dirs, n_chunks = decay.shape[:2]
    h, products = states[0], states[-1]
    if n_chunks > 1:  # P before the first step is 1: P = decay there, and its "input" is 0 after
        products.zero_()
        steps(products, 2, indices=[0])[0].copy_(steps(decay, 2, indices=[0])[0])
    # the states and the products decay alike
    state_steps, decay_steps = steps(states, 3, 1), steps(decay.expand(states.shape), 3, 1)
    for h_t, decay_t, h_before in zip(state_steps[1:], decay_steps[1:], state_steps):  # 1. inside every chunk
        h_t.addcmul_(decay_t, h_before)
    if n_chunks == 1:
        return
    # chunk ends and decay products of whole chunks, (dirs, n_chunks, *step)
    last = [h.shape[2] - 1]
    ends, totals = (steps(t, 2, indices=last)[0].clone(memory_format=torch.contiguous_format) for t in (h, products))
    end_steps, total_steps = steps(ends, 1), steps(totals, 1)
    for c in range(1, n_chunks):  # 2. carry across chunks
        end_steps[c].addcmul_(total_steps[c], end_steps[c - 1])
    h[0, 1:].addcmul_(products[0, 1:], ends[0, :-1, None])  # 3. add each chunk's start state
    if dirs == 2:
        h[1, :-1].addcmul_(products[1, :-1], ends[1, 1:, None])
