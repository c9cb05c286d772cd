"""The backward of linear polyline attention in its quadratic form, for small grids. PyTorch, any
device.

With ``v' = [v, 1]``, the numerator is ``num' = ((q k^T) * L2D) v'`` with the grid's ``N x N``
mask ``L2D = V2H + H2V`` (:func:`dense_numerator`: each path the product of the 1-D masks
``exp(-|G_p - G_q|)`` of its axes, built from segment sums of the log decays). Its gradients are
those of autograd through that product, by ``torch.func.vjp``, for a chunk of ``(batch, head)``
rows at a time: ``dv' = W^T gnum`` and ``dW = gnum v'^T`` with ``W = (q k^T) * L2D``, ``dq``,
``dk`` from ``dW * L2D``, the decays' from ``dW * (q k^T)`` reduced onto the 1-D masks. Every
step is a batched matmul or an elementwise pass over ``N x N``; no per-token ``d x dv'`` state
is formed. Per token ``N (3 d + 2 dv')`` multiply-adds against the chunked backward's scans of
``d * dv'`` channels, so it is the ``'cpu'`` backend's backward on the grids where the quadratic
forward is the cheaper (:func:`.cpu.quadratic_is_cheaper`): the last stages of the PPMA-linear
backbones. (On a GPU the ``'triton'`` backend runs the same gradients in fused kernels, which
store nothing ``N x N``; this form is the benchmark's column beside them.) At most ``budget``
mask elements a chunk (one row at least); autograd keeps about nine tensors of that size.
"""
from __future__ import annotations

import math

import torch

from .._autocast import autocast_off
from ..polyline_mask_impl.reference import polyline_mask_1d
from .chunked import _with_ones, numerator_gradient
from .cpu import _laid_out, _path_factor

# Mask elements a chunk: on the CPU as many as its forward's scratch holds (cache-sized); on a GPU
# 2^24, 64 MiB a tensor in fp32, of which the backward keeps about nine at its peak (near 0.6 GiB;
# kernels/bench/polyline_linear_attention.py --chunks), and enough rows for full-size batched
# matmuls (27 of PPMA-linear-T's stage 2 at 224).
CHUNK_ELEMENTS = 1 << 20
GPU_CHUNK_ELEMENTS = 1 << 24


def dense_numerator(q: torch.Tensor, k: torch.Tensor, vp: torch.Tensor, decays: list[torch.Tensor]) -> torch.Tensor:
    """``num' = ((q k^T) * L2D) v'``, differentiable: ``q``, ``k`` ``(rows, *grid, d)``, ``vp``
    ``(rows, *grid, dv')``, ``decays[a]`` ``(rows, *grid)`` the log decays along grid axis ``a``
    ((T,) H, W) -> ``(rows, *grid, dv')``."""
    grid = q.shape[1:-1]
    dims, n = len(grid), math.prod(grid)
    masks = [polyline_mask_1d(_laid_out(ld, a, dims)) for a, ld in enumerate(decays)]
    l2d = 0
    for h2v in (False, True):
        factors = [_path_factor(m, a, dims, h2v) for a, m in enumerate(masks)]
        l2d = l2d + math.prod(factors[1:], start=factors[0])
    q, k, v = (t.flatten(1, -2) for t in (q, k, vp))
    return (((q @ k.mT) * l2d.reshape(-1, n, n)) @ v).view(vp.shape)


def quadratic_backward(grad, num, q, k, v, log_alpha, log_beta, log_gamma=None, eps=1e-6, budget=None):
    """Gradients ``[dq, dk, dv, dlog_alpha, dlog_beta(, dlog_gamma)]`` of the op for the output
    gradient ``grad`` ``(B, heads, *grid, dv)``, from the forward's numerator ``num'`` ``(B * heads,
    *grid, dv + 1)`` (any path's), through :func:`dense_numerator`; ``budget``: mask elements a
    chunk (default: :data:`CHUNK_ELEMENTS` on the CPU, :data:`GPU_CHUNK_ELEMENTS` on a GPU)."""
    budget = budget or (CHUNK_ELEMENTS if q.device.type == "cpu" else GPU_CHUNK_ELEMENTS)
    acc, batch = num.dtype, v.shape[:2]
    present = [t for t in (log_alpha, log_beta, log_gamma) if t is not None]
    with autocast_off(q.device.type):
        gnum = numerator_gradient(grad.flatten(0, 1).to(acc), num, eps)
        q_rows, k_rows = (t.flatten(0, 1).to(acc) for t in (q, k))
        vp = _with_ones(v.flatten(0, 1), acc)
        decays = [t.flatten(0, 1).to(acc) for t in present[::-1]]  # per grid axis: (T,) H, W
        grads = [torch.empty_like(t) for t in (q_rows, k_rows, vp, *decays)]
        step = max(1, budget // math.prod(q.shape[2:-1]) ** 2)
        for start in range(0, q_rows.shape[0], step):
            rows = slice(start, start + step)
            _, vjp = torch.func.vjp(dense_numerator, q_rows[rows], k_rows[rows], vp[rows], [t[rows] for t in decays])
            dq, dk, dvp, ddecays = vjp(gnum[rows])
            for total, part in zip(grads, (dq, dk, dvp, *ddecays)):
                total[rows] = part
    dq, dk, dvp, *ddecays = grads
    result = [dq.to(q.dtype), dk.to(k.dtype), dvp[..., :-1].to(v.dtype)]
    result += [g.to(t.dtype) for g, t in zip(ddecays[::-1], present)]
    return [g.unflatten(0, batch) for g in result]
