"""CPU backend of ``ppma::polyline_attention``: the vanilla kind blocked over queries.

The polyline log mask is a sum of three 1-D log masks (:mod:`ppma.ops.polyline_mask.reference`),
each ``O(N^1.5)``: ``la[t, i, j, l]`` along row ``i`` (W axis), ``lb[t, i, k, l]`` along column
``l`` (H axis), ``lg[k, l, t, s]`` along the depth line at ``(k, l)`` (T axis, 3-D only). For
query ``(t, i, j)`` and key ``(s, k, l)`` the V2H log mask is ``la[t,i,j,l] + lb[t,i,k,l] +
lg[k,l,t,s]`` and the H2V one ``la[s,k,l,j] + lb[s,k,i,j] + lg[i,j,s,t]``. Each block of query
rows builds its ``(rows * W, N)`` part of both from the 1-D masks, attends (the two official-form
softmaxes share one logits block) and is freed: memory ``O(N * block)``, never ``N x N``.

The backward runs the blocks again (no residuals) with the softmax gradients written out, sums
the mask gradients back onto the 1-D masks, and takes those to the decays through the 1-D masks'
autograd (``O(N^1.5)``). The criss-cross kind stores ``O(N^1.5)`` weights: small grids build the
reference's whole-grid weights (official form in fp32: in scratch buffers, :mod:`ppma.ops._scratch`;
else the reference runs); large ones rebuild each axis' 1-D weights per chunk of lines
(``O(block)`` memory).
Its gradient is autograd through the reference (``O(N^1.5)`` memory, as the torch backend).
"""
from __future__ import annotations

import math

import torch

from .._scratch import scratch
from ..polyline_mask.reference import log_mask_1d
from ..registry import Impl
from .reference import polyline_attention_reference

# fp32 elements of one (B, heads, queries, keys) block (32 MB); about 8 such blocks are live
BLOCK_ELEMENTS = 1 << 23
# criss-cross weights (all axes, fp32: 128 MB) up to which the reference runs: building each
# axis' weights once for the whole grid is about 2x faster than rebuilding them per chunk
CRISS_CROSS_WHOLE = 1 << 25


def unavailable(device: torch.device) -> str | None:
    return None if torch.device(device).type == "cpu" else "the cpu backend runs on CPU tensors"


def _line_masks(log_alpha, log_beta, log_gamma):
    """The 1-D log masks ``(la, lb, lg)``: ``(B, h, T, H, W, W)``, ``(B, h, T, H, H, W)``,
    ``(B, h, H, W, T, T)`` (``lg`` None on a 2-D grid, which is taken as ``T = 1``)."""
    if log_gamma is None:
        log_alpha, log_beta = log_alpha[:, :, None], log_beta[:, :, None]
    la = log_mask_1d(log_alpha)
    lb = log_mask_1d(log_beta.transpose(-1, -2)).permute(0, 1, 2, 4, 5, 3)
    lg = None if log_gamma is None else log_mask_1d(log_gamma.permute(0, 1, 3, 4, 2))
    return la, lb, lg


def _block_masks(la, lb, lg, t, i0, i1):
    """V2H and H2V log masks of the queries in rows ``i0:i1`` of frame ``t``, each
    ``(B, h, rows, W, T, H, W)`` (query row, query column, key ``s, k, l``)."""
    v2h = la[:, :, t, i0:i1, :, None, None, :] + lb[:, :, t, i0:i1, None, None, :, :]
    h2v = la.permute(0, 1, 5, 2, 3, 4)[:, :, None] + lb[:, :, :, :, i0:i1].permute(0, 1, 4, 5, 2, 3)[..., None]
    if lg is not None:
        v2h = v2h + lg[:, :, :, :, t].permute(0, 1, 4, 2, 3)[:, :, None, None]
        h2v = h2v + lg[:, :, i0:i1, :, :, t][..., None, None]
    return v2h, h2v


def _add_block_grads(grads, d_v2h, d_h2v, t, i0, i1):
    """Add the gradients of one block's masks (shaped as :func:`_block_masks`) to ``grads``, the
    gradients of ``(la, lb, lg)``: the adjoint of the broadcasts there."""
    dla, dlb, dlg = grads
    dla[:, :, t, i0:i1] += d_v2h.sum((4, 5))
    dlb[:, :, t, i0:i1] += d_v2h.sum((3, 4))
    dla += d_h2v.sum(2).permute(0, 1, 3, 4, 5, 2)
    dlb[:, :, :, :, i0:i1] += d_h2v.sum(6).permute(0, 1, 4, 5, 2, 3)
    if dlg is not None:
        dlg[:, :, :, :, t] += d_v2h.sum((2, 3)).permute(0, 1, 3, 4, 2)
        dlg[:, :, i0:i1, :, :, t] += d_h2v.sum((5, 6))


def _blocks(q, block_elements):
    """``(t, i0, i1)`` per block of query rows (at least one row, else at most ``block_elements``
    weights a block); ``q`` is ``(B, h, T, H, W, d)``."""
    batch, heads, frames, height, width, _ = q.shape
    n = frames * height * width
    rows = max(1, min(height, block_elements // (batch * heads * width * n)))
    return [(t, i0, min(i0 + rows, height)) for t in range(frames) for i0 in range(0, height, rows)]


def _weights(logits, v2h, h2v, form):
    """Attention weights ``(..., queries, N)`` of one block and what their backward needs."""
    if form == "official":
        p1, p2 = (logits + v2h).softmax(-1), (logits + h2v).softmax(-1)
        return 0.5 * (p1 + p2), (p1, p2)
    p, mask = logits.softmax(-1), v2h.exp() + h2v.exp()
    return p * mask, (p, mask)


def _as_3d(q, k, v, log_gamma):
    """``(q, k, v)`` with a depth axis of 1 on a 2-D grid; ``k``, ``v`` flattened to ``(B, h, N, .)``."""
    if log_gamma is None:
        q, k, v = q[:, :, None], k[:, :, None], v[:, :, None]
    return q, k.flatten(2, -2), v.flatten(2, -2)


def _vanilla_forward(q, k, v, log_alpha, log_beta, log_gamma, form, block_elements=BLOCK_ELEMENTS):
    """Vanilla polyline attention, ``O(N * block)`` memory; shapes as the reference's."""
    shape = v.shape
    masks = _line_masks(log_alpha, log_beta, log_gamma)
    q, k, v = _as_3d(q, k, v, log_gamma)
    kt = k.transpose(-1, -2)
    out = v.new_empty(*q.shape[:-1], v.shape[-1])
    for t, i0, i1 in _blocks(q, block_elements):
        qb = q[:, :, t, i0:i1].flatten(2, 3)
        logits = qb @ kt
        logits = logits if logits.dtype == torch.float64 else logits.float()
        v2h, h2v = (m.flatten(2, 3).flatten(3) for m in _block_masks(*masks, t, i0, i1))
        attn, _ = _weights(logits, v2h, h2v, form)
        out[:, :, t, i0:i1] = (attn.to(v.dtype) @ v).unflatten(2, (i1 - i0, q.shape[4]))
    return out.reshape(shape)


def _vanilla_backward(grad, q, k, v, log_alpha, log_beta, log_gamma, form, block_elements=BLOCK_ELEMENTS):
    """Gradients of :func:`_vanilla_forward` for ``q, k, v`` and the decays given (not None)."""
    decays = [d for d in (log_alpha, log_beta, log_gamma) if d is not None]
    def line_masks(*decays):
        return tuple(m for m in _line_masks(*decays, *([None] * (3 - len(decays)))) if m is not None)

    masks, masks_vjp = torch.func.vjp(line_masks, *decays)
    mask_grads = [torch.zeros_like(m) for m in masks]
    masks, mask_grads = (*masks, None)[:3], (*mask_grads, None)[:3]
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    q, k, v = _as_3d(q, k, v, log_gamma)
    grad = grad.reshape(*q.shape[:-1], v.shape[-1])
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    kt = k.transpose(-1, -2)
    for t, i0, i1 in _blocks(q, block_elements):
        qb, gb = q[:, :, t, i0:i1].flatten(2, 3), grad[:, :, t, i0:i1].flatten(2, 3)
        logits = qb @ kt
        logits = logits if logits.dtype == torch.float64 else logits.float()
        block = _block_masks(*masks, t, i0, i1)
        v2h, h2v = (m.flatten(2, 3).flatten(3) for m in block)
        attn, saved = _weights(logits, v2h, h2v, form)
        dv += attn.to(v.dtype).transpose(-1, -2) @ gb
        d_attn = (gb @ v.transpose(-1, -2)).to(logits.dtype)
        if form == "official":
            d_v2h, d_h2v = (p * (0.5 * d_attn - (0.5 * d_attn * p).sum(-1, keepdim=True)) for p in saved)
            d_logits = d_v2h + d_h2v
        else:
            p, mask = saved
            dp = d_attn * mask
            d_logits = p * (dp - (dp * p).sum(-1, keepdim=True))
            d_mask = d_attn * p
            d_v2h, d_h2v = d_mask * v2h.exp(), d_mask * h2v.exp()
        d_logits = d_logits.to(q.dtype)
        dq[:, :, t, i0:i1] = (d_logits @ k).unflatten(2, (i1 - i0, q.shape[4]))
        dk += d_logits.transpose(-1, -2) @ qb
        _add_block_grads(mask_grads, *(d.reshape(m.shape) for d, m in zip((d_v2h, d_h2v), block)), t, i0, i1)
    d_decays = masks_vjp(tuple(g for g in mask_grads if g is not None))
    return [dq.reshape(q_shape), dk.reshape(k_shape), dv.reshape(v_shape), *d_decays]


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
        logits = q[lines] @ k[lines].transpose(-1, -2)
        logits = logits if logits.dtype == torch.float64 else logits.float()
        log_mask = log_mask_1d(log_decay[lines])
        attn = (logits + log_mask).softmax(-1) if form == "official" else logits.softmax(-1) * log_mask.exp()
        out[lines] = attn.to(y.dtype) @ y[lines]
    return out.reshape(shape).movedim(-2, axis)


def _axis_weights(q, k, log_decay, axis, slot):
    """The reference's official-form ``_axis_attention`` for fp32 ``q``, ``k``, with every
    temporary in scratch ``slot`` (valid until its next use): ``softmax(QK^T + S + S^T)``, ``S``
    the segment sums of :func:`~ppma.ops.polyline_mask.reference.log_mask_1d`; returns
    ``(B, h, *other axes, n, n)``."""
    qa, ka = q.movedim(axis, -2), k.movedim(axis, -2)
    n = qa.shape[-2]
    shape = (*qa.shape[:-1], n)
    logits = torch.matmul(qa, ka.transpose(-1, -2), out=scratch(f"{slot}.logits", shape))
    below = torch.ones(n, n, dtype=torch.bool).tril(-1)
    terms = torch.mul(log_decay.movedim(axis, -1).float()[..., :, None], below, out=scratch(f"{slot}.terms", shape))
    segsum = torch.cumsum(terms, -2, out=scratch(f"{slot}.segsum", shape))
    logits.add_(segsum).add_(segsum.transpose(-1, -2))
    return torch.ops.aten._softmax.out(logits, -1, False, out=scratch(f"{slot}.weights", shape))


def _criss_cross_forward(q, k, v, log_alpha, log_beta, log_gamma, form, block_elements=BLOCK_ELEMENTS,
                         whole=CRISS_CROSS_WHOLE):
    """Criss-cross polyline attention: when its weights (all axes) are at most ``whole``
    elements, the reference's whole-grid weights (official form in fp32: built in scratch
    buffers, :func:`_axis_weights`; else the reference itself), else (large grids) each axis'
    weights rebuilt per chunk of lines of at most ``block_elements`` for each of their two uses
    (``O(block)`` memory)."""
    grid = q.shape[2:-1]
    weights = q.shape[0] * q.shape[1] * math.prod(grid) * sum(grid)
    w_axis = q.dim() - 2
    axes = [(log_beta, w_axis - 1), (log_alpha, w_axis)]
    if log_gamma is not None:
        axes.insert(0, (log_gamma, w_axis - 2))
    if weights <= whole and form == "official" and q.dtype == k.dtype == v.dtype == torch.float32:
        attns = [(_axis_weights(q, k, log_decay, axis, f"polyline_attention.axis{axis}"), axis)
                 for log_decay, axis in axes]

        def apply(order):
            y = v
            for attn, axis in order:
                y = (attn @ y.movedim(axis, -2)).movedim(-2, axis)
            return y

        return 0.5 * apply(attns) + 0.5 * apply(attns[::-1])
    if weights <= whole:
        return polyline_attention_reference(q, k, v, log_alpha, log_beta, log_gamma, "criss_cross", form)

    def run(order):
        y = v
        for log_decay, axis in order:
            y = _axis_apply(q, k, y, log_decay, axis, form, block_elements)
        return y

    return 0.5 * run(axes) + 0.5 * run(axes[::-1])


def load() -> Impl:
    """The CPU :class:`~ppma.ops.registry.Impl`; it keeps no residuals (the backward recomputes).
    Under autocast the vanilla forward multiplies in autocast's dtype (as the reference) and its
    backward runs with autocast off, in the inputs' dtype."""
    from .op import _autocast

    def forward(q, k, v, log_alpha, log_beta, log_gamma, kind, form):
        if kind == "vanilla":
            return _vanilla_forward(*_autocast(q, k, v), log_alpha, log_beta, log_gamma, form), ()
        return _criss_cross_forward(*_autocast(q, k, v), log_alpha, log_beta, log_gamma, form), ()

    def backward(grads, residuals, q, k, v, log_alpha, log_beta, log_gamma, kind, form):
        if kind == "vanilla":
            with torch.autocast("cpu", enabled=False):
                return _vanilla_backward(grads[0].to(v.dtype), q, k, v, log_alpha, log_beta, log_gamma, form)
        tensors = [t for t in (q, k, v, log_alpha, log_beta, log_gamma) if t is not None]

        def reference(q, k, v, *decays):
            return polyline_attention_reference(q, k, v, *decays, *([None] * (3 - len(decays))), kind, form)

        _, vjp = torch.func.vjp(reference, *tensors)
        return list(vjp(grads[0]))

    def backward_fake(grads, residuals, q, k, v, log_alpha, log_beta, log_gamma, kind, form):
        return [torch.empty_like(t, memory_format=torch.contiguous_format)
                for t in (q, k, v, log_alpha, log_beta, log_gamma) if t is not None]

    return Impl(forward, backward, backward_fake)
