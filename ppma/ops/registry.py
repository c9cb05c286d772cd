"""The one place that knows every op: its reference, its kernels, where they run, its FLOPs.

An op registers itself once, in its own folder (``ppma/ops/<op>/op.py``)::

    OP = register(
        "polyline_scan",
        arguments="Tensor x, Tensor log_alpha, Tensor log_beta, str order, Tensor? log_gamma",
        reference=polyline_scan_reference,          # plain PyTorch, what kernels are tested against
        fake=lambda x, *rest: torch.empty_like(x),  # output metadata (torch.compile, FLOP tracing)
        flops=polyline_scan_flops,                  # FLOP formula, terms by name
        kernels=[Kernel("triton", triton_unavailable_reason, _load_triton)],
    )

    def polyline_scan(x, log_alpha, log_beta, order="both", log_gamma=None, backend=None):
        ...  # input checks
        return OP(x, log_alpha, log_beta, order, log_gamma, backend=select_backend("polyline_scan", x.device, backend))

:func:`register` defines the ``torch.library`` custom op ``ppma::<name>`` (one node for
``torch.compile`` and FLOP tracing whatever backend runs) with its fake implementation and its
autograd (:mod:`._custom_op`). Backend selection, :func:`backend_report` and the FLOP counter
(:mod:`ppma.models.flops`) read the registry; nothing else lists ops.

Backends: ``'torch'`` (the reference; its gradient is the reference's, by ``torch.func.vjp``) and
the kernels' names (``'triton'``). ``select_backend`` takes the ``backend`` argument, else the
environment variable ``PPMA_BACKEND=auto|torch|triton``; ``auto`` picks the first kernel that can
run on the device, else ``torch``.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping, NamedTuple, Sequence

import torch

from ._custom_op import define_custom_op, reference_backward

BACKENDS = ("auto", "torch", "triton")
ENV_VAR = "PPMA_BACKEND"


class Impl(NamedTuple):
    """One backend's implementation of an op, called with the op's arguments (``backend`` left out).

    ``forward(*args) -> Tensor``; ``backward(grad, *args) -> list[Tensor]``: the gradients of the
    tensor arguments that are not None, in argument order; ``backward_fake(grad, *args)``: the
    same list as empty tensors with the strides ``backward`` gives (a kernel's backward is the
    custom op ``ppma::<name>_backward`` and this is its fake; the torch backend has none).
    """

    forward: Callable[..., torch.Tensor]
    backward: Callable[..., list]
    backward_fake: Callable[..., list] | None = None


@dataclass(frozen=True)
class Kernel:
    """A kernel of an op.

    ``backend``: its name (one of :data:`BACKENDS`, e.g. ``'triton'``); ``unavailable(device)``:
    None when it can run on ``device``, else the reason; ``load()``: imports it (only when
    selected) and returns its :class:`Impl`.
    """

    backend: str
    unavailable: Callable[[torch.device], str | None]
    load: Callable[[], Impl]


@dataclass(frozen=True)
class Op:
    """A registered op; calling it runs the custom op ``ppma::<name>`` on a resolved backend.

    ``flops(*args) -> {term: FLOPs}``: the op's arguments with each tensor replaced by its shape
    (a tuple; None stays None). Convention: one multiply-add is one FLOP; elementwise ops and
    softmax one FLOP per output element.
    """

    name: str
    arguments: str
    reference: Callable[..., torch.Tensor]
    fake: Callable[..., torch.Tensor]
    flops: Callable[..., Mapping[str, int]]
    kernels: tuple[Kernel, ...] = ()
    custom_op: Callable[..., torch.Tensor] = field(default=None, repr=False, compare=False)

    def __call__(self, *args, backend: str) -> torch.Tensor:
        """Run the custom op; ``backend`` is a resolved name (``'torch'`` or a kernel's)."""
        return self.custom_op(*args, backend)

    def kernel(self, backend: str) -> Kernel | None:
        return next((k for k in self.kernels if k.backend == backend), None)


_OPS: dict[str, Op] = {}


def register(
    name: str,
    *,
    arguments: str,
    reference: Callable[..., torch.Tensor],
    fake: Callable[..., torch.Tensor],
    flops: Callable[..., Mapping[str, int]],
    kernels: Sequence[Kernel] = (),
) -> Op:
    """Register op ``name`` and define its custom op ``ppma::<name>``; returns the :class:`Op`.

    ``arguments``: the op's arguments in ``torch.library`` schema syntax (``Tensor``,
    ``Tensor?``, ``str``, ``bool``, ``int``, ``float``), in the order ``reference``, ``fake``,
    ``flops`` and the kernels take them; the op returns one tensor. The custom op appends
    ``str backend``.
    """
    if name in _OPS:
        raise ValueError(f"op {name!r} is already registered")
    for kernel in kernels:
        if kernel.backend not in BACKENDS[2:]:
            raise ValueError(f"op {name!r}: kernel backend {kernel.backend!r} is not one of {BACKENDS[2:]}")
    custom_op = define_custom_op(name, arguments, fake, lambda backend: implementation(get_op(name), backend))
    op = Op(name, arguments, reference, fake, flops, tuple(kernels), custom_op)
    _OPS[name] = op
    return op


def registered_ops() -> Mapping[str, Op]:
    """Every registered op by name (read-only)."""
    return MappingProxyType(_OPS)


def get_op(name: str) -> Op:
    if name not in _OPS:
        raise ValueError(f"unknown op {name!r}; registered: {sorted(_OPS)}")
    return _OPS[name]


def implementation(op: Op, backend: str) -> Impl:
    """The :class:`Impl` of ``op`` for a resolved ``backend``."""
    if backend == "torch":
        return Impl(op.reference, functools.partial(reference_backward, op.name, op.arguments, op.reference))
    kernel = op.kernel(backend)
    if kernel is None:
        raise RuntimeError(f"op '{op.name}' has no '{backend}' kernel")
    return kernel.load()


def requested_backend() -> str:
    """The backend asked for through ``PPMA_BACKEND`` (``'auto'`` when unset)."""
    name = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if name not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={name!r} is not one of {BACKENDS}")
    return name


def _unavailable(op: Op, backend: str, device: torch.device) -> str | None:
    kernel = op.kernel(backend)
    if kernel is None:
        return f"op '{op.name}' has no '{backend}' kernel"
    return kernel.unavailable(device)


@torch.compiler.assume_constant_result
def select_backend(op: str, device: torch.device | str, backend: str | None = None) -> str:
    """Resolve the backend of ``op`` on ``device``: the ``backend`` argument, else ``PPMA_BACKEND``.

    Returns ``'torch'`` or a kernel's backend name. Raises ``RuntimeError`` naming the reason when
    a kernel is forced but cannot run, ``ValueError`` for an unknown backend or op. Under
    ``torch.compile`` it runs once, when compiling: the compiled graph keeps its answer.
    """
    name = requested_backend() if backend is None else backend
    if name not in BACKENDS:
        raise ValueError(f"backend={name!r} is not one of {BACKENDS}")
    entry, device = get_op(op), torch.device(device)
    if name == "torch":
        return "torch"
    if name != "auto":
        reason = _unavailable(entry, name, device)
        if reason is not None:
            raise RuntimeError(f"backend '{name}' was forced for {op} but is unavailable: {reason}")
        return name
    return next((k.backend for k in entry.kernels if k.unavailable(device) is None), "torch")


def backend_report(device: torch.device | str = "cpu") -> dict[str, dict[str, str]]:
    """Per registered op: the backend selected on ``device`` (``PPMA_BACKEND``, else auto) and,
    per kernel backend, ``'available'``, the reason it is not, or ``'no kernel'``.

    >>> backend_report("cpu")["polyline_scan"]
    {'selected': 'torch', 'triton': "Triton kernels run on CUDA tensors (or on CPU with ...)"}
    """
    device = torch.device(device)
    report = {}
    for name, op in _OPS.items():
        try:
            selected = select_backend(name, device)
        except (RuntimeError, ValueError) as err:
            selected = f"error: {err}"
        row = {"selected": selected}
        for backend in BACKENDS[2:]:
            kernel = op.kernel(backend)
            reason = "no kernel" if kernel is None else kernel.unavailable(device)
            row[backend] = "available" if reason is None else reason
        report[name] = row
    return report
