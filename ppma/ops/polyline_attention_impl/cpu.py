"""CPU backend of ``ppma::polyline_attention``: both kinds in cache-sized blocks.

The polyline log mask is a sum of three 1-D log masks (:mod:`ppma.ops.polyline_mask_impl.reference`),
each ``O(N^1.5)`` and symmetric in its two line indices: ``la[t, i, j, l]`` along row ``i`` (W
axis), ``lb[t, i, k, l]`` along column ``l`` (H axis), ``lg[k, l, t, s]`` along the depth line at
``(k, l)`` (T axis, 3-D only). For query ``(t, i, j)`` and key ``(s, k, l)`` the V2H log mask is
``la[t,i,j,l] + lb[t,i,k,l] + lg[k,l,t,s]`` and the H2V one ``la[s,k,j,l] + lb[s,k,i,j] +
lg[i,j,s,t]``.

Vanilla kind, in blocks of ``(batch, head)`` pairs and query rows of at most ``BLOCK_ELEMENTS``
weights per intra-op thread (4 MB in fp32, so that a block's passes stay in cache): a block's logits are written into
a scratch buffer (:mod:`ppma.ops._scratch`), the 1-D masks are added to them as broadcasts, in
place and into a second buffer (official form: ``logits + H2V``, ``logits + V2H``), both are
softmaxed in place and their sum multiplies ``v`` once: memory ``O(N * block)``, never ``N x N``.
The backward runs the blocks again (no residuals) with the softmax gradients written out, takes
the mask gradients to the 1-D masks (the broadcasts' VJP) and those to the decays through the
1-D masks' autograd (``O(N^1.5)``).

Criss-cross kind, in chunks of ``(batch, head)`` pairs of at most ``CRISS_CROSS_CHUNK`` weights
(all axes) per intra-op thread: a chunk builds each axis' 1-D weights in scratch and applies them in both path
orders. Pairs with more than ``CRISS_CROSS_WHOLE`` weights (large grids) rebuild each axis'
weights per chunk of lines for each of their two uses (``O(block)`` memory). Its gradient is
autograd through the reference (``O(N^1.5)`` memory, as the torch backend).
"""
from __future__ import annotations

import math

import torch

from .._autocast import autocast_inputs, autocast_off
from .._scratch import scratch
from ..polyline_mask_impl.reference import log_mask_1d
from ..registry import Impl
from .reference import polyline_attention_reference

# vanilla: weights of one block per intra-op thread (4 MB in fp32); two such scratch buffers
# (paper form: three)
BLOCK_ELEMENTS = 1 << 20
# criss-cross: weights (all axes) of one chunk of (batch, head) pairs per intra-op thread (at
# least one pair)
CRISS_CROSS_CHUNK = 1 << 19
# criss-cross: weights (all axes) of one (batch, head) pair beyond which lines are chunked instead
CRISS_CROSS_WHOLE = 1 << 23


def _per_thread(elements):
    """``elements`` times the intra-op threads, which share each op of a block: every thread's part
    stays cache-sized, and more threads get fewer, larger ops."""
    return elements * torch.get_num_threads()


def _softmax_(x):
    """Softmax over the last dim of a contiguous ``x``, in place."""
    return torch.ops.aten._softmax.out(x, -1, False, out=x)


def _logits(q, k, out):
    """``q @ k^T`` of ``(..., a, d)`` and ``(..., b, d)`` into ``out`` ``(..., a, b)``: multiplied in
    ``q``'s dtype, as the reference multiplies, and rounded into ``out``'s (fp32 or fp64)."""
    if q.dtype == out.dtype:
        return torch.matmul(q, k.transpose(-1, -2), out=out)
    return out.copy_(q @ k.transpose(-1, -2))


def _line_masks(log_alpha, log_beta, log_gamma):
    """The 1-D log masks ``(la, lb, la_t, lg)`` of the ``P = B * heads`` pairs, contiguous:
    ``la[t, i, j, l]`` ``(P, T, H, W, W)``, ``lb[t, i, k, l]`` ``(P, T, H, H, W)``, ``la`` again
    as ``la_t[j, t, i, l]`` ``(P, W, T, H, W)`` (the H2V mask's layout, so that its term adds as
    one run of ``N``) and ``lg[k, l, t, s]`` ``(P, H, W, T, T)`` (None on a 2-D grid, which is
    taken as ``T = 1``)."""
    if log_gamma is None:
        log_alpha, log_beta = log_alpha[:, :, None], log_beta[:, :, None]
    la = log_mask_1d(log_alpha).flatten(0, 1)
    lb = log_mask_1d(log_beta.transpose(-1, -2)).permute(0, 1, 2, 4, 5, 3).flatten(0, 1).contiguous()
    lg = None if log_gamma is None else log_mask_1d(log_gamma.permute(0, 1, 3, 4, 2)).flatten(0, 1)
    return la, lb, la.permute(0, 3, 1, 2, 4).contiguous(), lg


def _mask_terms(masks, pairs, t, i0, i1):
    """The V2H and H2V log masks of block ``(pairs, t, i0, i1)`` (:func:`_blocks`) as two lists
    of views of ``masks`` that broadcast to ``(pairs, rows, W, T, H, W)`` (query row and column,
    key ``s, k, l``) and sum to the masks there."""
    la, lb, la_t, lg = (None if m is None else m[pairs] for m in masks)
    v2h = [la[:, t, i0:i1, :, None, None, :], lb[:, t, i0:i1, None, None]]
    h2v = [la_t[:, None], lb[:, :, :, i0:i1].permute(0, 3, 4, 1, 2)[..., None]]
    if lg is not None:
        v2h.append(lg[:, :, :, t].permute(0, 3, 1, 2)[:, None, None])
        h2v.append(lg[:, i0:i1, :, :, t, None, None])
    return v2h, h2v


def _add_terms(out, terms, base=None):
    """``out = base + sum(terms)`` (no ``base``: 0), the terms broadcast to ``out``; ``out`` may be
    ``base``."""
    if base is None:
        out.copy_(terms[0])
    else:
        torch.add(base, terms[0], out=out)
    for term in terms[1:]:
        out.add_(term)
    return out


def _blocks(pairs, frames, height, width, block_elements):
    """``(pairs, t, i0, i1)`` per block: a slice of the ``P`` pairs and the query rows ``i0:i1`` of
    frame ``t``, at most ``block_elements`` weights (at least one pair and one row): whole frames
    of as many pairs as fit, else rows of one pair (longer products than rows of many pairs)."""
    row = width * frames * height * width
    rows = max(1, min(height, block_elements // row))
    step = max(1, block_elements // (rows * row)) if rows == height else 1
    return [(slice(p, p + step), t, i0, min(i0 + rows, height))
            for p in range(0, pairs, step) for t in range(frames) for i0 in range(0, height, rows)]


def _block_grid(masks, block):
    """The shape ``(pairs, rows, W, T, H, W)`` of block ``block``'s weights (query row and column,
    key ``s, k, l``)."""
    count, frames, height, width = masks[0].shape[:4]
    pairs, _, i0, i1 = block
    return (len(range(count)[pairs]), i1 - i0, width, frames, height, width)


def _block_weights(q, k, masks, block, form):
    """The factors of one block's attention weights, each fp32 (fp64 for fp64 inputs) ``(pairs,
    rows * W, N)`` in scratch (overwritten by the next block): official form ``(p_v2h, p_h2v)``,
    the two softmaxes (weights ``0.5 (p_v2h + p_h2v)``); paper form ``(p, e_v2h, e_h2v)``,
    ``softmax(QK^T)`` and the exponentiated masks (weights ``p (e_v2h + e_h2v)``).
    ``q``: the block's queries ``(pairs, rows, W, d)``; ``k`` ``(pairs, N, d)``."""
    pairs, rows, width, d = q.shape
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    shape = (pairs, rows * width, k.shape[1])
    grid = _block_grid(masks, block)
    logits = _logits(q.reshape(pairs, rows * width, d), k, scratch("polyline_attention.logits", shape, dtype))
    buffers = [scratch(f"polyline_attention.mask{i}", shape, dtype) for i in range(2)]
    v2h, h2v = _mask_terms(masks, *block)
    if form == "official":
        _add_terms(buffers[0].view(grid), v2h, base=logits.view(grid))
        _add_terms(logits.view(grid), h2v, base=logits.view(grid))
        return _softmax_(buffers[0]), _softmax_(logits)
    for buffer, terms in zip(buffers, (v2h, h2v)):
        _add_terms(buffer.view(grid), terms).exp_()
    return _softmax_(logits), *buffers


def _add_mask_grads(grads, masks, block, d_v2h, d_h2v):
    """Add the gradients of block ``block``'s V2H and H2V log masks, ``d_v2h`` and ``d_h2v``
    ``(pairs, rows * W, N)``, to ``grads``, those of the 1-D masks given (the broadcasts' VJP)."""
    given = [m for m in masks if m is not None]

    def terms(*masks):
        v2h, h2v = _mask_terms((*masks, None)[:4], *block)
        return (*v2h, *h2v)

    outputs, vjp = torch.func.vjp(terms, *given)
    n, grid = len(outputs) // 2, _block_grid(masks, block)
    cotangents = [d_v2h.view(grid).sum_to_size(term.shape) for term in outputs[:n]]
    cotangents += [d_h2v.view(grid).sum_to_size(term.shape) for term in outputs[n:]]
    for total, g in zip(grads, vjp(tuple(cotangents))):
        total += g


def _pairs_first(q, k, v, log_gamma):
    """``q`` ``(P, T, H, W, d)``, ``k``, ``v`` ``(P, N, .)``, contiguous (2-D grids: ``T = 1``)."""
    grid = q.shape[2:-1] if log_gamma is not None else (1, *q.shape[2:-1])
    n = math.prod(grid)
    return q.reshape(-1, *grid, q.shape[-1]), k.reshape(-1, n, k.shape[-1]), v.reshape(-1, n, v.shape[-1])


def _vanilla_forward(q, k, v, log_alpha, log_beta, log_gamma, form, block_elements=None):
    """Vanilla polyline attention, ``O(N * block)`` memory; shapes as the reference's.
    ``block_elements``: default :data:`BLOCK_ELEMENTS` per thread."""
    block_elements = block_elements or _per_thread(BLOCK_ELEMENTS)
    shape = v.shape
    masks = _line_masks(log_alpha, log_beta, log_gamma)
    q, k, v = _pairs_first(q, k, v, log_gamma)
    out = v.new_empty(*q.shape[:-1], v.shape[-1])
    for block in _blocks(*q.shape[:4], block_elements):
        pairs, t, i0, i1 = block
        w = _block_weights(q[pairs, t, i0:i1], k[pairs], masks, block, form)
        # official: the sum of the two softmaxes, halved after the product (exactly: a power of 2)
        attn = w[0].add_(w[1]) if form == "official" else w[1].add_(w[2]).mul_(w[0])
        result = (attn.to(v.dtype) @ v[pairs]).view(out[pairs, t, i0:i1].shape)
        out[pairs, t, i0:i1] = result.mul_(0.5) if form == "official" else result
    return out.reshape(shape)


def _vanilla_backward(grad, q, k, v, log_alpha, log_beta, log_gamma, form, block_elements=None):
    """Gradients of :func:`_vanilla_forward` for ``q, k, v`` and the decays given (not None)."""
    block_elements = block_elements or _per_thread(BLOCK_ELEMENTS)
    decays = [d for d in (log_alpha, log_beta, log_gamma) if d is not None]

    def line_masks(*decays):  # those not None
        return tuple(m for m in _line_masks(*decays, *([None] * (3 - len(decays)))) if m is not None)

    masks, masks_vjp = torch.func.vjp(line_masks, *decays)
    mask_grads = [torch.zeros_like(m) for m in masks]
    masks = (*masks, None)[:4]
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    q, k, v = _pairs_first(q, k, v, log_gamma)
    grad = grad.reshape(*q.shape[:-1], v.shape[-1])
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for block in _blocks(*q.shape[:4], block_elements):
        pairs, t, i0, i1 = block
        w = _block_weights(q[pairs, t, i0:i1], k[pairs], masks, block, form)
        qb, gb = q[pairs, t, i0:i1].flatten(1, 2), grad[pairs, t, i0:i1].flatten(1, 2)
        if form == "official":
            attn = 0.5 * (w[0] + w[1])
        else:
            p, mask = w[0], w[1] + w[2]
            attn = p * mask
        dv[pairs] += attn.to(v.dtype).transpose(-1, -2) @ gb
        d_attn = (gb @ v[pairs].transpose(-1, -2)).to(attn.dtype)
        if form == "official":
            d_v2h, d_h2v = (p * (0.5 * d_attn - (0.5 * d_attn * p).sum(-1, keepdim=True)) for p in w)
            d_logits = d_v2h + d_h2v
        else:
            dp = d_attn * mask
            d_logits = p * (dp - (dp * p).sum(-1, keepdim=True))
            d_mask = d_attn * p
            d_v2h, d_h2v = d_mask * w[1], d_mask * w[2]
        d_logits = d_logits.to(q.dtype)
        dq[pairs, t, i0:i1] = (d_logits @ k[pairs]).view(dq[pairs, t, i0:i1].shape)
        dk[pairs] += d_logits.transpose(-1, -2) @ qb
        _add_mask_grads(mask_grads, masks, block, d_v2h, d_h2v)
    d_decays = masks_vjp(tuple(mask_grads))
    return [dq.reshape(q_shape), dk.reshape(k_shape), dv.reshape(v_shape), *d_decays]


def _line_distances(log_decay, out):
    """``-log_mask_1d(log_decay)``, ``|G_j - G_l|`` with ``G = cumsum(log_decay)``, ``(..., n)`` ->
    ``(..., n, n)`` into ``out`` (fp32 or fp64) in two passes (:func:`log_mask_1d` takes five).
    ``G`` is summed in fp64, so an fp32 difference is the segment sum rounded once, as
    ``log_mask_1d``'s (whose cumulative sum accumulates in fp64 on the CPU). Log-decays below
    ``-1e4`` (factors under ``e^-1e4``: zero in every float format) count as ``-1e4``, which keeps
    ``G`` finite and its differences exact."""
    g = log_decay.double().clamp(min=-1e4).cumsum(-1)
    return torch.sub(g[..., :, None], g[..., None, :], out=out).abs_()


def _axis_weights(q, k, log_decay, axis, form, dtype):
    """The reference's ``_axis_attention`` (the 1-D weights along grid ``axis`` of ``(P, *grid,
    d)`` tensors, ``(P, *other axes, n, n)``) in scratch (overwritten by the next call for this
    axis), in ``dtype``."""
    qa, ka = q.movedim(axis, -2), k.movedim(axis, -2)
    shape = (*qa.shape[:-1], qa.shape[-2])
    fp = torch.float64 if q.dtype == torch.float64 else torch.float32
    logits = _logits(qa, ka, scratch(f"polyline_attention.axis{axis}", shape, fp))
    distances = _line_distances(log_decay.movedim(axis, -1), scratch("polyline_attention.distances", shape, fp))
    if form == "official":
        weights = _softmax_(logits.sub_(distances))
    else:
        weights = _softmax_(logits).mul_(distances.neg_().exp_())
    return weights.to(dtype)


def _apply(attns, y):
    """The 1-D weights ``attns`` (``(weights, axis)``, applied first to last) applied to ``y``."""
    for attn, axis in attns:
        y = (attn @ y.movedim(axis, -2)).movedim(-2, axis)
    return y


def _axis_apply(q, k, y, log_decay, axis, form, block_elements):
    """``A_axis y``: the 1-D masked attention along grid ``axis`` of ``(B, h, *grid, C)`` tensors
    (as the reference's ``_axis_attention``) applied to ``y``, built for a chunk of lines at a
    time, at most ``block_elements`` weights a chunk (one line at least)."""
    q, k, y = (t.movedim(axis, -2) for t in (q, k, y))
    shape, n = y.shape, y.shape[-2]
    q, k, y = q.flatten(0, -3), k.flatten(0, -3), y.flatten(0, -3)  # (lines, n, C)
    log_decay = log_decay.movedim(axis, -1).flatten(0, -2)  # (lines, n)
    out = torch.empty_like(y)
    step = max(1, block_elements // (n * n))
    for start in range(0, y.shape[0], step):
        lines = slice(start, start + step)
        out[lines] = _axis_weights(q[lines], k[lines], log_decay[lines], 1, form, y.dtype) @ y[lines]
    return out.reshape(shape).movedim(-2, axis)


def _criss_cross_forward(q, k, v, log_alpha, log_beta, log_gamma, form, chunk_elements=None,
                         whole=CRISS_CROSS_WHOLE, block_elements=None):
    """Criss-cross polyline attention: chunks of ``(batch, head)`` pairs with at most
    ``chunk_elements`` weights (all axes, one pair at least; default :data:`CRISS_CROSS_CHUNK`
    per thread), each axis' weights built whole for a chunk, when a pair has at most ``whole``
    weights; else (large grids) each axis' weights rebuilt per chunk of lines of at most
    ``block_elements`` (default :data:`BLOCK_ELEMENTS` per thread) for each of their two uses."""
    chunk_elements = chunk_elements or _per_thread(CRISS_CROSS_CHUNK)
    block_elements = block_elements or _per_thread(BLOCK_ELEMENTS)
    grid = q.shape[2:-1]
    w_axis = q.dim() - 2
    axes = [(log_beta, w_axis - 1), (log_alpha, w_axis)]
    if log_gamma is not None:
        axes.insert(0, (log_gamma, w_axis - 2))
    weights = math.prod(grid) * sum(grid)  # of one pair
    if weights > whole:
        def run(order):
            y = v
            for log_decay, axis in order:
                y = _axis_apply(q, k, y, log_decay, axis, form, block_elements)
            return y

        return 0.5 * run(axes) + 0.5 * run(axes[::-1])
    shape = v.shape
    q, k, v = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))  # (P, *grid, C)
    axes = [(d.flatten(0, 1), axis - 1) for d, axis in axes]
    out = torch.empty_like(v, memory_format=torch.contiguous_format)
    step = max(1, chunk_elements // weights)
    for start in range(0, v.shape[0], step):
        pairs = slice(start, start + step)
        attns = [(_axis_weights(q[pairs], k[pairs], d[pairs], axis, form, v.dtype), axis) for d, axis in axes]
        # 0.5 a + 0.5 b == 0.5 (a + b) exactly (a power of 2)
        torch.add(_apply(attns, v[pairs]), _apply(attns[::-1], v[pairs]), out=out[pairs]).mul_(0.5)
    return out.reshape(shape)


def load() -> Impl:
    """The CPU :class:`~ppma.ops.registry.Impl`; it keeps no residuals (the backward recomputes).
    Under autocast the forward multiplies in autocast's dtype (as the reference) and the vanilla
    backward runs with autocast off, in the inputs' dtype."""

    def forward(q, k, v, log_alpha, log_beta, log_gamma, kind, form):
        attend = _vanilla_forward if kind == "vanilla" else _criss_cross_forward
        return attend(*autocast_inputs(q, k, v), log_alpha, log_beta, log_gamma, form), ()

    def backward(grads, residuals, q, k, v, log_alpha, log_beta, log_gamma, kind, form):
        if kind == "vanilla":
            with autocast_off("cpu"):
                return _vanilla_backward(grads[0].to(v.dtype), q, k, v, log_alpha, log_beta, log_gamma, form)
        tensors = [t for t in (q, k, v, log_alpha, log_beta, log_gamma) if t is not None]

        def reference(q, k, v, *decays):
            return polyline_attention_reference(q, k, v, *decays, *([None] * (3 - len(decays))), kind, form)

        _, vjp = torch.func.vjp(reference, *tensors)
        return list(vjp(grads[0]))

    return Impl(forward, backward)
