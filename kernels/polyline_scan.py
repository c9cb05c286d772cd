"""``polyline_scan`` (``y = L x``, the polyline path mask applied without forming it) in Triton.

The V2H mask is a product of 1-D scans applied in sequence (3-D: along T with gamma, then H with
beta, then W with alpha; 2-D: H, then W), the H2V mask is the same product in reverse order and
``'both'`` is their sum. Each 1-D scan is one kernel launch of :mod:`ppma.kernels.decay_scan`;
intermediate results are kept in fp32 (fp64 for fp64 ``x``).

Backward: every 1-D mask is symmetric, so ``dx`` runs the same scans in reverse order on the
upstream gradient; each scan's decay gradient needs that scan's input, which is recomputed from
``x`` (memory stays O(N): nothing but ``x`` and the decays is saved).

The function is the custom op ``ppma::polyline_scan`` (``torch.library``), with a fake
implementation and a registered autograd formula, so ``torch.compile`` keeps it as one op.
"""
from __future__ import annotations

import torch

from .decay_scan import accumulation_dtype, decay_scan_bwd, decay_scan_fwd

# Grid dims of the 6-D layout (B, heads, T, H, W, C): T (gamma), H (beta), W (alpha).
_T, _H, _W = 2, 3, 4


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


@torch.library.custom_op("ppma::polyline_scan", mutates_args=())
def _polyline_scan_op(
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str,
    log_gamma: torch.Tensor | None,
) -> torch.Tensor:
    x6, chain = _as_6d(x, log_alpha, log_beta, log_gamma)
    return _forward(x6, chain, order).squeeze(_T) if log_gamma is None else _forward(x6, chain, order)


@_polyline_scan_op.register_fake
def _(x, log_alpha, log_beta, order, log_gamma):
    return torch.empty_like(x)


@torch.library.custom_op("ppma::polyline_scan_backward", mutates_args=())
def _polyline_scan_backward_op(
    grad: torch.Tensor,
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str,
    log_gamma: torch.Tensor | None,
) -> list[torch.Tensor]:
    """``[dx, dlog_alpha, dlog_beta]`` (+ ``dlog_gamma`` for 3-D grids)."""
    x6, chain = _as_6d(x, log_alpha, log_beta, log_gamma)
    grad6 = grad.unsqueeze(_T) if log_gamma is None else grad
    dx, dlogs = _backward(grad6, x6, chain, order)
    if log_gamma is None:
        return [dx.squeeze(_T), dlogs[1].squeeze(_T), dlogs[0].squeeze(_T)]
    return [dx, dlogs[2], dlogs[1], dlogs[0]]


@_polyline_scan_backward_op.register_fake
def _(grad, x, log_alpha, log_beta, order, log_gamma):
    grads = [torch.empty_like(grad, dtype=x.dtype), torch.empty_like(log_alpha), torch.empty_like(log_beta)]
    return grads + ([torch.empty_like(log_gamma)] if log_gamma is not None else [])


def _setup_context(ctx, inputs, output):
    x, log_alpha, log_beta, order, log_gamma = inputs
    ctx.order = order
    ctx.save_for_backward(x, log_alpha, log_beta, log_gamma)


def _backward_formula(ctx, grad):
    x, log_alpha, log_beta, log_gamma = ctx.saved_tensors
    grads = _polyline_scan_backward_op(grad, x, log_alpha, log_beta, ctx.order, log_gamma)
    dx, dlog_alpha, dlog_beta = grads[:3]
    return dx, dlog_alpha, dlog_beta, None, grads[3] if log_gamma is not None else None


_polyline_scan_op.register_autograd(_backward_formula, setup_context=_setup_context)


def polyline_scan_triton(
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str = "both",
    log_gamma: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton ``polyline_scan``: same contract as :func:`ppma.ops.polyline_scan` (no input checks).

    ``x``: ``(B, heads, H, W, C)`` with decays ``(B, heads, H, W)``, or ``(B, heads, T, H, W, C)``
    with decays ``(B, heads, T, H, W)``; any strides (a permuted channels-last view is read in
    place); fp32/fp16/bf16 (fp64 accumulates in fp64); returns ``x.dtype``, laid out like ``x``
    when ``x`` is dense. Differentiable in ``x`` and every decay.
    """
    return _polyline_scan_op(x, log_alpha, log_beta, order, log_gamma)
