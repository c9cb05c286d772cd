"""Public :func:`rotary_qk`: the custom op ``ppma::rotary_qk``, registered below with its Triton
kernel (``ppma.kernels.rotary_qk``) and its FLOP formula."""
from __future__ import annotations

import math

import torch

from ppma.kernels.common.runtime import triton_checks

from ..registry import Impl, Kernel, cpu_only, register, select_backend
from . import cpu
from .reference import rotary_qk_reference


def _flops(q, k, rotation, k_scale):
    """A complex product per channel pair of ``q`` and ``k`` (6 real FLOPs: 3 an element) and ``k``'s
    scaling (one an element), as the counter found in the layer's PyTorch ops."""
    return {"rotation": 3 * (math.prod(q) + math.prod(k)), "scale": math.prod(k)}


def _fake(q, k, rotation, k_scale):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=k.device)


def _load_triton() -> Impl:
    """The backward is the transposed rotation of the outputs' gradients: no residuals."""
    from ppma.kernels import rotary_qk

    def forward(*args):
        return rotary_qk.forward(*args), ()

    def backward(grads, residuals, *args):
        return rotary_qk.backward(*grads, *args)

    return Impl(forward, backward)


OP = register(
    "rotary_qk",
    arguments="Tensor q, Tensor k, Tensor rotation, float k_scale",
    returns="(Tensor, Tensor)",
    reference=rotary_qk_reference,
    fake=_fake,
    flops=_flops,
    kernels=[Kernel("triton", load=_load_triton, **triton_checks(("rotary_qk.rotate",))),
             Kernel("cpu", cpu_only, cpu.load)],
)


def rotary_qk(q: torch.Tensor, k: torch.Tensor, rotation: torch.Tensor, k_scale: float = 1.0,
              backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPMA's rotary embedding of ``q`` and ``k``, ``k`` scaled by ``k_scale`` first
    (:class:`ppma.layers.RasterRotaryEmbedding`).

    Shapes: ``q``, ``k`` ``(B, heads, *grid, d)``, same shape and dtype, any strides; ``rotation``
    fp32 ``(*grid, d // 2, 2)``, each token's ``(cos, sin)`` per channel pair -> ``(q_rot,
    k_rot)``, contiguous, in ``q``'s dtype; channel pair ``(2m, 2m+1)`` as a complex number times
    ``cos + i sin``, in fp32 (fp64 kept). Differentiable in ``q`` and ``k`` (the table is a
    constant: its gradient is zero). ``backend``: as in :func:`ppma.ops.select_backend`.
    """
    if not isinstance(q, torch.Tensor) or not q.is_floating_point():
        raise ValueError(f"q must be a floating-point tensor, got {getattr(q, 'dtype', type(q).__name__)}")
    if not isinstance(k, torch.Tensor) or k.shape != q.shape or k.dtype != q.dtype or k.device != q.device:
        raise ValueError(f"k must be a tensor like q {tuple(q.shape)} {q.dtype} on {q.device}, got "
                         f"{getattr(k, 'shape', type(k).__name__)}")
    if q.dim() < 4 or q.shape[-1] % 2:
        raise ValueError(f"q must have shape (B, heads, *grid, d) with an even d, got {tuple(q.shape)}")
    want = (*q.shape[2:-1], q.shape[-1] // 2, 2)
    if not isinstance(rotation, torch.Tensor) or rotation.dtype != torch.float32 or tuple(rotation.shape) != want \
            or rotation.device != q.device:
        raise ValueError(f"rotation must be an fp32 tensor of shape {want} on {q.device}, got "
                         f"{getattr(rotation, 'dtype', None)} {tuple(getattr(rotation, 'shape', ()))}")
    return OP(q, k, rotation, float(k_scale), backend=select_backend("rotary_qk", q.device, backend))
