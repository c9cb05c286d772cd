"""Linear polyline attention without the per-token ``d x dv`` state of the whole grid.

The scan of :mod:`.reference` is linear and acts on every channel alone, and channel ``(i, j)``
of the state is ``k_i v'_j`` with ``v' = [v, 1]`` (the last column gives the denominator). So

    num'_n = sum_i q_i(n) [L2D (k_i v')]_n,     out = num'[:dv] / (num'[dv] + eps)

is accumulated over chunks of key features ``i`` (and of ``B * heads``): each chunk forms its
``c * (dv + 1)`` state channels, scans them and contracts them with ``q`` at once. Scans
(``scan``): ``'blocked'``, the plain-PyTorch :mod:`.blocked_scan` (decay factors built once per
row chunk); ``'triton'``, the ``'triton'`` kernel of ``polyline_scan``, taken from the registry
(its forward once, then its backward, per chunk in the backward). At most
:data:`CHUNK_ELEMENTS` state elements exist at a time (:data:`GPU_CHUNK_ELEMENTS` on a GPU);
forward and backward keep nothing per chunk. The backward recomputes each chunk's scan and
backpropagates through it (``dq_i = gnum' . y_i``, ``dk_i = dx_i . v'``, ``dv' = sum_i dx_i
k_i``, decay gradients summed over chunks), with
``gnum' = [g / (den + eps), -(g . out) / (den + eps)]`` for the output gradient ``g``. State and
sums are fp32 (fp64 for fp64 inputs) whatever the input dtype.
"""
from __future__ import annotations

import torch

from .._autocast import autocast_off
from ..polyline_attention_impl.reference import _at_least_fp32
from ..polyline_scan_impl import op as _polyline_scan  # noqa: F401  (registers the op the triton path runs)
from ..registry import Impl, get_op, implementation
from .blocked_scan import FACTORS_PER_AXIS, path_scans, scan_factors

# Most state elements one chunk forms, on the CPU: 2^22 (fp32: 16 MB, near the caches). The
# backward's peak is 9-12 tensors of a chunk's state (kernels/bench/polyline_linear_attention.py
# --chunks, which also counts its ops: a few hundred a chunk).
CHUNK_ELEMENTS = 2**22
# On a GPU: 2^25 (128 MiB in fp32, a backward peak near 1.5 GiB). On the H100 a chunk of 2^22 took
# 1.6-2.8 ms of the backward whatever its shape (docs/benchmarks.md): chunks of the CPU's size
# leave the GPU waiting on the host.
GPU_CHUNK_ELEMENTS = 2**25


def chunk_elements(device: torch.device) -> int:
    """The default ``budget`` on ``device``: :data:`CHUNK_ELEMENTS` on the CPU, else
    :data:`GPU_CHUNK_ELEMENTS`."""
    return CHUNK_ELEMENTS if device.type == "cpu" else GPU_CHUNK_ELEMENTS


def _chunks(bh: int, n: int, d: int, dv1: int, budget: int):
    """``(rows, [features, ...])``: slices of ``B * heads`` and, per row slice, of the ``d`` key
    features, with at most ``budget`` state elements a chunk (one feature of one row at least),
    as even as their count allows."""
    per_feature = n * dv1
    width = max(1, min(d, budget // per_feature))
    rows = max(1, min(bh, budget // (per_feature * d))) if width == d else 1
    width, rows = -(-d // -(-d // width)), -(-bh // -(-bh // rows))  # the same counts, evened out
    features = [slice(i, i + width) for i in range(0, d, width)]
    return [(slice(r, r + rows), features) for r in range(0, bh, rows)]


def output_from_numerator(num: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """``out = num'[..., :dv] / (num'[..., dv] + eps)`` in ``dtype``, for ``num'`` ``(..., dv + 1)``."""
    return (num[..., :-1] / (num[..., -1:] + eps)).to(dtype)


def _state(k: torch.Tensor, vp: torch.Tensor, rows: slice, features: slice) -> torch.Tensor:
    """State channels ``k_i v'`` of one chunk: ``(rows, *grid, c * (dv + 1))``."""
    return (k[rows, ..., features, None] * vp[rows, ..., None, :]).flatten(-2)


def _factors(scan: str, decays) -> list[torch.Tensor]:
    """What the scans of one row chunk need from its decays ``(log_alpha, log_beta, log_gamma or
    None)``: the decays themselves (Triton), or the blocked scan's factors (flat list)."""
    if scan == "triton":
        return _present(decays)
    return sum(scan_factors(*decays), [])


def _kernel_args(x: torch.Tensor, factors: list[torch.Tensor]):
    """Arguments of the Triton scan (``order='both'``) for ``x`` ``(rows, *grid, C)``."""
    decays = [f.unsqueeze(1) for f in factors] + [None] * (3 - len(factors))
    return x.unsqueeze(1), decays[0], decays[1], "both", decays[2]


def _scan_kernel() -> Impl:
    """The ``'triton'`` :class:`~ppma.ops.registry.Impl` of ``polyline_scan``, from the registry (which caches it)."""
    return implementation(get_op("polyline_scan"), "triton")


def _paths(scan: str, x: torch.Tensor, factors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Tensors that sum to ``L2D x`` for ``x`` ``(rows, *grid, C)``."""
    if scan == "triton":
        return [_scan_kernel().forward(*_kernel_args(x, factors))[0].squeeze(1)]
    return path_scans(x, [factors[i : i + FACTORS_PER_AXIS] for i in range(0, len(factors), FACTORS_PER_AXIS)])


def _paths_vjp(scan: str, x: torch.Tensor, factors: list[torch.Tensor], grad: torch.Tensor):
    """``(paths, dx, dfactors)``: :func:`_paths` and its gradients for ``grad`` on their sum."""
    if scan == "triton":
        impl, args = _scan_kernel(), _kernel_args(x, factors)
        y, residuals = impl.forward(*args)
        dx, *dfactors = impl.backward((grad.unsqueeze(1),), residuals, *args)
        return [y.squeeze(1)], dx.squeeze(1), [d.squeeze(1) for d in dfactors]
    paths, vjp = _vjp(lambda x, *factors: _paths(scan, x, list(factors)), x, *factors)
    dx, *dfactors = vjp([grad] * len(paths))
    return paths, dx, dfactors


def _factors_vjp(scan: str, decays):
    """``(factors, vjp)``: :func:`_factors` of ``decays`` ``(log_alpha, log_beta, log_gamma or
    None)`` and the map from gradients of the factors to those of the decays given (not None)."""
    present = _present(decays)
    if scan == "triton":  # the factors are the decays
        return present, list

    def factors_of(*tensors):
        given = iter(tensors)
        return _factors(scan, [None if t is None else next(given) for t in decays])

    return _vjp(factors_of, *present)


def _vjp(fn, *inputs):
    """``(outputs, vjp)``: ``fn(*inputs)`` (a list of tensors) and the map from gradients of the
    outputs to those of ``inputs`` (zeros where unused). By torch.autograd where it records (it
    keeps saved-tensor hooks working, e.g. for checkpointing); by torch.func inside a kernel's
    backward custom op, which runs below the autograd dispatch keys."""
    with torch.enable_grad():
        records = torch.ones((), requires_grad=True).mul(1).requires_grad
    if not records:
        return torch.func.vjp(fn, *inputs)
    leaves = [t.detach().requires_grad_() for t in inputs]
    with torch.enable_grad():
        outputs = fn(*leaves)

    def vjp(grads):
        found = torch.autograd.grad(outputs, leaves, grads, allow_unused=True)
        return [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, found)]

    return [o.detach() for o in outputs], vjp


def _contract(a: torch.Tensor, y: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """Per token, ``a (c) . y (c x dv')`` -> ``(dv')``, or with ``transposed``, ``y (c x dv') .
    a (dv')`` -> ``(c)``; ``y`` is ``(..., c * dv')`` as the scans give it."""
    if transposed:
        return (y.unflatten(-1, (-1, a.shape[-1])) @ a.unsqueeze(-1)).squeeze(-1)
    return (a.unsqueeze(-2) @ y.unflatten(-1, (a.shape[-1], -1))).squeeze(-2)


def numerator_gradient(grad: torch.Tensor, num: torch.Tensor, eps: float) -> torch.Tensor:
    """``gnum'`` ``(..., dv + 1)``: the gradient of the loss in ``num'`` for the output gradient
    ``grad`` ``(..., dv)`` (in ``num'``'s dtype), through ``out = num'[:dv] / (num'[dv] + eps)``."""
    r = 1.0 / (num[..., -1:] + eps)
    g = grad * r
    return torch.cat([g, -(g * num[..., :-1] * r).sum(-1, keepdim=True)], dim=-1)


def _with_ones(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``v' = [v, 1]`` in ``dtype``."""
    return torch.cat([v.to(dtype), v.new_ones(v.shape[:-1] + (1,), dtype=dtype)], dim=-1)


def _present(tensors):
    return [t for t in tensors if t is not None]


def _forward(q, k, v, log_alpha, log_beta, log_gamma, eps, budget, scan):
    """``(out, num')`` on ``(B * heads, *grid, .)`` tensors; ``num'`` ``(..., dv + 1)`` in the state's dtype."""
    acc, budget = _at_least_fp32(v).dtype, budget or chunk_elements(q.device)
    vp, k, q = _with_ones(v, acc), k.to(acc), q.to(acc)
    dv1 = vp.shape[-1]
    num = vp.new_zeros(vp.shape)
    for rows, feature_chunks in _chunks(q.shape[0], q[0, ..., 0].numel(), q.shape[-1], dv1, budget):
        factors = _factors(scan, [None if t is None else t[rows] for t in (log_alpha, log_beta, log_gamma)])
        for features in feature_chunks:
            for y in _paths(scan, _state(k, vp, rows, features), factors):
                num[rows] += _contract(q[rows, ..., features], y)
    return output_from_numerator(num, eps, v.dtype), num


def _backward(grad, num, q_in, k_in, v_in, log_alpha, log_beta, log_gamma, eps, budget, scan):
    """``(dq, dk, dv, dlog_alpha, dlog_beta, dlog_gamma or None)`` on ``(B * heads, *grid, .)``
    tensors, from the forward's ``num'`` and the output gradient ``grad``: each chunk's scans
    recomputed and backpropagated (no forward runs)."""
    acc, dv1, budget = num.dtype, num.shape[-1], budget or chunk_elements(q_in.device)
    vp, k, q = _with_ones(v_in, acc), k_in.to(acc), q_in.to(acc)
    gnum = numerator_gradient(grad.to(acc), num, eps)
    dq, dk, dvp = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(vp)
    ddecays = [None if t is None else torch.zeros_like(t) for t in (log_alpha, log_beta, log_gamma)]
    for rows, feature_chunks in _chunks(q.shape[0], q[0, ..., 0].numel(), q.shape[-1], dv1, budget):
        factors, factors_vjp = _factors_vjp(scan, [None if t is None else t[rows] for t in (log_alpha, log_beta, log_gamma)])
        dfactors = [torch.zeros_like(f) for f in factors]
        for features in feature_chunks:
            gy = (q[rows, ..., features, None] * gnum[rows, ..., None, :]).flatten(-2)
            paths, dx, df = _paths_vjp(scan, _state(k, vp, rows, features), factors, gy)
            dx = dx.unflatten(-1, (-1, dv1))
            dq[rows, ..., features] = sum(_contract(gnum[rows], y, transposed=True) for y in paths)
            dk[rows, ..., features] = (dx * vp[rows, ..., None, :]).sum(-1)
            dvp[rows] += (dx * k[rows, ..., features, None]).sum(-2)
            for total, part in zip(dfactors, df):
                total += part
        for total, part in zip(_present(ddecays), factors_vjp(dfactors)):
            total[rows] += part
    return (dq.to(q_in.dtype), dk.to(k_in.dtype), dvp[..., :-1].to(v_in.dtype), *ddecays)


class _ChunkedLinearAttention(torch.autograd.Function):
    """``(q, k, v, log_alpha, log_beta, log_gamma, eps, budget, scan) -> (out, num')`` on ``(B * heads,
    *grid, .)`` tensors; ``num'`` (``(..., dv + 1)``, not differentiable) is kept for the
    backward. ``setup_context`` style, so ``torch.func.vjp`` (the registry's torch backward) can
    run it."""

    @staticmethod
    def forward(q, k, v, log_alpha, log_beta, log_gamma, eps, budget, scan):
        return _forward(q, k, v, log_alpha, log_beta, log_gamma, eps, budget, scan)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, log_alpha, log_beta, log_gamma, ctx.eps, ctx.budget, ctx.scan = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(q, k, v, log_alpha, log_beta, log_gamma, output[1])

    @staticmethod
    def backward(ctx, grad, _):
        q, k, v, log_alpha, log_beta, log_gamma, num = ctx.saved_tensors
        return (*_backward(grad, num, q, k, v, log_alpha, log_beta, log_gamma, ctx.eps, ctx.budget, ctx.scan),
                None, None, None)


def _rows(t):
    """``(B, heads, *grid[, C])`` -> ``(B * heads, *grid[, C])``."""
    return None if t is None else t.flatten(0, 1)


def polyline_linear_attention_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    log_gamma: torch.Tensor | None = None,
    eps: float = 1e-6,
    budget: int | None = None,
    scan: str = "blocked",
) -> torch.Tensor:
    """Same contract as :func:`~.reference.polyline_linear_attention_reference`; at most
    ``budget`` state elements at a time (one key feature of one ``(batch, head)`` at least;
    default by device, :func:`chunk_elements`);
    ``scan``: ``'blocked'`` (PyTorch) or ``'triton'`` (:func:`ppma.ops.polyline_scan`'s kernel)."""
    with autocast_off(q.device.type):  # state and sums stay fp32 under autocast
        out, _ = _ChunkedLinearAttention.apply(
            _rows(q), _rows(k), _rows(v), _rows(log_alpha), _rows(log_beta), _rows(log_gamma), eps, budget, scan
        )
    return out.unflatten(0, v.shape[:2])


def chunked_forward(q, k, v, log_alpha, log_beta, log_gamma=None, eps=1e-6, budget=None, scan="blocked"):
    """``(out, num')``: :func:`polyline_linear_attention_chunked` without autograd and its
    numerator ``num'`` ``(B * heads, *grid, dv + 1)`` (fp32; fp64 for fp64 ``v``), which
    :func:`chunked_backward` takes."""
    with autocast_off(q.device.type):
        out, num = _forward(_rows(q), _rows(k), _rows(v), _rows(log_alpha), _rows(log_beta), _rows(log_gamma), eps,
                            budget, scan)
    return out.unflatten(0, v.shape[:2]), num


def numerator_fake(q, k, v, log_alpha, log_beta, log_gamma, eps):
    """The numerator ``num'`` that a forward keeps for :func:`chunked_backward`, as an empty tensor
    ``(B * heads, *grid, dv + 1)`` (an :class:`~ppma.ops.registry.Impl`'s ``residuals_fake``)."""
    return (torch.empty(v.shape[0] * v.shape[1], *v.shape[2:-1], v.shape[-1] + 1, dtype=_at_least_fp32(v).dtype,
                        device=v.device),)


def chunked_backward(grad, num, q, k, v, log_alpha, log_beta, log_gamma=None, eps=1e-6, budget=None,
                     scan="blocked") -> list[torch.Tensor]:
    """Gradients ``[dq, dk, dv, dlog_alpha, dlog_beta(, dlog_gamma)]`` of the op for the output
    gradient ``grad`` ``(B, heads, *grid, dv)``, from the forward's numerator ``num'`` (any path's:
    :func:`chunked_forward`'s, the Triton strip kernels'), with the chunked path's backward: no
    forward runs."""
    with autocast_off(q.device.type):
        grads = _backward(_rows(grad), num, _rows(q), _rows(k), _rows(v), _rows(log_alpha), _rows(log_beta),
                          _rows(log_gamma), eps, budget, scan)
    return [g.unflatten(0, v.shape[:2]) for g in grads if g is not None]
