"""``L2D x`` (both polyline path orders) in blocks: matmuls inside blocks, a short carry across.

A 1-D scan along a line of length ``n`` is ``y_p = sum_q exp(-|G_p - G_q|) x_q`` with
``G = cumsum(-log_decay)`` (:func:`ppma.ops.polyline_mask_1d`). A line of up to
:data:`WHOLE_LINE` tokens is one block; a longer one is cut into blocks of ``T = BLOCK`` tokens
(the last one padded with decay 1; its ``x`` is zero-padded). With ``c_p`` the decay sum from
the start ``s`` of ``p``'s block to ``p`` and ``e`` the block's end:

- inside a block, one ``T x T`` matmul with the block's 1-D mask;
- from earlier blocks, ``exp(-c_p) H_b`` with the carried state
  ``H_b = link_b (E_{b-1} + exp(-c_e) H_{b-1})``, ``E_b = sum_q exp(c_q - c_e) x_q``;
- from later blocks, ``exp(c_p - c_e) J_b`` with ``J_b = link_{b+1} (S_{b+1} + exp(-c_e) J_{b+1})``,
  ``S_b = sum_q exp(-c_q) x_q``; ``link_b = exp(log_decay[s_b])`` joins block ``b - 1`` to ``b``.

Every factor is ``exp`` of minus a sum of decays over at most one block or one step, so nothing
overflows or cancels. ``n / T`` Python steps per scan, about ``T + 6`` multiply-adds per element:
the plain-PyTorch scan of the linear kind (CPU and any device); :mod:`ppma.ops.polyline_scan`'s
reference stays its oracle. Factors depend on the decays only and are built once per decay set
(:func:`scan_factors`), then applied to any number of channel chunks (:func:`l2d`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..polyline_mask_impl.reference import log_mask_1d

BLOCK = 16
# Lines up to this many tokens are one block: one T x T matmul, no Python carry loop (on 2 CPU
# threads, 56-token lines scan about 1.5x faster than in 16-token blocks; see docs/benchmarks.md).
WHOLE_LINE = 64
FACTORS_PER_AXIS = 4  # the tensors _axis_factors gives


def _axis_factors(log_decay: torch.Tensor, axis: int, block: int) -> list[torch.Tensor]:
    """Factors of the 1-D scan along grid ``axis`` (negative, of ``log_decay``), laid out with
    that axis last and cut into ``nb`` blocks: ``[rows (..., nb, T + 2, T)``: the block's mask,
    then ``exp(c_q - c_e)`` and ``exp(-c_q)`` (one matmul gives ``y``, ``E_b`` and ``S_b``),
    ``weights (..., nb, T, 2) = [exp(-c_p), exp(c_p - c_e)]``, ``link (..., nb, 1)``, ``span
    (..., nb, 1) = exp(-c_e)]``."""
    ld = log_decay.movedim(axis, -1)
    n = ld.shape[-1]
    t = n if n <= WHOLE_LINE else min(block, n)
    ld = F.pad(ld, (0, -n % t)).unflatten(-1, (-1, t))  # (..., nb, T)
    c = -torch.cat([torch.zeros_like(ld[..., :1]), ld[..., 1:]], dim=-1).cumsum(-1)
    end = c[..., -1:]
    head, tail = (-c).exp(), (c - end).exp()
    rows = torch.cat([log_mask_1d(ld).exp(), tail.unsqueeze(-2), head.unsqueeze(-2)], dim=-2)
    return [rows, torch.stack([head, tail], dim=-1), ld[..., :1].exp(), (-end).exp()]


def scan_factors(log_alpha, log_beta, log_gamma=None, block: int = BLOCK) -> list[list[torch.Tensor]]:
    """Per grid axis (``log_alpha`` along W, ``log_beta`` along H, ``log_gamma`` along T), its scan
    factors, in the order W, H[, T]; decays ``(..., [T,] H, W)``, fp32/fp64."""
    decays = [log_alpha, log_beta] + ([log_gamma] if log_gamma is not None else [])
    return [_axis_factors(d.double() if d.dtype == torch.float64 else d.float(), -1 - i, block)
            for i, d in enumerate(decays)]


def _scan_1d(x: torch.Tensor, factors: list[torch.Tensor], axis: int) -> torch.Tensor:
    """1-D scan of ``x`` ``(..., *grid, C)`` along grid ``axis`` (negative, counted on the grid)."""
    rows, weights, link, span = (f.to(x.dtype) for f in factors)
    nb, t = rows.shape[-3], rows.shape[-1]
    xs = x.movedim(axis - 1, -2)
    n = xs.shape[-2]
    xb = (F.pad(xs, (0, 0, 0, nb * t - n)) if nb * t != n else xs).unflatten(-2, (nb, t))
    if nb == 1:
        y = rows[..., :t, :] @ xb
    else:
        full = rows @ xb  # (..., nb, T + 2, C): y inside the blocks, then E_b and S_b
        y, ends, starts = full[..., :t, :], full[..., t, :].unbind(-2), full[..., t + 1, :].unbind(-2)
        links, spans = link.unbind(-2), span.unbind(-2)
        carried = [torch.zeros_like(ends[0])]
        for b in range(1, nb):
            carried.append(links[b] * (ends[b - 1] + spans[b - 1] * carried[-1]))
        later = [torch.zeros_like(ends[0])]
        for b in range(nb - 2, -1, -1):
            later.append(links[b + 1] * (starts[b + 1] + spans[b + 1] * later[-1]))
        states = torch.stack([torch.stack(carried, dim=-2), torch.stack(later[::-1], dim=-2)], dim=-2)
        y = y + weights @ states  # (..., nb, T, 2) @ (..., nb, 2, C)
    return y.flatten(-3, -2)[..., :n, :].movedim(-2, axis - 1)


def path_scans(x: torch.Tensor, factors: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """``[L x, L^T x]`` (V2H and H2V; their sum is ``L2D x``) for ``x`` ``(..., *grid, C)`` with
    :func:`scan_factors` of its decays: V2H scans along T, H, W in that order, H2V along W, H, T."""
    v2h = list(enumerate(factors))[::-1]  # (axis index, factors): T, H, W

    def run(chain):
        y = x
        for i, f in chain:
            y = _scan_1d(y, f, -1 - i)
        return y

    return [run(v2h), run(v2h[::-1])]
