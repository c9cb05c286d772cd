"""The criss-cross polyline attention from the line-attention kernels of :mod:`.line`.

Per grid axis ``a`` (T, H, W; its log-decay ``log_gamma``, ``log_beta``, ``log_alpha``) the 1-D
attention ``A_a`` among the tokens of each line along ``a``; the output averages the two path
orders, ``0.5 * A_W A_H (A_T) V + 0.5 * (A_T) A_H A_W V``. Each application is one kernel launch
on ``(lines, n, C)`` copies (``q``, ``k`` and the decay sums are laid out once per axis). The
backward runs the chains again for their intermediates and log-sum-exps (``O(N C)`` memory),
then the line backward kernels in reverse order.
"""
from __future__ import annotations

import torch

from .decays import decay_gradient
from .line import line_attention_bwd, line_attention_fwd
from .vanilla import _check_dtype


def _to_lines(t: torch.Tensor, axis: int) -> torch.Tensor:
    """``(B, heads, *grid, C)`` -> contiguous ``(lines, n, C)`` along grid ``axis`` of ``t``."""
    return t.movedim(axis, -2).reshape(-1, t.shape[axis], t.shape[-1]).contiguous()


def _from_lines(t: torch.Tensor, like_shape, axis: int) -> torch.Tensor:
    shape = list(like_shape)
    n = shape.pop(axis)
    shape.insert(-1, n)
    return t.view(*shape[:-1], t.shape[-1]).movedim(-2, axis)


class _Axis:
    """One grid axis: ``q``, ``k`` and the decay sums laid out as lines along it."""

    def __init__(self, q, k, log_decay, axis):
        self.axis, self.shape = axis, q.shape
        self.q, self.k = _to_lines(q, axis), _to_lines(k, axis)
        g = (-log_decay.float()).cumsum(axis)
        self.g = g.movedim(axis, -1).reshape(-1, q.shape[axis]).contiguous()

    def apply(self, y, form):
        """``(A_a y, lse, y and A_a y as lines)``."""
        y_lines = _to_lines(y, self.axis)
        out, lse = line_attention_fwd(self.q, self.k, y_lines, self.g, form)
        return _from_lines(out, y.shape, self.axis), lse, y_lines, out


def _axes(q, k, log_alpha, log_beta, log_gamma):
    """The :class:`_Axis` list in the order T (3-D), H, W."""
    w = q.dim() - 2
    axes = [_Axis(q, k, log_beta, w - 1), _Axis(q, k, log_alpha, w)]
    if log_gamma is not None:
        axes.insert(0, _Axis(q, k, log_gamma, w - 2))
    return axes


def criss_cross_attention_fwd(q, k, v, log_alpha, log_beta, log_gamma=None, form="official"):
    """Criss-cross polyline attention (``ppma.ops.polyline_attention(kind='criss_cross')``).

    ``q``, ``k`` ``(B, heads, *grid, d)``, ``v`` ``(B, heads, *grid, dv)``, fp32 log-decays
    ``(B, heads, *grid)`` on a 2-D or 3-D grid -> ``(B, heads, *grid, dv)`` in ``v.dtype``.
    """
    _check_dtype(q, k, v)
    axes = _axes(q, k, log_alpha, log_beta, log_gamma)
    outs = []
    for order in (axes, axes[::-1]):
        y = v
        for axis in order:
            y = axis.apply(y, form)[0]
        outs.append(y)
    return 0.5 * outs[0] + 0.5 * outs[1]


def criss_cross_attention_bwd(grad, q, k, v, log_alpha, log_beta, log_gamma=None, form="official"):
    """Gradients ``[dq, dk, dv, dlog_alpha, dlog_beta(, dlog_gamma)]`` of
    :func:`criss_cross_attention_fwd` for the output gradient ``grad``."""
    _check_dtype(q, k, v)
    axes = _axes(q, k, log_alpha, log_beta, log_gamma)
    bufs = {id(a): (torch.zeros(a.q.shape, dtype=torch.float32, device=q.device),
                    torch.zeros(a.k.shape, dtype=torch.float32, device=q.device),
                    torch.zeros(a.g.shape, dtype=torch.float32, device=q.device)) for a in axes}
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for order in (axes, axes[::-1]):
        y, steps = v, []
        for axis in order:
            y, *saved = axis.apply(y, form)
            steps.append((axis, y.shape, *saved))
        dy = (0.5 * grad).to(v.dtype)
        for axis, shape, lse, y_lines, out in reversed(steps):
            dq, dk, dg = bufs[id(axis)]
            dy_lines = line_attention_bwd(_to_lines(dy, axis.axis), axis.q, axis.k, y_lines, axis.g, out, lse,
                                          dq, dk, dg, form)
            dy = _from_lines(dy_lines, shape, axis.axis)
        dv += dy
    dq = sum(_from_lines(bufs[id(a)][0], q.shape, a.axis) for a in axes)
    dk = sum(_from_lines(bufs[id(a)][1], k.shape, a.axis) for a in axes)
    decay_grads = [decay_gradient(bufs[id(a)][2].view(_moved(log_alpha.shape, a.axis)).movedim(-1, a.axis), a.axis)
                   for a in axes[::-1]]  # W, H (, T)
    return [dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype), *decay_grads]


def _moved(shape, axis):
    shape = list(shape)
    shape.append(shape.pop(axis))
    return shape
