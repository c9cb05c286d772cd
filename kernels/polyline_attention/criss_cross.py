"""The criss-cross polyline attention from the line-attention kernels.

Per grid axis ``a`` (T, H, W; its log-decay ``log_gamma``, ``log_beta``, ``log_alpha``) the 1-D
attention ``A_a`` among the tokens of each line along ``a``; the output averages the two path
orders, ``0.5 * A_W A_H (A_T) V + 0.5 * (A_T) A_H A_W V``. Each application is one kernel launch.

- Lines of at most :data:`.whole_line.MAX_LINE` tokens on every axis (:mod:`.whole_line`): one
  program per whole line, in place on the ``(B, heads, *grid, C)`` tensors (strided views of
  split heads included). The forward keeps each order's intermediate products (``2 (axes - 1)``
  tensors like ``v``) as residuals; the backward runs the applications' backward kernels in
  reverse order, four launches on a 2-D grid (six on a 3-D one), as many as the forward.
- Longer lines (:mod:`.line`): the kernels tile each line, on ``(lines, n, C)`` copies (``q``,
  ``k`` and the decay sums are laid out once per axis); the backward runs the chains again for
  their intermediates and log-sum-exps (no residuals), then the line backward kernels in reverse
  order.
"""
from __future__ import annotations

import math

import torch

from . import whole_line
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


def residual_count(grid) -> int:
    """How many tensors like ``v`` (in its dtype, contiguous) the forward keeps for the backward on
    ``grid``: each path order's intermediate products on whole lines, none on tiled ones."""
    return 2 * (len(grid) - 1) if whole_line.fits(grid) else 0


def criss_cross_attention_fwd(q, k, v, log_alpha, log_beta, log_gamma=None, form="official"):
    """Criss-cross polyline attention (``ppma.ops.polyline_attention(kind='criss_cross')``).

    ``q``, ``k`` ``(B, heads, *grid, d)``, ``v`` ``(B, heads, *grid, dv)``, fp32 log-decays
    ``(B, heads, *grid)`` on a 2-D or 3-D grid -> ``(out, residuals)``: ``out`` ``(B, heads,
    *grid, dv)`` in ``v.dtype``, ``residuals`` the :func:`residual_count` tensors the backward takes.
    """
    _check_dtype(q, k, v)
    if whole_line.fits(q.shape[2:-1]):
        return _whole_line_fwd(q, k, v, log_alpha, log_beta, log_gamma, form)
    axes = _axes(q, k, log_alpha, log_beta, log_gamma)
    outs = []
    for order in (axes, axes[::-1]):
        y = v
        for axis in order:
            y = axis.apply(y, form)[0]
        outs.append(y)
    return 0.5 * outs[0] + 0.5 * outs[1], []


def criss_cross_attention_bwd(grad, q, k, v, log_alpha, log_beta, log_gamma=None, form="official", residuals=()):
    """Gradients ``[dq, dk, dv, dlog_alpha, dlog_beta(, dlog_gamma)]`` of
    :func:`criss_cross_attention_fwd` for the output gradient ``grad`` and its ``residuals``."""
    _check_dtype(q, k, v)
    grid = q.shape[2:-1]
    if len(residuals) != residual_count(grid):
        raise ValueError(f"the criss-cross backward on grid {tuple(grid)} takes the forward's {residual_count(grid)} "
                         f"residuals, got {len(residuals)}")
    if whole_line.fits(grid):
        return _whole_line_bwd(grad, q, k, v, log_alpha, log_beta, log_gamma, form, residuals)
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


def _whole_line_fwd(q, k, v, log_alpha, log_beta, log_gamma, form):
    """:func:`criss_cross_attention_fwd` on whole lines: the first path order writes ``0.5 *`` its
    product into the output, the second adds its own."""
    q, k, v = (whole_line.token_strides(t) for t in (q, k, v))
    axes = _line_axes(q, log_alpha, log_beta, log_gamma)
    out, intermediates = _like(v), []
    for second, order in enumerate((axes, axes[::-1])):
        y = v
        for i, (log_decay, n, inner) in enumerate(order):
            last = i == len(order) - 1
            target = out if last else _like(v)
            whole_line.apply_fwd(q, k, y, log_decay, target, n, inner, form, scale=0.5 if last else 1.0,
                                 accumulate=last and second == 1)
            if not last:
                intermediates.append(target)
            y = target
    return out, intermediates


def _whole_line_bwd(grad, q, k, v, log_alpha, log_beta, log_gamma, form, intermediates):
    """:func:`criss_cross_attention_bwd` on whole lines: each path order's applications backward,
    last first, each writing or adding its terms of ``dq``, ``dk`` (fp32), ``dv`` and its axis'
    log-decay gradient (fp32)."""
    q, k, v, grad = (whole_line.token_strides(t) for t in (q, k, v, grad))
    axes = _line_axes(q, log_alpha, log_beta, log_gamma)
    m = len(axes)
    dq, dk, dv = _like(q, torch.float32), _like(k, torch.float32), _like(v)
    decay_grads = [_like(log_decay) for log_decay, _, _ in axes]
    written = set()  # the axes whose log-decay gradient holds a term
    for second, order in enumerate((list(range(m)), list(range(m))[::-1])):
        inputs = [v, *intermediates[second * (m - 1):(second + 1) * (m - 1)]]
        dout, scale = grad, 0.5
        for i in reversed(range(m)):
            axis = order[i]
            log_decay, n, inner = axes[axis]
            dy = dv if i == 0 else _like(v)
            whole_line.apply_bwd(q, k, inputs[i], log_decay, dout, dq, dk, dy, decay_grads[axis], n, inner, form,
                                 scale, accumulate_qk=bool(written), accumulate_y=i == 0 and second == 1,
                                 accumulate_decay=axis in written)
            written.add(axis)
            dout, scale = dy, 1.0
    return [dq, dk, dv, *decay_grads[::-1]]  # W, H (, T)
