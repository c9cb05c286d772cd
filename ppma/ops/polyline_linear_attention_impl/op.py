"""Public :func:`polyline_linear_attention`: the custom op ``ppma::polyline_linear_attention``,
registered below with its FLOP formula.

What each backend runs (none holds the whole grid's ``d x dv`` state):

- ``'torch'``: the chunked path (:mod:`.chunked`) with the blocked PyTorch scan;
- ``'cpu'`` (``auto`` on CPU tensors): :mod:`.cpu`, the quadratic form ``((q k^T) * L2D) v'`` on
  small grids, else the scans of the state as batched matmuls, strip by strip with the states
  carried across strips;
- ``'triton'`` (``auto`` on CUDA), fp32, fp16 and bf16: on grids of at most
  :data:`FUSED_FORWARD_MAX_TOKENS` tokens (2-D or 3-D; every stage of PPMA-linear-T at 224) the
  quadratic form ``((q k^T) * L2D) v'`` in the vanilla kind's fused forward kernel without the
  softmax (``ppma.kernels.polyline_attention.vanilla.linear_attention_quadratic_fwd``: one pass,
  both masks, O(N^2) work on tensor cores, O(N) memory); on larger 2-D grids the strip kernels of
  :mod:`ppma.kernels.polyline_linear_attention` (the chunked form of linear attention: tensor-core
  tiles inside row strips, per-column states between strips; :mod:`.tiled` is its PyTorch form);
  on larger 3-D grids and fp64, the chunked path with :func:`ppma.ops.polyline_scan`'s Triton
  kernel for the scans of every chunk.

Gradients: the ``'torch'`` backend's are the chunked path's own backward (it recomputes each
chunk's scans and backpropagates through them), reached by ``torch.func.vjp`` (the chunked
forward runs again first). The ``'cpu'`` and ``'triton'`` ones keep their forward's numerator
``num'`` (``(B * heads, *grid, dv + 1)`` fp32, O(N dv)) and start from it
(:func:`numerator_backward`). ``'triton'``: on grids of at most
:data:`FUSED_BACKWARD_MAX_TOKENS` tokens (every stage of PPMA-linear-T at 224) the quadratic
form's gradients in the vanilla kind's two fused backward passes without the softmax
(``ppma.kernels.polyline_attention.vanilla.linear_attention_quadratic_bwd``: O(N^2) work on
tensor cores, O(N) memory). ``'cpu'``: where the quadratic form costs less
(:func:`.cpu.quadratic_is_cheaper`: the last stages of the PPMA-linear backbones) that form
through its ``N x N`` mask in chunks (:mod:`.quadratic`, batched matmuls). Elsewhere the chunked
path's backward (:func:`.chunked.chunked_backward`). :mod:`.reference`, which forms every
token's state at once, is the oracle of the tests.
"""
from __future__ import annotations

import math

import torch

from ppma.kernels.common.runtime import triton_checks

from .._autocast import autocast_off
from .._checks import check_decays, check_grid_tensor
from ..polyline_scan_impl.op import FLOPS_PER_ELEMENT_AXIS_ORDER
from ..registry import Impl, Kernel, cpu_only, register, select_backend
from . import cpu
from .chunked import chunked_backward, chunked_forward, numerator_fake, polyline_linear_attention_chunked
from .export import polyline_linear_attention_export
from .quadratic import quadratic_backward
from .reference import polyline_linear_attention_reference


def _flops(q, k, v, log_alpha, log_beta, log_gamma, eps):
    """``{'scan': polyline_scan over the d*dv + d state channels, 'state': k (x) v,
    'contraction': q against the state (numerator and denominator), 'normalization': + eps and
    the division}``; ``N`` tokens per ``(B, head)``, ``d``/``dv`` channels of ``q``/``v``."""
    tokens, d, dv, axes = math.prod(q[:-1]), q[-1], v[-1], len(q) - 3
    return {
        "scan": tokens * (d * dv + d) * axes * 2 * FLOPS_PER_ELEMENT_AXIS_ORDER,
        "state": tokens * d * dv,
        "contraction": tokens * d * (dv + 1),
        "normalization": tokens * (dv + 1),
    }


def _backward_fake(grads, residuals, q, k, v, log_alpha, log_beta, log_gamma, eps):
    """Gradients with their inputs' strides (autograd's, through the chunked path)."""
    return [torch.empty_like(t) for t in (q, k, v, log_alpha, log_beta, log_gamma) if t is not None]


# Grids (tokens per image) up to which the 'triton' backend's backward is the fused quadratic
# passes (ppma.kernels.polyline_attention.vanilla.linear_attention_quadratic_bwd): O(N^2) work on
# tensor cores, O(N) memory, against the chunked backward's O(N) scans of d x dv' states per token.
# Stage 1 of PPMA-linear-T at 224 (3,136 tokens, batch 64) is about 0.56 TFLOP in the two passes
# and 10 G exponentials (a few ms on an H100, to be measured) against 100 ms measured for the
# chunked backward; the work grows as N^2, so far larger grids keep the chunked one.
FUSED_BACKWARD_MAX_TOKENS = 64 * 64
# Grids up to which the 'triton' backend's forward is the fused quadratic kernel
# (linear_attention_quadratic_fwd) rather than the strip kernels (2-D) or the chunked path (3-D).
# The cost model of kernels/bench/polyline_linear_attention.py, PPMA-linear-T at 224, batch 64:
# at stage 1, 0.21 TFLOP on tensor cores (padding included), 6.6 G exponentials and 0.18 GB
# through DRAM, against the strip kernels' 0.21 TFLOP and 1.9 GB; at stages 2 to 4, half the strip
# kernels' FLOPs (one q k^T for both masks) and 2.4x fewer bytes. The same bound as the
# backward's until a GPU places the crossover (its --op rows).
FUSED_FORWARD_MAX_TOKENS = 64 * 64


def _fused(limit: int, q, k, v) -> bool:
    """Whether the fused quadratic kernels serve these inputs: at most ``limit`` tokens per image,
    no fp64."""
    return math.prod(q.shape[2:-1]) <= limit and torch.float64 not in (q.dtype, k.dtype, v.dtype)


def _fused_backward(grad, num, q, k, v, log_alpha, log_beta, log_gamma, eps):
    """The fused quadratic passes on ``q``, ``k``, ``v`` in one dtype (their promotion), the
    gradients returned in each input's dtype."""
    from ppma.kernels.polyline_attention.vanilla import linear_attention_quadratic_bwd

    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    grads = linear_attention_quadratic_bwd(grad, num, q.to(dtype), k.to(dtype), v.to(dtype), log_alpha, log_beta,
                                           log_gamma, eps)
    return [g.to(t.dtype) for g, t in zip(grads, (q, k, v, log_alpha, log_beta, log_gamma))]


def _fused_forward(q, k, v, log_alpha, log_beta, log_gamma, eps):
    """``(out, num')`` by the fused quadratic forward kernel."""
    from ppma.kernels.polyline_attention.vanilla import linear_attention_quadratic_fwd

    return linear_attention_quadratic_fwd(q, k, v, log_alpha, log_beta, log_gamma, eps)


def _strip_forward(q, k, v, log_alpha, log_beta, eps):
    """``(out, num')`` by the strip kernels (2-D grids)."""
    from ppma.kernels.polyline_linear_attention import linear_attention_tiled_fwd

    with autocast_off(q.device.type):  # their strip states stay fp32 under autocast
        return linear_attention_tiled_fwd(q, k, v, log_alpha, log_beta, eps)


def numerator_backward(scan: str):
    """An :class:`~ppma.ops.registry.Impl`'s backward from the forward's numerator ``num'``.
    ``scan='triton'``: on grids of at most :data:`FUSED_BACKWARD_MAX_TOKENS` tokens (fp32, fp16,
    bf16) the fused quadratic passes (:func:`_fused_backward`); ``scan='blocked'`` (the CPU): the
    quadratic form in PyTorch (:func:`.quadratic.quadratic_backward`) where
    :func:`.cpu.quadratic_is_cheaper` says so for the grid. Elsewhere the chunked path's backward
    with ``scan``."""

    def backward(grads, residuals, q, k, v, log_alpha, log_beta, log_gamma, eps):
        args = (grads[0], residuals[0], q, k, v, log_alpha, log_beta, log_gamma, eps)
        if scan == "triton":
            if _fused(FUSED_BACKWARD_MAX_TOKENS, q, k, v):
                return _fused_backward(*args)
        elif cpu.quadratic_is_cheaper(tuple(q.shape[2:-1]), q.shape[-1], v.shape[-1] + 1):
            return quadratic_backward(*args)
        return chunked_backward(*args, scan=scan)

    return backward


def _load_cpu() -> Impl:
    """:func:`.cpu.forward` (chunks of the state, or the quadratic form on small grids), which
    keeps ``num'``, and :func:`numerator_backward` with the blocked PyTorch scan."""
    return Impl(cpu.forward, numerator_backward("blocked"), numerator_fake)


def _load_triton() -> Impl:
    """fp32/fp16/bf16 inputs on grids of at most :data:`FUSED_FORWARD_MAX_TOKENS` tokens: the fused
    quadratic forward kernel; larger 2-D grids: the strip kernels of
    :mod:`ppma.kernels.polyline_linear_attention`; larger 3-D grids and fp64: the chunked path with
    the Triton polyline scan. Each keeps its numerator ``num'``; the backward is
    :func:`numerator_backward` from it (the fused quadratic passes on grids of at most
    :data:`FUSED_BACKWARD_MAX_TOKENS` tokens, else the chunked path's with the Triton scan): no
    forward runs again."""

    def forward(q, k, v, log_alpha, log_beta, log_gamma, eps):
        if _fused(FUSED_FORWARD_MAX_TOKENS, q, k, v):
            out, num = _fused_forward(q, k, v, log_alpha, log_beta, log_gamma, eps)
        elif log_gamma is not None or torch.float64 in (q.dtype, k.dtype, v.dtype):
            out, num = chunked_forward(q, k, v, log_alpha, log_beta, log_gamma, eps, scan="triton")
        else:
            out, num = _strip_forward(q, k, v, log_alpha, log_beta, eps)
        return out, (num,)

    return Impl(forward, numerator_backward("triton"), numerator_fake)


OP = register(
    "polyline_linear_attention",
    arguments="Tensor q, Tensor k, Tensor v, Tensor log_alpha, Tensor log_beta, Tensor? log_gamma, float eps",
    reference=polyline_linear_attention_reference,
    torch=polyline_linear_attention_chunked,
    export=polyline_linear_attention_export,
    fake=lambda q, k, v, *rest: torch.empty_like(v),
    backward_fake=_backward_fake,
    flops=_flops,
    kernels=[
        Kernel("triton", load=_load_triton, **triton_checks(
            ("polyline_attention.vanilla", "polyline_attention.decays", "polyline_scan.decay_scan",
             "polyline_linear_attention.tiled"))),
        Kernel("cpu", cpu_only, _load_cpu),
    ],
)


def polyline_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    log_gamma: torch.Tensor | None = None,
    eps: float = 1e-6,
    backend: str | None = None,
) -> torch.Tensor:
    """Linear attention masked by the polyline path mask, O(N) (see :mod:`.reference`)::

        out_n = q_n^T (L2D (k (x) v))_n / (q_n . (L2D k)_n + eps)

    Shapes: ``q``, ``k`` ``(B, heads, H, W, d)``, non-negative features (apply the feature map,
    e.g. ``elu + 1``, first); ``v`` ``(B, heads, H, W, dv)``; decays ``(B, heads, H, W)`` ->
    ``(B, heads, H, W, dv)`` in ``v``'s dtype; 3-D grids with ``log_gamma``: ``(B, heads, T, H, W,
    .)`` and decays ``(B, heads, T, H, W)``. State and sums in fp32 (fp64 for fp64 inputs).
    Memory O(N (d + dv)) plus a bounded chunk of the state. Differentiable in every tensor.
    ``backend``: ``'torch'``, ``'cpu'``, ``'triton'`` or ``'auto'`` (default: ``PPMA_BACKEND``, else
    auto; see :func:`ppma.ops.select_backend`).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_grid_tensor(name, t, log_alpha, log_gamma)
    if k.shape != q.shape:
        raise ValueError(f"k has shape {tuple(k.shape)} but q has {tuple(q.shape)}")
    if v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"v has grid {tuple(v.shape[:-1])} but q has {tuple(q.shape[:-1])}")
    check_decays(log_alpha, log_beta, log_gamma, grid_shape=q.shape[:-1], x_name="q")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    chosen = select_backend("polyline_linear_attention", q.device, backend)
    return OP(q, k, v, log_alpha, log_beta, log_gamma, float(eps), backend=chosen)
