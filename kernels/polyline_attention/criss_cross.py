"""The criss-cross polyline attention from the line-attention kernels.

Per grid axis ``a`` (T, H, W; its log-decay ``log_gamma``, ``log_beta``, ``log_alpha``) the 1-D
attention ``A_a`` among the tokens of each line along ``a``; the output averages the two path
orders, ``0.5 * A_W A_H (A_T) V + 0.5 * (A_T) A_H A_W V``. Each application runs in place on the
``(B, heads, *grid, C)`` tensors (strided views of split heads included), by the kernels of its
axis' line length:

- lines of at most :data:`.whole_line.MAX_LINE` tokens (:mod:`.whole_line`): one program per
  whole line; one launch forward and one backward;
- longer lines (:mod:`.line`): tiles of a line; one launch forward, two backward.

The forward keeps each path order's intermediate products (``2 (axes - 1)`` tensors like ``v``)
as residuals; the backward runs the applications' backward kernels in reverse order, each
writing or adding its terms of ``dq``, ``dk`` (fp32), ``dv`` and its axis' log-decay gradient
(fp32). Nothing is atomic.
"""
from __future__ import annotations

import math

import torch

from . import line, whole_line
from .vanilla import _check_dtype


def residual_count(grid) -> int:
    """How many tensors like ``v`` (in its dtype, contiguous) the forward keeps for the backward on
    ``grid``: each path order's intermediate products."""
    return 2 * (len(grid) - 1)


def _kernels(n: int):
    """The module whose kernels run an application along lines of ``n`` tokens."""
    return whole_line if n <= whole_line.MAX_LINE else line


def criss_cross_attention_fwd(q, k, v, log_alpha, log_beta, log_gamma=None, form="official"):
    """Criss-cross polyline attention (``ppma.ops.polyline_attention(kind='criss_cross')``).

    ``q``, ``k`` ``(B, heads, *grid, d)``, ``v`` ``(B, heads, *grid, dv)``, fp32 log-decays
    ``(B, heads, *grid)`` on a 2-D or 3-D grid -> ``(out, residuals)``: ``out`` ``(B, heads,
    *grid, dv)`` in ``v.dtype``, ``residuals`` the :func:`residual_count` tensors the backward
    takes. The first path order writes ``0.5 *`` its product into the output, the second adds its
    own.
    """
    _check_dtype(q, k, v)
    q, k, v = (whole_line.token_strides(t) for t in (q, k, v))
    axes = _line_axes(q, log_alpha, log_beta, log_gamma)
    out, intermediates = _like(v), []
    for second, order in enumerate((axes, axes[::-1])):
        y = v
        for i, (log_decay, n, inner) in enumerate(order):
            last = i == len(order) - 1
            target = out if last else _like(v)
            _kernels(n).apply_fwd(q, k, y, log_decay, target, n, inner, form, scale=0.5 if last else 1.0,
                                  accumulate=last and second == 1)
            if not last:
                intermediates.append(target)
            y = target
    return out, intermediates


def criss_cross_attention_bwd(grad, q, k, v, log_alpha, log_beta, log_gamma=None, form="official", residuals=()):
    """Gradients ``[dq, dk, dv, dlog_alpha, dlog_beta(, dlog_gamma)]`` (``dq``, ``dk`` and the
    log-decays' fp32) of :func:`criss_cross_attention_fwd` for the output gradient ``grad`` and
    its ``residuals``: each path order's applications backward, last first."""
    _check_dtype(q, k, v)
    grid = q.shape[2:-1]
    if len(residuals) != residual_count(grid):
        raise ValueError(f"the criss-cross backward on grid {tuple(grid)} takes the forward's {residual_count(grid)} "
                         f"residuals, got {len(residuals)}")
    q, k, v, grad = (whole_line.token_strides(t) for t in (q, k, v, grad))
    axes = _line_axes(q, log_alpha, log_beta, log_gamma)
    m = len(axes)
    dq, dk, dv = _like(q, torch.float32), _like(k, torch.float32), _like(v)
    decay_grads = [_like(log_decay) for log_decay, _, _ in axes]
    written = set()  # the axes whose log-decay gradient holds a term
    for second, order in enumerate((list(range(m)), list(range(m))[::-1])):
        inputs = [v, *residuals[second * (m - 1):(second + 1) * (m - 1)]]
        dout, scale = grad, 0.5
        for i in reversed(range(m)):
            axis = order[i]
            log_decay, n, inner = axes[axis]
            dy = dv if i == 0 else _like(v)
            _kernels(n).apply_bwd(q, k, inputs[i], log_decay, dout, dq, dk, dy, decay_grads[axis], n, inner, form,
                                  scale, accumulate_qk=bool(written), accumulate_y=i == 0 and second == 1,
                                  accumulate_decay=axis in written)
            written.add(axis)
            dout, scale = dy, 1.0
    return [dq, dk, dv, *decay_grads[::-1]]  # W, H (, T)


def _line_axes(q, log_alpha, log_beta, log_gamma):
    """``(log_decay, n, inner)`` per grid axis in the order T (3-D), H, W: its contiguous fp32
    log-decay, its length and the tokens per step along it."""
    grid = q.shape[2:-1]
    decays = ([log_gamma] if log_gamma is not None else []) + [log_beta, log_alpha]
    return [(d.float().contiguous(), n, math.prod(grid[i + 1:])) for i, (d, n) in enumerate(zip(decays, grid))]


def _like(t, dtype=None):
    """An empty tensor shaped like ``t`` with the standard contiguous strides (``empty_like`` keeps
    a size-1 dim's stride, and the custom op would copy an output laid out otherwise)."""
    return torch.empty(t.shape, dtype=dtype or t.dtype, device=t.device)
