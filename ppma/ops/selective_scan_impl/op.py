"""Public :func:`selective_scan`: the custom op ``ppma::selective_scan``, registered below with its
Triton kernel (``ppma.kernels.selective_scan``) and its FLOP formula.

The op returns ``(y, last_state)``. Backends: ``'torch'`` runs the chunked PyTorch scan
(:mod:`.chunked`; its gradient by ``torch.func.vjp``), ``'cpu'`` (``auto`` on CPU tensors) the
time-major in-place scan of :mod:`.cpu` (same gradient as ``'torch'``), ``'triton'`` the kernels
(time tiles): the forward keeps the state at every tile start as its residual, so the backward
recomputes each tile in registers and does not scan again. The
sequential :mod:`.reference` is the oracle of the tests only: one Python step per time step is
too slow to train with.
"""
from __future__ import annotations

import torch

from ppma.kernels.common.runtime import triton_checks

from ..registry import Impl, Kernel, cpu_only, register, select_backend
from . import cpu
from .chunked import selective_scan_chunked
from .export import selective_scan_export
from .reference import selective_scan_reference

# Mamba's count per (batch, channel, state, step): discretization, recurrence and output sum
# (github.com/state-spaces/mamba/issues/110); the D skip and the z gate add one per output.
FLOPS_PER_STATE_STEP = 9


def selective_scan_flops(u, delta, A, B, C, D, z, delta_bias, delta_softplus, out_dtype):
    batch, dim, length = u
    terms = {"scan": FLOPS_PER_STATE_STEP * batch * dim * A[1] * length}
    if D is not None:
        terms["D"] = batch * dim * length
    if z is not None:
        terms["z"] = batch * dim * length
    return terms


def _fake(u, delta, A, B, C, D, z, delta_bias, delta_softplus, out_dtype):
    """``y`` ``(batch, dim, L)`` in ``out_dtype`` and the fp32 last state ``(batch, dim, N)``."""
    return u.new_empty(u.shape, dtype=out_dtype), u.new_empty(*u.shape[:2], A.shape[1], dtype=torch.float32)


def _load_triton() -> Impl:
    from ppma.kernels.selective_scan import selective_scan_bwd, selective_scan_fwd, tile_states_shape

    def forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus, out_dtype):
        y, last, tile_states = selective_scan_fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus, out_dtype)
        return (y, last), (tile_states,)

    def backward(grads, residuals, u, delta, A, B, C, D, z, delta_bias, delta_softplus, out_dtype):
        grads = selective_scan_bwd(*grads, residuals[0], u, delta, A, B, C, D, z, delta_bias, delta_softplus)
        return [g for g in grads if g is not None]

    def residuals_fake(u, delta, A, *rest):
        return (u.new_empty(tile_states_shape(u.shape, A.shape[1]), dtype=torch.float32),)

    return Impl(forward, backward, residuals_fake)


OP = register(
    "selective_scan",
    arguments=(
        "Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, Tensor? delta_bias, "
        "bool delta_softplus, ScalarType out_dtype"
    ),
    returns="(Tensor, Tensor)",
    reference=selective_scan_reference,
    torch=selective_scan_chunked,
    export=selective_scan_export,
    fake=_fake,
    flops=selective_scan_flops,
    kernels=[
        Kernel("triton", load=_load_triton, **triton_checks(("selective_scan.scan",))),
        Kernel("cpu", cpu_only, cpu.load),
    ],
)


def check_float(name: str, t, shape: tuple[int, ...] | None, layout: str, device) -> None:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {layout} = {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but u is on {device}")


def _check_inputs(u, delta, A, B, C, D, z, delta_bias, out_dtype) -> None:
    if not isinstance(u, torch.Tensor) or u.dim() != 3:
        raise ValueError(f"u must be a (batch, dim, L) tensor, got {getattr(u, 'shape', type(u).__name__)}")
    if u.numel() == 0:
        raise ValueError(f"u must not be empty, got shape {tuple(u.shape)}")
    batch, dim, length = u.shape
    check_float("u", u, None, "", u.device)
    check_float("delta", delta, (batch, dim, length), "(batch, dim, L)", u.device)
    if not isinstance(A, torch.Tensor) or A.dim() != 2 or A.shape[0] != dim or A.shape[1] == 0:
        raise ValueError(f"A must have shape (dim, N) with dim = {dim}, got {getattr(A, 'shape', A)}")
    check_float("A", A, None, "", u.device)
    n_state = A.shape[1]
    if not isinstance(B, torch.Tensor) or B.dim() not in (3, 4):
        raise ValueError(f"B must have shape (batch, N, L) or (batch, G, N, L), got {getattr(B, 'shape', B)}")
    groups = B.shape[1] if B.dim() == 4 else 1
    bc_shape = (batch, groups, n_state, length) if B.dim() == 4 else (batch, n_state, length)
    bc_layout = "(batch, G, N, L)" if B.dim() == 4 else "(batch, N, L)"
    check_float("B", B, bc_shape, bc_layout, u.device)
    check_float("C", C, bc_shape, bc_layout + " like B", u.device)
    if groups == 0 or dim % groups:
        raise ValueError(f"dim = {dim} must be a multiple of the number of B/C groups G = {groups}")
    for name, t, shape, layout in (("D", D, (dim,), "(dim,)"), ("z", z, (batch, dim, length), "(batch, dim, L)"),
                                   ("delta_bias", delta_bias, (dim,), "(dim,)")):
        if t is not None:
            check_float(name, t, shape, layout, u.device)
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise ValueError(f"out_dtype must be a floating-point dtype, got {out_dtype}")
    # Value checks need the data on the host; on CUDA they would stall every call.
    if A.device.type == "cpu" and not torch.compiler.is_compiling() and (A > 0).any():
        raise ValueError(f"A must be <= 0 (Mamba's A = -exp(A_log)), max is {A.max().item():.4g}")


def selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mamba's selective scan, with grouped B/C (VMamba runs its four routes as four groups).

    Shapes: ``u``, ``delta``, ``z``: ``(batch, dim, L)``; ``A``: ``(dim, N)``, ``<= 0``; ``B``,
    ``C``: ``(batch, N, L)`` or ``(batch, G, N, L)`` with ``dim % G == 0`` (channel ``c`` uses
    group ``c // (dim // G)``); ``D``, ``delta_bias``: ``(dim,)``. With ``dt = softplus(delta +
    delta_bias)`` (no softplus unless ``delta_softplus``):
    ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t``, ``y_t = C_t . h_t + D u_t``, times ``silu(z_t)``.
    State and sums in fp32 whatever the input dtypes; ``y`` in ``out_dtype`` (default
    ``u.dtype``). Returns ``y``, or ``(y, last_state)`` with ``last_state`` ``(batch, dim, N)`` fp32
    when ``return_last_state``. Differentiable in every tensor. ``backend``: ``'torch'``,
    ``'cpu'``, ``'triton'`` or ``'auto'`` (default: ``PPMA_BACKEND``, else auto).
    """
    out_dtype = out_dtype or getattr(u, "dtype", None)
    _check_inputs(u, delta, A, B, C, D, z, delta_bias, out_dtype)
    chosen = select_backend("selective_scan", u.device, backend)
    y, last_state = OP(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus), out_dtype, backend=chosen)
    return (y, last_state) if return_last_state else y
