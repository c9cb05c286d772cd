"""Public :func:`depthwise_conv`: the custom op ``ppma::depthwise_conv``, registered below with its
Triton kernel (``ppma.kernels.depthwise_conv``) and its FLOP formula."""
from __future__ import annotations

import math

import torch

from ppma.kernels.common.runtime import triton_checks

from .._autocast import autocast_dtype
from ..registry import Impl, Kernel, register, select_backend
from .reference import depthwise_conv_reference


def _flops(x, weight, bias, add_input):
    """A multiply-add per tap and output element, and (with ``add_input``) the input's sum."""
    return {"conv": math.prod(x) * weight[-1] * weight[-2], "add": math.prod(x) if add_input else 0}


def _dtypes(x: torch.Tensor, add_input: bool) -> tuple[torch.dtype, torch.dtype]:
    """``(the conv's dtype, the output's)``: autocast's where it is on for ``x``'s device (fp64
    kept), else ``x``'s; the output promotes the conv's with ``x``'s when ``x`` is added."""
    conv = autocast_dtype(x.device.type)
    conv = x.dtype if conv is None or x.dtype == torch.float64 else conv
    return conv, torch.promote_types(conv, x.dtype) if add_input else conv


def _fake(x, weight, bias, add_input):
    return torch.empty(x.shape, dtype=_dtypes(x, add_input)[1], device=x.device)


def _load_triton() -> Impl:
    """The backward reads ``x`` and the weight again: no residuals."""
    from ppma.kernels import depthwise_conv

    def forward(x, weight, bias, add_input):
        return depthwise_conv.forward(x, weight, bias, add_input, *_dtypes(x, add_input)), ()

    def backward(grads, residuals, x, weight, bias, add_input):
        return depthwise_conv.backward(grads[0], x, weight, bias, add_input, _dtypes(x, add_input)[0])

    return Impl(forward, backward)


OP = register(
    "depthwise_conv",
    arguments="Tensor x, Tensor weight, Tensor? bias, bool add_input",
    reference=depthwise_conv_reference,
    fake=_fake,
    flops=_flops,
    kernels=[Kernel("triton", load=_load_triton, **triton_checks(("depthwise_conv.conv",)))],
)


def depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   add_input: bool = False, backend: str | None = None) -> torch.Tensor:
    """``K x K`` depthwise convolution of a channels-last grid, ``x`` added when ``add_input``:
    :class:`ppma.layers.GridDepthwiseConv` (and its residual) in one op.

    Shapes: ``x`` ``(N, H, W, C)``, any strides; ``weight`` ``(C, 1, K, K)`` with ``K`` odd, ``bias``
    ``(C,)`` or None -> ``(N, H, W, C)``, contiguous: ``nn.Conv2d(C, C, K, padding=K // 2,
    groups=C)`` of the channels-first view, in autocast's dtype where it is on (as the conv's), else
    in ``x``'s; ``+ x`` in the promoted dtype. Differentiable in every tensor. Without autocast the
    weight and bias must have ``x``'s dtype, as ``nn.Conv2d`` requires. ``backend``: as in
    :func:`ppma.ops.select_backend`.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 4 or 0 in x.shape:
        raise ValueError(f"x must be a floating-point (N, H, W, C) tensor with no empty dim, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    channels = x.shape[-1]
    if (not isinstance(weight, torch.Tensor) or weight.dim() != 4 or weight.shape[:2] != (channels, 1)
            or weight.shape[2] != weight.shape[3] or weight.shape[2] % 2 == 0):
        raise ValueError(f"weight must have shape (C, 1, K, K) with C={channels} and K odd, got "
                         f"{tuple(getattr(weight, 'shape', ()))}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (channels,)):
        raise ValueError(f"bias must be None or have shape ({channels},), got {tuple(getattr(bias, 'shape', ()))}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
        if t.dtype != x.dtype and autocast_dtype(x.device.type) is None:
            raise ValueError(f"{name} is {t.dtype} but x is {x.dtype}: without autocast they must match (as in nn.Conv2d)")
    return OP(x, weight, bias, bool(add_input), backend=select_backend("depthwise_conv", x.device, backend))
