"""``polyline_scan`` (``y = L x``, the polyline path mask applied without forming it) in Triton.

The V2H mask is a product of 1-D scans applied in sequence (3-D: along T with gamma, then H with
beta, then W with alpha; 2-D: H, then W), the H2V mask is the same product in reverse order and
``'both'`` is their sum. On grids whose rows (times the frames of a 3-D grid) fit a tile, one
kernel of :mod:`.plane_scan` runs every scan of the order (and one more the decay gradients).
Otherwise (longer rows) each 1-D scan is one kernel launch of :mod:`.decay_scan`; intermediate
results are kept in fp32 (fp64 for fp64 ``x``).

Backward: every 1-D mask is symmetric, so ``dx`` runs the same scans in reverse order on the
upstream gradient; each scan's decay gradient needs that scan's input, which is recomputed from
``x`` (memory stays O(N): nothing but ``x`` and the decays is saved).

:func:`forward` and :func:`backward` are plain functions (no autograd, no input checks); the
custom op ``ppma::polyline_scan`` (``ppma.ops``) calls them when the Triton backend is selected.
"""
from __future__ import annotations

import torch

from ..common.strided import accumulation_dtype
from . import plane_scan
from .decay_scan import decay_scan_bwd, decay_scan_fwd

# Grid dims of the 6-D layout (B, heads, T, H, W, C): T (gamma), H (beta), W (alpha).
_T, _H, _W = 2, 3, 4
# Every 1-D mask is symmetric, so L^T for an order is L for this one.
_TRANSPOSED = {"v2h": "h2v", "h2v": "v2h", "both": "both"}


def _fused(x, log_gamma):
    """Whether :mod:`.plane_scan` runs this grid (rows, across all frames of a 3-D grid, that fit
    a tile)."""
    return plane_scan.fits(x.shape[-2], 1 if log_gamma is None else x.shape[_T])


def _as_6d(x, log_alpha, log_beta, log_gamma):
    """6-D ``x`` and the V2H chain ``[(log_decay, dim), ...]`` on 5-D decays (views, no copies)."""
    if log_gamma is None:
        return x.unsqueeze(_T), [(log_beta.unsqueeze(_T), _H), (log_alpha.unsqueeze(_T), _W)]
    return x, [(log_gamma, _T), (log_beta, _H), (log_alpha, _W)]


def _chains(chain_v2h, order):
    """The scan chains whose results are summed: V2H, its reverse (H2V), or both."""
    chains = {"v2h": [chain_v2h], "h2v": [chain_v2h[::-1]], "both": [chain_v2h, chain_v2h[::-1]]}
    if order not in chains:
        raise ValueError(f"order must be one of {tuple(chains)}, got {order!r}")
    return chains[order]


def _forward(x6, chain_v2h, order):
    """``L x`` for 6-D ``x6``; every chain but the last ends in the accumulation dtype."""
    acc = accumulation_dtype(x6)
    chains = _chains(chain_v2h, order)
    y = None
    for c, chain in enumerate(chains):
        u = x6
        for s, (log_decay, dim) in enumerate(chain):
            last = s == len(chain) - 1
            dtype = x6.dtype if last and c == len(chains) - 1 else acc
            u = decay_scan_fwd(u, log_decay, dim, dtype, base=y if last else None)
        y = u
    return y


def _backward(grad6, x6, chain_v2h, order):
    """``(dx, [dlog_decay per V2H chain step])`` for 6-D ``grad6``/``x6``."""
    acc = accumulation_dtype(x6)
    chains = _chains(chain_v2h, order)
    dx = None
    dlogs = {}
    for c, chain in enumerate(chains):
        inputs = [x6]  # input of every scan of the chain, recomputed
        for log_decay, dim in chain[:-1]:
            inputs.append(decay_scan_fwd(inputs[-1], log_decay, dim, acc))
        g = grad6
        for s in range(len(chain) - 1, -1, -1):
            log_decay, dim = chain[s]
            first = s == 0
            dtype = x6.dtype if first and c == len(chains) - 1 else acc
            g, dlog = decay_scan_bwd(inputs[s], g, log_decay, dim, dtype, base=dx if first else None)
            dlogs[dim] = dlog if dim not in dlogs else dlogs[dim] + dlog
        dx = g
    return dx, [dlogs[dim] for _, dim in chain_v2h]


def forward(
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str,
    log_gamma: torch.Tensor | None,
) -> torch.Tensor:
    """``y = L x``: same contract as ``ppma.ops.polyline_scan`` (no input checks, no autograd).

    ``x``: ``(B, heads, H, W, C)`` with decays ``(B, heads, H, W)``, or ``(B, heads, T, H, W, C)``
    with decays ``(B, heads, T, H, W)``; any strides (a permuted channels-last view is read in
    place); fp32/fp16/bf16 (fp64 accumulates in fp64); returns ``x.dtype``, laid out like ``x``
    when ``x`` is dense.
    """
    if _fused(x, log_gamma):
        return plane_scan.forward(x, log_alpha, log_beta, order, log_gamma)
    x6, chain = _as_6d(x, log_alpha, log_beta, log_gamma)
    y = _forward(x6, chain, order)
    return y.squeeze(_T) if log_gamma is None else y


def backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str,
    log_gamma: torch.Tensor | None,
) -> list[torch.Tensor]:
    """Gradients of :func:`forward` given ``grad`` (shaped like ``x``, any strides):
    ``[dx, dlog_alpha, dlog_beta]`` (+ ``dlog_gamma`` for 3-D grids)."""
    if _fused(x, log_gamma):
        dx = plane_scan.forward(grad, log_alpha, log_beta, _TRANSPOSED[order], log_gamma).to(x.dtype)
        return [dx, *plane_scan.decay_grads(x, grad, log_alpha, log_beta, order, log_gamma)]
    x6, chain = _as_6d(x, log_alpha, log_beta, log_gamma)
    grad6 = grad.unsqueeze(_T) if log_gamma is None else grad
    dx, dlogs = _backward(grad6, x6, chain, order)
    if log_gamma is None:
        return [dx.squeeze(_T), dlogs[1].squeeze(_T), dlogs[0].squeeze(_T)]
    return [dx, dlogs[2], dlogs[1], dlogs[0]]
