"""Polyline path masked attention (vanilla and criss-cross kinds): the plain reference.

``q``, ``k``, ``v``: ``(B, heads, *grid, d)`` on a 2-D ``(H, W)`` or 3-D ``(T, H, W)`` grid, ``N``
tokens; decays ``(B, heads, *grid)``; the logits are ``q k^T`` as given (callers scale). ``L``
is the V2H polyline mask (row = query, column = key), ``L^T`` the H2V mask.

- ``'vanilla'``, O(N^2): ``form='official'`` (the released models):
  ``0.5 * softmax(QK^T + log L) V + 0.5 * softmax(QK^T + log L^T) V``;
  ``form='paper'``: ``(softmax(QK^T) * (L + L^T)) V``.
- ``'criss_cross'``, O(N^1.5): per grid axis ``a`` a 1-D attention ``A_a`` among the tokens of
  each line along ``a`` with that axis' 1-D mask ``M_a`` (official: ``softmax(QK^T + log M_a)``;
  paper: ``softmax(QK^T) * M_a``); output ``0.5 * A_W A_H V + 0.5 * A_H A_W V`` (3-D:
  ``0.5 * A_W A_H A_T V + 0.5 * A_T A_H A_W V``), the two path orders averaged.

Logits and masks are fp32 (fp64 for fp64 inputs); attention weights are cast to ``v.dtype``
before they multiply ``v``.
"""
from __future__ import annotations

import torch

from ..polyline_mask_impl.reference import log_mask_1d, polyline_log_mask_reference, polyline_mask_reference

KINDS = ("vanilla", "criss_cross")
FORMS = ("official", "paper")


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float64 else t.float()


def _vanilla(q, k, v, log_alpha, log_beta, log_gamma, form):
    grid = q.shape[2:-1]
    logits = _at_least_fp32(q.flatten(2, -2) @ k.flatten(2, -2).transpose(-1, -2))  # (B, heads, N, N)
    if form == "official":
        log_mask = polyline_log_mask_reference(log_alpha, log_beta, log_gamma)
        attn = 0.5 * (logits + log_mask).softmax(-1) + 0.5 * (logits + log_mask.transpose(-1, -2)).softmax(-1)
    else:
        attn = logits.softmax(-1) * polyline_mask_reference(log_alpha, log_beta, "both", log_gamma)
    return (attn.to(v.dtype) @ v.flatten(2, -2)).unflatten(2, grid)


def _axis_attention(q, k, log_decay, axis, form):
    """1-D masked attention among the tokens of every line along grid ``axis`` of ``q``.

    Returns ``(B, heads, *other grid axes, n, n)``, ``n = q.shape[axis]``.
    """
    logits = _at_least_fp32(q.movedim(axis, -2) @ k.movedim(axis, -2).transpose(-1, -2))
    log_mask = log_mask_1d(log_decay.movedim(axis, -1))
    if form == "official":
        return (logits + log_mask).softmax(-1)
    return logits.softmax(-1) * log_mask.exp()


def _criss_cross(q, k, v, log_alpha, log_beta, log_gamma, form):
    w_axis = q.dim() - 2  # axes of q (B, heads, [T,] H, W, d)
    axes = [(log_beta, w_axis - 1), (log_alpha, w_axis)]
    if log_gamma is not None:
        axes.insert(0, (log_gamma, w_axis - 2))
    attns = [(_axis_attention(q, k, d, a, form).to(v.dtype), a) for d, a in axes]

    def run(order):
        y = v
        for attn, axis in order:
            y = (attn @ y.movedim(axis, -2)).movedim(-2, axis)
        return y

    return 0.5 * run(attns) + 0.5 * run(attns[::-1])


def polyline_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    log_gamma: torch.Tensor | None = None,
    kind: str = "vanilla",
    form: str = "official",
) -> torch.Tensor:
    """PyTorch reference of :func:`ppma.ops.polyline_attention` (same contract; no input checks)."""
    attend = _vanilla if kind == "vanilla" else _criss_cross
    return attend(q, k, v, log_alpha, log_beta, log_gamma, form)
