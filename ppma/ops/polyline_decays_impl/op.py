"""Public :func:`polyline_decays`: the custom op ``ppma::polyline_decays``, registered below with its
Triton kernel (``ppma.kernels.polyline_decays``) and its FLOP formula."""
from __future__ import annotations

import math

import torch

from ppma.kernels.common.runtime import triton_checks

from ..registry import Impl, Kernel, register, select_backend
from .reference import polyline_decays_reference


def _flops(x, weight, dt_bias, A_log):
    """The projection's multiply-adds and, per output, the bias, softplus, negation and product
    (one FLOP each), plus ``exp(A_log)``: what the counter found in the layer's PyTorch ops."""
    outputs = math.prod(x[:-1]) * dt_bias[0] * weight[0]
    return {"projection": math.prod(x) * weight[0], "decay": 4 * outputs + dt_bias[0]}


def _fake(x, weight, dt_bias, A_log):
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty((weight.shape[0], x.shape[0], dt_bias.shape[0], *x.shape[1:-1]), dtype=dtype)


def _load_triton() -> Impl:
    """The backward recomputes the projection from ``x``: no residuals."""
    from ppma.kernels import polyline_decays

    def forward(*args):
        return polyline_decays.forward(*args), ()

    def backward(grads, residuals, *args):
        return polyline_decays.backward(grads[0], *args)

    return Impl(forward, backward)


OP = register(
    "polyline_decays",
    arguments="Tensor x, Tensor weight, Tensor dt_bias, Tensor A_log",
    reference=polyline_decays_reference,
    fake=_fake,
    flops=_flops,
    kernels=[Kernel("triton", load=_load_triton, **triton_checks(("polyline_decays.projection",)))],
)


def polyline_decays(x: torch.Tensor, weight: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor,
                    backend: str | None = None) -> torch.Tensor:
    """Log-decays of PPMA's polyline path mask from the tokens (:class:`ppma.layers.DecayGenerator`).

    Shapes: ``x`` ``(B, *grid, C)``; ``weight`` ``(n_axes, d)``, the linear map shared by the
    heads, ``d = C / heads``; ``dt_bias``, ``A_log`` ``(heads,)`` -> ``(n_axes, B, heads, *grid)``,
    contiguous, fp32 (fp64 for fp64 ``x``), each ``<= 0``::

        out[a, b, h, ...] = -softplus(x[b, ..., h*d:(h+1)*d] @ weight[a] + dt_bias[h]) * exp(A_log[h])

    Differentiable in every tensor. Under autocast the ``torch`` backend's projection runs in
    autocast's dtype (as ``nn.Linear``'s); the Triton kernels compute in fp32 from ``x`` as given.
    ``backend``: as in :func:`ppma.ops.select_backend`.
    """
    for name, t in (("x", x), ("weight", weight), ("dt_bias", dt_bias), ("A_log", A_log)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if x.dim() < 3 or any(s == 0 for s in x.shape):
        raise ValueError(f"x must have shape (B, *grid, C) with no empty dim, got {tuple(x.shape)}")
    if dt_bias.dim() != 1 or A_log.shape != dt_bias.shape:
        raise ValueError(f"dt_bias and A_log must have shape (heads,), got {tuple(dt_bias.shape)} and {tuple(A_log.shape)}")
    heads = dt_bias.shape[0]
    if weight.dim() != 2 or not 1 <= weight.shape[0] <= 3 or weight.shape[1] * heads != x.shape[-1]:
        raise ValueError(f"weight must have shape (n_axes <= 3, C / heads) = (n, {x.shape[-1] // max(heads, 1)}) "
                         f"for x with C={x.shape[-1]} and {heads} heads, got {tuple(weight.shape)}")
    return OP(x, weight, dt_bias, A_log, backend=select_backend("polyline_decays", x.device, backend))
