"""Public :func:`polyline_scan`: the custom op ``ppma::polyline_scan``, registered below with its
Triton kernel (``ppma.kernels.polyline_scan``) and its FLOP formula.

This file is the pattern for an op with a kernel: reference in ``reference.py``; here the FLOP
formula, the fake implementation, one :func:`~ppma.ops.registry.register` call, and the public
function (input checks, backend resolution, call).
"""
from __future__ import annotations

import math

import torch

from ppma.kernels.common.runtime import triton_checks

from .._checks import ORDERS, check_choice, check_decays, check_grid_tensor
from ..registry import Impl, Kernel, register, select_backend
from .export import polyline_scan_export
from .reference import polyline_scan_reference

# Per element of x, grid axis and path order: two decayed recurrences (a multiply-add each)
# and their combination.
FLOPS_PER_ELEMENT_AXIS_ORDER = 3


def _flops(x, log_alpha, log_beta, order, log_gamma):
    axes = len(x) - 3  # x: (B, heads, *grid, C)
    return {"scan": math.prod(x) * axes * (2 if order == "both" else 1) * FLOPS_PER_ELEMENT_AXIS_ORDER}


def _load_triton() -> Impl:
    """The kernels keep no residuals: the backward recomputes each 1-D scan's input from ``x``."""
    from ppma.kernels import polyline_scan

    def forward(*args):
        return polyline_scan.forward(*args), ()

    def backward(grads, residuals, *args):
        return polyline_scan.backward(grads[0], *args)

    return Impl(forward, backward)


def _backward_fake(grads, residuals, x, log_alpha, log_beta, order, log_gamma):
    """``dx`` like the gradient (in ``x.dtype``), decay gradients like the decays."""
    decays = [log_alpha, log_beta] + ([log_gamma] if log_gamma is not None else [])
    return [torch.empty_like(grads[0], dtype=x.dtype)] + [torch.empty_like(d) for d in decays]


OP = register(
    "polyline_scan",
    arguments="Tensor x, Tensor log_alpha, Tensor log_beta, str order, Tensor? log_gamma",
    reference=polyline_scan_reference,
    export=polyline_scan_export,
    fake=lambda x, log_alpha, log_beta, order, log_gamma: torch.empty_like(x),
    backward_fake=_backward_fake,
    flops=_flops,
    kernels=[Kernel("triton", load=_load_triton, **triton_checks(("polyline_scan.decay_scan",)))],
)


def polyline_scan(
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    order: str = "both",
    log_gamma: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``y = L x`` without forming ``L`` (Theorem 2), O(N) per channel.

    Shapes: ``x`` ``(B, heads, H, W, C)`` with decays ``(B, heads, H, W)``, or, with ``log_gamma``,
    ``x`` ``(B, heads, T, H, W, C)`` with decays ``(B, heads, T, H, W)``. Any ``C`` and floating
    dtype; sums are accumulated in fp32 and returned in ``x.dtype``, laid out like ``x``.
    Differentiable in ``x`` and every decay. ``order`` as in :func:`ppma.ops.polyline_mask`.
    ``backend``: ``'torch'``, ``'triton'`` or ``'auto'`` (default: ``PPMA_BACKEND``, else auto;
    see :func:`ppma.ops.select_backend`).
    """
    check_choice("order", order, ORDERS)
    check_grid_tensor("x", x, log_alpha, log_gamma)
    check_decays(log_alpha, log_beta, log_gamma, grid_shape=x.shape[:-1])
    chosen = select_backend("polyline_scan", x.device, backend)
    return OP(x, log_alpha, log_beta, order, log_gamma, backend=chosen)
