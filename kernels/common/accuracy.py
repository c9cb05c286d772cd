"""What the benchmarks in ``kernels/bench/`` compare in the run they time: an implementation's
output (and gradients) against the fp32 reference on the same inputs."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch


def outcome(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor | None], grad: torch.Tensor,
            backward: bool) -> list[torch.Tensor]:
    """``[fn(*inputs)]``, then with ``backward`` the gradients of the tensor inputs that require
    grad for the output gradient ``grad``; detached."""
    out = fn(*inputs)
    if not backward:
        return [out.detach()]
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    return [out.detach(), *torch.autograd.grad(out, leaves, grad.to(out.dtype))]


def fp32_copies(inputs: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Leaf fp32 copies of ``inputs`` (fp64 stays fp64), requiring grad as the originals do."""
    return [t if t is None else t.detach().to(torch.promote_types(t.dtype, torch.float32)).requires_grad_(t.requires_grad)
            for t in inputs]


def tensor_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|``, computed in fp32.

    0 when they are equal (both all zeros included), ``inf`` when ``expected`` is all zeros and
    ``actual`` is not, ``nan`` when either holds a nan or an inf. ``ValueError`` when the shapes
    differ.
    """
    if actual.shape != expected.shape:
        raise ValueError(f"relative_error: shapes differ, {tuple(actual.shape)} vs {tuple(expected.shape)}")
    a, e = actual.detach().float(), expected.detach().float()
    if not (torch.isfinite(a).all() and torch.isfinite(e).all()):
        return math.nan
    if a.numel() == 0:
        return 0.0
    diff, scale = (a - e).abs().max().item(), e.abs().max().item()
    if diff == 0:
        return 0.0
    return diff / scale if scale > 0 else math.inf


def relative_error(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """The largest :func:`tensor_error` over the pairs (``nan`` when any is)."""
    if len(got) != len(want):
        raise ValueError(f"{len(got)} results against {len(want)} reference results")
    errors = [tensor_error(g, w) for g, w in zip(got, want)]
    return math.nan if any(math.isnan(e) for e in errors) else max(errors)
