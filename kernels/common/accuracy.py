"""What the benchmarks in ``kernels/bench/`` compare in the run they time: an implementation's
output (and gradients) against the fp32 reference on the same inputs."""
from __future__ import annotations

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


def relative_error(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """The largest ``max|got - want| / max|want|`` over the pairs (computed in fp64)."""
    if len(got) != len(want):
        raise ValueError(f"{len(got)} results against {len(want)} reference results")
    errors = [((g.double() - w.double()).abs().max() / w.double().abs().max().clamp_min(1e-30)).item()
              for g, w in zip(got, want)]
    return max(errors)
