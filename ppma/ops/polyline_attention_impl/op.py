"""Public :func:`polyline_attention`: the custom op ``ppma::polyline_attention``, registered below
with its FLOP formula and its Triton kernels (``ppma.kernels.polyline_attention``: the mask is
computed per tile, nothing ``N x N`` is stored), the default on CUDA; the reference elsewhere.
``PPMA_BACKEND`` (or ``backend=``) forces either. ``auto`` routes the criss-cross kind with lines
too long for the whole-line kernels, on grids of at most :data:`CRISS_CROSS_TORCH_MAX_TOKENS`
tokens, to the torch path, which was faster there than the earlier tiled line kernels
(:func:`triton_auto_for`, the Triton kernel's per-shape rule in the registry). The FlexAttention
form of the vanilla kind (:mod:`.flex`) is a benchmark column, not a backend."""
from __future__ import annotations

import math

import torch

from ppma.kernels.common.runtime import triton_checks

from .._autocast import autocast_dtype, autocast_inputs
from .._checks import check_choice, check_decays, check_grid_tensor
from ..polyline_mask_impl.op import log_mask_flops
from ..registry import Impl, Kernel, cpu_only, register, select_backend
from . import cpu
from .reference import FORMS, KINDS, polyline_attention_reference

# Criss-cross grids (tokens per image) up to which ``auto`` takes the torch path when their lines
# are too long for the whole-line kernels (longer than 64 tokens). Measured on an H200, bf16, 8
# heads of 32 channels (docs/benchmarks.md), before the whole-line kernels: the tiled line
# kernels of then (on per-axis copies, their backward with atomics) ran at 0.78-0.91x the torch
# path's speed at 14x14 (batch 64), 32x32, 64x64 and 80x80, forward and forward+backward (one
# exception, 1.1x for the 64x64 forward), and 2.5x faster at 128x128 forward, where the torch
# path's forward+backward needs O(N^1.5) memory. The bound is the largest measured grid where they
# were slower; today's tiled kernels (in place, no atomics) are to be measured there.
CRISS_CROSS_TORCH_MAX_TOKENS = 80 * 80


def triton_auto_for(q, k, v, log_alpha, log_beta, log_gamma, kind, form) -> bool:
    """not the criss-cross kind with lines over 64 tokens on grids of at most 80 x 80 tokens

    The ``auto_for`` of the Triton kernel: ``q`` is its shape ``(B, heads, *grid, d)``. Lines of
    at most 64 tokens run the whole-line kernels, longer ones the tiled kernels, whose earlier form
    was slower than the torch path up to CRISS_CROSS_TORCH_MAX_TOKENS (called only where Triton is
    installed)."""
    from ppma.kernels.polyline_attention.whole_line import fits

    grid = q[2:-1]
    return not (kind == "criss_cross" and not fits(grid) and math.prod(grid) <= CRISS_CROSS_TORCH_MAX_TOKENS)


def _flops(q, k, v, log_alpha, log_beta, log_gamma, kind, form):
    """``{'products': q k^T and attention x v (multiply-adds), 'elementwise': masks, softmax,
    averaging (one per output element)}``; per ``(B, head)`` with ``N`` tokens, ``d``/``dv``
    channels of ``q``/``v``."""
    bh, grid, d, dv = math.prod(q[:2]), q[2:-1], q[-1], v[-1]
    n = math.prod(grid)
    if kind == "vanilla":
        products = n * n * (d + dv)
        # official: 2 mask adds, 2 softmax, 2 halvings, 1 sum; paper: exp, L + L^T, softmax, product
        elementwise = log_mask_flops(log_alpha) // bh + n * n * (7 if form == "official" else 4)
    else:  # per axis of length s: N/s lines of s x s weights, applied in both path orders
        products = sum(n * s * (d + 2 * dv) for s in grid)
        # per weight: 1-D log mask (2), softmax, and the mask add (official) or exp and product (paper)
        elementwise = sum(n * s * (4 if form == "official" else 5) for s in grid) + 3 * n * dv
    return {"products": bh * products, "elementwise": bh * elementwise}


def _fake(q, k, v, log_alpha, log_beta, log_gamma, kind, form):
    """Shaped like ``v``, in the dtype its product with the weights has (autocast's when on)."""
    autocast = autocast_dtype(v.device.type)
    return v.new_empty(v.shape, dtype=autocast if autocast is not None and v.dtype != torch.float64 else v.dtype)


def _load_triton() -> Impl:
    """The fused kernels. The vanilla kind keeps its softmax statistics (and, official form, the
    V2H output) as residuals and needs its output in the backward; the criss-cross kind keeps
    each path order's intermediate products (O(N C) memory)."""
    from ppma.kernels import polyline_attention as kernels
    from ppma.kernels.polyline_attention.criss_cross import residual_count
    from ppma.kernels.polyline_attention.vanilla import residual_shapes

    def forward(q, k, v, log_alpha, log_beta, log_gamma, kind, form):
        q, k, v = autocast_inputs(q, k, v)
        attend = kernels.vanilla_attention_fwd if kind == "vanilla" else kernels.criss_cross_attention_fwd
        return attend(q, k, v, log_alpha, log_beta, log_gamma, form)

    def backward(grads, residuals, q, k, v, log_alpha, log_beta, log_gamma, kind, form):
        out, *residuals = residuals
        grad, *qkv = autocast_inputs(grads[0], q, k, v)
        decays = (log_alpha, log_beta, log_gamma)
        if kind == "vanilla":
            grads = kernels.vanilla_attention_bwd(grad, out, residuals, *qkv, *decays, form)
        else:
            grads = kernels.criss_cross_attention_bwd(grad, *qkv, *decays, form, residuals)
        inputs = [t for t in (q, k, v, log_alpha, log_beta, log_gamma) if t is not None]
        return [g.to(t.dtype) for g, t in zip(grads, inputs)]

    def residuals_fake(q, k, v, log_alpha, log_beta, log_gamma, kind, form):
        if kind != "vanilla":  # like the output
            return tuple(_fake(q, k, v, log_alpha, log_beta, log_gamma, kind, form)
                         for _ in range(residual_count(q.shape[2:-1])))
        shapes = residual_shapes(q.shape, v.shape[-1], form)
        return tuple(q.new_empty(shape, dtype=torch.float32) for shape in shapes)

    return Impl(forward, backward, residuals_fake, saves_outputs=True)


OP = register(
    "polyline_attention",
    arguments="Tensor q, Tensor k, Tensor v, Tensor log_alpha, Tensor log_beta, Tensor? log_gamma, str kind, str form",
    reference=polyline_attention_reference,
    fake=_fake,
    flops=_flops,
    kernels=[
        Kernel("triton", load=_load_triton, auto_for=triton_auto_for,
               **triton_checks(("polyline_attention.vanilla", "polyline_attention.decays", "polyline_attention.line",
                                "polyline_attention.whole_line"))),
        Kernel("cpu", cpu_only, cpu.load),
    ],
)


def polyline_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    log_gamma: torch.Tensor | None = None,
    kind: str = "vanilla",
    form: str = "official",
    backend: str | None = None,
) -> torch.Tensor:
    """Attention masked by the polyline path mask (see :mod:`.reference` for the formulas).

    Shapes: ``q``, ``k`` ``(B, heads, H, W, d)``, ``v`` ``(B, heads, H, W, dv)``, decays
    ``(B, heads, H, W)`` -> ``(B, heads, H, W, dv)``; 3-D grids with ``log_gamma``: ``(B, heads,
    T, H, W, .)`` and decays ``(B, heads, T, H, W)``. The logits are ``q k^T`` as given.
    ``kind``: ``'vanilla'`` (O(N^2)) or ``'criss_cross'`` (O(N^1.5)); ``form``: ``'official'``
    (mask inside the softmax, the released weights) or ``'paper'``. Differentiable in every
    tensor. ``backend``: as in :func:`ppma.ops.select_backend` (``'triton'``: the fused kernels,
    fp32/fp16/bf16 ``q``, ``k``, ``v``; ``'torch'``: the reference); ``auto`` runs the criss-cross
    kind on small grids on the torch path (:func:`triton_auto_for`).
    """
    check_choice("kind", kind, KINDS)
    check_choice("form", form, FORMS)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_grid_tensor(name, t, log_alpha, log_gamma)
    if k.shape != q.shape:
        raise ValueError(f"k has shape {tuple(k.shape)} but q has {tuple(q.shape)}")
    check_decays(log_alpha, log_beta, log_gamma, grid_shape=q.shape[:-1], x_name="q")
    if v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"v has grid {tuple(v.shape[:-1])} but q has {tuple(q.shape[:-1])}")
    args = (q, k, v, log_alpha, log_beta, log_gamma, kind, form)
    return OP(*args, backend=select_backend("polyline_attention", q.device, backend, arguments=args))
