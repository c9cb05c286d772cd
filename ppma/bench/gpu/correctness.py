"""``auto`` against ``torch`` on whole models: relative errors of the output, the input gradient
and the worst parameter gradient, in fp32 (TF32 off), under bf16 and fp16 autocast, and at an odd
size at batch 1.

Under autocast, both backends are compared with the ``torch`` backend in fp32, and the ``torch``
backend's own error in that dtype is given beside ``auto``'s: the dtype's error, not the kernels'.
"""
from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ppma.kernels.common.accuracy import tensor_error as relative_error
from ppma.ops.registry import ENV_VAR

# fp32, TF32 off: the outputs and input gradients, then the parameter gradients (sums over the
# batch and every token, so their rounding differs more between two summation orders).
FP32_TOLERANCE = 1e-4
FP32_PARAM_TOLERANCE = 1e-3
# Under autocast: ``auto`` may be this many times the ``torch`` backend's own error in that dtype,
# and never needs to beat LOW_PRECISION_FLOOR.
LOW_PRECISION_FACTOR = 2.0
LOW_PRECISION_FLOOR = 1e-2
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BATCH = 2  # the batch of every case but the odd size's



@contextlib.contextmanager
def backend(name: str) -> Iterator[None]:
    """``PPMA_BACKEND=name`` inside the block, the previous value after it."""
    previous = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = name
    try:
        yield
    finally:
        if previous is None:
            del os.environ[ENV_VAR]
        else:
            os.environ[ENV_VAR] = previous


@contextlib.contextmanager
def tf32_disabled() -> Iterator[None]:
    """CUDA matmuls and convolutions in full fp32 inside the block."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@dataclass
class Run:
    """One forward and backward: the output (features flattened and concatenated), the input's
    gradient, and each parameter's gradient by name."""

    out: torch.Tensor
    dx: torch.Tensor
    grads: dict[str, torch.Tensor]


def forward_backward(model: torch.nn.Module, x: torch.Tensor, backend_name: str,
                     dtype: torch.dtype | None = None) -> Run:
    """``model(x)`` on ``backend_name``, under ``dtype`` autocast (None: none), then the backward
    of a fixed random weighting of the output (the same weights on every call)."""
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    with backend(backend_name):
        with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            y = model(x)
        if isinstance(y, (list, tuple)):
            y = torch.cat([t.float().flatten() for t in y])
        weights = torch.randn(y.shape, generator=torch.Generator(y.device).manual_seed(1), device=y.device)
        (y.float() * weights).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return Run(y.detach().float(), x.grad.detach().clone(), grads)


@dataclass(frozen=True)
class Errors:
    """Relative errors of one run against a reference run (:func:`compare`)."""

    out: float
    dx: float
    dparam: float
    dparam_name: str
    finite: bool
    missing: tuple[str, ...]  # parameters with a gradient in one run only

    def within(self, out_dx: float, dparam: float) -> bool:
        """Finite, the same parameters with gradients, and errors at most these bounds."""
        return (self.finite and not self.missing and self.out <= out_dx and self.dx <= out_dx
                and self.dparam <= dparam)


def compare(run: Run, reference: Run) -> Errors:
    """The errors of ``run`` against ``reference``; the worst parameter gradient by relative error."""
    shared = [n for n in reference.grads if n in run.grads]
    worst = max(((relative_error(run.grads[n], reference.grads[n]), n) for n in shared),
                key=lambda pair: math.inf if math.isnan(pair[0]) else pair[0], default=(0.0, ""))
    tensors = [run.out, run.dx, *run.grads.values()]
    return Errors(out=relative_error(run.out, reference.out), dx=relative_error(run.dx, reference.dx),
                  dparam=worst[0], dparam_name=worst[1], finite=all(bool(torch.isfinite(t).all()) for t in tensors),
                  missing=tuple(sorted(set(run.grads) ^ set(reference.grads))))


@dataclass(frozen=True)
class Row:
    """One correctness case of one preset: ``auto``'s errors and, under autocast, the ``torch``
    backend's own errors in that dtype (``baseline``); both against the ``torch`` backend."""

    preset: str
    case: str
    errors: Errors
    baseline: Errors | None = None

    @property
    def ok(self) -> bool:
        """Within the tolerance of its case (see the module's constants)."""
        if self.baseline is None:
            return self.errors.within(FP32_TOLERANCE, FP32_PARAM_TOLERANCE)

        def bound(own: float) -> float:
            return max(LOW_PRECISION_FACTOR * own, LOW_PRECISION_FLOOR) if math.isfinite(own) else LOW_PRECISION_FLOOR

        e, b = self.errors, self.baseline
        return (e.finite and not e.missing and e.out <= bound(b.out) and e.dx <= bound(b.dx)
                and e.dparam <= bound(b.dparam))


def odd_size(height: int, width: int) -> tuple[int, int]:
    """An odd, non-square input size near ``(height, width)``: the masks and tails of every kernel."""
    return height + 9, width + 7


def check_preset(name: str, device: torch.device, size: tuple[int, int], batch: int = BATCH) -> Iterator[Row]:
    """The cases of timm preset ``name`` at ``size`` ``(H, W)``, one :class:`Row` at a time: fp32,
    bf16, fp16, then fp32 at :func:`odd_size`, batch 1. fp32 runs with TF32 off."""
    import timm

    import ppma.models  # noqa: F401  (registers the presets)

    torch.manual_seed(0)
    model = timm.create_model(name).to(device).eval()
    height, width = size
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(batch, 3, height, width, generator=generator, device=device)
    with tf32_disabled():
        reference = forward_backward(model, x, "torch")
        yield Row(name, f"fp32 {height}x{width}, batch {batch}", compare(forward_backward(model, x, "auto"), reference))
        for label, dtype in DTYPES.items():
            own = compare(forward_backward(model, x, "torch", dtype), reference)
            yield Row(name, f"{label} autocast", compare(forward_backward(model, x, "auto", dtype), reference), own)
        odd = odd_size(height, width)
        x = torch.randn(1, 3, *odd, generator=generator, device=device)
        errors = compare(forward_backward(model, x, "auto"), forward_backward(model, x, "torch"))
        yield Row(name, f"fp32 {odd[0]}x{odd[1]}, batch 1", errors)
