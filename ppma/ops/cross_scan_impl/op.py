"""Public :func:`cross_scan`, :func:`cross_merge` and :func:`cross_selective_scan`: the custom ops
``ppma::cross_scan``, ``ppma::cross_merge`` and ``ppma::cross_selective_scan``, registered below.

``cross_scan`` / ``cross_merge`` are pure data movement: no kernel, 0 FLOPs; each one's gradient
is the other (they are adjoint), which the torch backend gets by ``torch.func.vjp``.
``cross_selective_scan`` is VMamba's SS2D core, the selective scan along the four routes with its
projections, the routes read from and merged back onto the map inside the op: its ``cpu`` kernel
(:mod:`.cpu`) scans the map in place of copies of the routes, its ``triton`` kernel runs the
selective-scan kernels along the routes straight from the map; the ``torch`` backend runs the reference with
the chunked scan (:func:`~ppma.ops.selective_scan_impl.chunked.selective_scan_chunked`), its export
form (:mod:`.export`) lays the routes out time-major once and runs the selective scan's export form.
"""
from __future__ import annotations

import functools

import torch

from ppma.kernels.common.runtime import triton_checks

from ..registry import Impl, Kernel, cpu_only, register, select_backend
from ..selective_scan_impl.chunked import selective_scan_chunked
from ..selective_scan_impl.op import check_float, selective_scan_flops
from . import cpu
from .export import cross_selective_scan_export
from .reference import ROUTES, cross_merge_reference, cross_scan_reference, cross_selective_scan_reference


def _no_flops(x):
    return {"copy": 0}


SCAN_OP = register(
    "cross_scan",
    arguments="Tensor x",
    reference=cross_scan_reference,
    fake=lambda x: x.new_empty(x.shape[0], ROUTES, x.shape[1], x.shape[2] * x.shape[3]),
    flops=_no_flops,
)
MERGE_OP = register(
    "cross_merge",
    arguments="Tensor y",
    reference=cross_merge_reference,
    fake=lambda y: y.new_empty(y.shape[0], *y.shape[2:]),
    flops=_no_flops,
)


def _map_projections(x, x_proj_weight, dt_projs_weight):
    """Route ``k``'s scan inputs at every position of the map ``x`` ``(batch, H, W, dim)``, in
    place of along its route: ``dts`` ``(batch, H, W, 4, dim)``, ``B``, ``C`` ``(batch, H, W, 4,
    N)`` (views of one projection); the projections of
    :func:`~ppma.ops.cross_scan_impl.reference.route_projections`."""
    rank = dt_projs_weight.shape[2]
    n_state = (x_proj_weight.shape[1] - rank) // 2
    dts, bs, cs = torch.einsum("bhwd,kcd->bhwkc", x, x_proj_weight).split([rank, n_state, n_state], dim=-1)
    return torch.einsum("bhwkr,kdr->bhwkd", dts, dt_projs_weight), bs, cs


def _load_triton() -> Impl:
    """The selective-scan kernels reading the routes straight from the map (their route
    positions: no permuted copy of the routes, :mod:`ppma.kernels.selective_scan.routes`), the
    projections computed on the map; the backward runs the scan's backward kernel and autograd
    (``torch.func.vjp``) through the projections."""
    from ppma.kernels.selective_scan import tile_states_shape
    from ppma.kernels.selective_scan.routes import cross_scan_bwd, cross_scan_fwd, route_tile

    def forward(x, x_proj_weight, dt_projs_weight, dt_projs_bias, A, D):
        dts, bs, cs = _map_projections(x, x_proj_weight, dt_projs_weight)
        y, tile_states = cross_scan_fwd(x, dts, bs, cs, A, D, dt_projs_bias.flatten())
        return y.sum(3), (tile_states,)

    def backward(grads, residuals, x, x_proj_weight, dt_projs_weight, dt_projs_bias, A, D):
        (dts, bs, cs), vjp = torch.func.vjp(_map_projections, x, x_proj_weight, dt_projs_weight)
        dx_routes, ddts, dB, dC, dA, dD, dbias = cross_scan_bwd(
            grads[0], residuals[0], x, dts, bs, cs, A, D, dt_projs_bias.flatten())
        dx, dx_proj, ddt_proj = vjp((ddts, dB.to(bs.dtype), dC.to(cs.dtype)))
        dx = dx + dx_routes.sum(3)
        grads = (dx, dx_proj, ddt_proj, dbias.view_as(dt_projs_bias), dA, dD)
        return [g.to(t.dtype).contiguous() for g, t in zip(grads, (x, x_proj_weight, dt_projs_weight,
                                                                    dt_projs_bias, A, D))]

    def residuals_fake(x, x_proj_weight, dt_projs_weight, dt_projs_bias, A, D):
        batch, height, width, dim = x.shape
        length = height * width
        shape = tile_states_shape((batch, ROUTES * dim, length), A.shape[1], route_tile(length, A.shape[1]))
        return (x.new_empty(shape, dtype=torch.float32),)

    return Impl(forward, backward, residuals_fake)


def _cross_selective_scan_flops(x, x_proj_weight, dt_projs_weight, dt_projs_bias, A, D):
    """The projections' multiply-adds and the selective scan's FLOPs over the four routes."""
    batch, height, width, dim = x
    tokens, rows, rank = batch * height * width, x_proj_weight[1], dt_projs_weight[2]
    scan = selective_scan_flops((batch, ROUTES * dim, height * width), None, A, None, None, D, None, None, True, None)
    return {"x_proj": tokens * ROUTES * rows * dim, "dt_proj": tokens * ROUTES * rank * dim, **scan}


SELECTIVE_OP = register(
    "cross_selective_scan",
    arguments="Tensor x, Tensor x_proj_weight, Tensor dt_projs_weight, Tensor dt_projs_bias, Tensor A, Tensor D",
    reference=cross_selective_scan_reference,
    torch=functools.partial(cross_selective_scan_reference, scan=selective_scan_chunked),
    export=cross_selective_scan_export,
    fake=lambda x, *rest: x.new_empty(x.shape, dtype=torch.float32),
    flops=_cross_selective_scan_flops,
    kernels=[
        Kernel("triton", load=_load_triton, **triton_checks(("selective_scan.scan",))),
        Kernel("cpu", cpu_only, cpu.load),
    ],
)


def cross_scan(x: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """VMamba's four routes: ``(B, C, H, W)`` -> ``(B, 4, C, H*W)``.

    Route 0 reads the map row-major, 1 column-major, 2 and 3 are 0 and 1 reversed.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a (B, C, H, W) tensor, got {getattr(x, 'shape', type(x).__name__)}")
    return SCAN_OP(x, backend=select_backend("cross_scan", x.device, backend))


def cross_merge(y: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """Adjoint of :func:`cross_scan`: ``(B, 4, C, H, W)`` -> ``(B, C, H, W)``, the four routes'
    sequences put back on the map and summed.

    ``y[:, k]`` is route ``k``'s sequence viewed as ``(H, W)``: pass the ``(B, 4, C, H*W)`` scan
    output as ``.view(B, 4, C, H, W)`` (the map's size cannot be read from ``H*W``).
    """
    if not isinstance(y, torch.Tensor) or y.dim() != 5 or y.shape[1] != ROUTES:
        raise ValueError(f"y must be a (B, 4, C, H, W) tensor, got {getattr(y, 'shape', type(y).__name__)}")
    return MERGE_OP(y, backend=select_backend("cross_merge", y.device, backend))


def cross_selective_scan(
    x: torch.Tensor,
    x_proj_weight: torch.Tensor,
    dt_projs_weight: torch.Tensor,
    dt_projs_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    backend: str | None = None,
) -> torch.Tensor:
    """VMamba's SS2D core on a channels-last map: its projections and the selective scan along
    the four routes, merged back onto the map (the routes are never copied on the CPU).

    Shapes: ``x`` ``(batch, H, W, dim)``; per route ``k``: ``x_proj_weight`` ``(4, R + 2N, dim)``,
    ``dt_projs_weight`` ``(4, dim, R)``, ``dt_projs_bias`` ``(4, dim)``; ``A`` ``(4 dim, N)``,
    ``<= 0``; ``D`` ``(4 dim,)``, as VMamba's parameters. Route ``k`` (0: row-major, 1:
    column-major, 2, 3: those reversed) reads ``x`` along its sequence, projects it to ``dt``
    (``R``, then ``dim`` channels), ``B``, ``C`` (``N``) and runs :func:`ppma.ops.selective_scan`
    (``dt = softplus(dt + dt_projs_bias[k])``); the four outputs are put back on the map and
    summed (:func:`~ppma.ops.cross_scan_impl.reference.cross_selective_scan_reference`). Returns fp32
    ``(batch, H, W, dim)``; differentiable in every tensor. ``backend``: ``'torch'``, ``'cpu'``,
    ``'triton'`` or ``'auto'`` (default: ``PPMA_BACKEND``, else auto).
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.numel() == 0:
        got = getattr(x, "shape", type(x).__name__)
        raise ValueError(f"x must be a non-empty (batch, H, W, dim) tensor, got {got}")
    check_float("x", x, None, "", x.device)
    dim = x.shape[3]
    if not isinstance(A, torch.Tensor) or A.dim() != 2 or A.shape[0] != ROUTES * dim or A.shape[1] == 0:
        raise ValueError(f"A must have shape (4 dim, N) with dim = {dim}, got {getattr(A, 'shape', A)}")
    n_state = A.shape[1]
    rank = dt_projs_weight.shape[-1] if isinstance(dt_projs_weight, torch.Tensor) else 0
    for name, t, shape, layout in (
        ("x_proj_weight", x_proj_weight, (ROUTES, rank + 2 * n_state, dim), "(4, R + 2N, dim)"),
        ("dt_projs_weight", dt_projs_weight, (ROUTES, dim, rank), "(4, dim, R)"),
        ("dt_projs_bias", dt_projs_bias, (ROUTES, dim), "(4, dim)"),
        ("A", A, None, ""),
        ("D", D, (ROUTES * dim,), "(4 dim,)"),
    ):
        check_float(name, t, shape, layout, x.device)
    # Value checks need the data on the host; on CUDA they would stall every call.
    if A.device.type == "cpu" and not torch.compiler.is_compiling() and (A > 0).any():
        raise ValueError(f"A must be <= 0 (Mamba's A = -exp(A_log)), max is {A.max().item():.4g}")
    chosen = select_backend("cross_selective_scan", x.device, backend)
    return SELECTIVE_OP(x, x_proj_weight, dt_projs_weight, dt_projs_bias, A, D, backend=chosen)
