"""The one place that knows every op: its reference, its backends, where they run, its FLOPs and
its export form.

An op registers itself once, in its own folder (``ppma/ops/<op>_impl/op.py``)::

    OP = register(
        "polyline_scan",
        arguments="Tensor x, Tensor log_alpha, Tensor log_beta, str order, Tensor? log_gamma",
        reference=polyline_scan_reference,          # plain PyTorch, what every backend is tested against
        fake=lambda x, *rest: torch.empty_like(x),  # output metadata (torch.compile, FLOP tracing)
        flops=polyline_scan_flops,                  # FLOP formula, terms by name
        kernels=[Kernel("triton", load=_load_triton, **triton_checks(("polyline_scan.decay_scan",)))],
    )

    def polyline_scan(x, log_alpha, log_beta, order="both", log_gamma=None, backend=None):
        ...  # input checks
        return OP(x, log_alpha, log_beta, order, log_gamma, backend=select_backend("polyline_scan", x.device, backend))

:func:`register` defines the ``torch.library`` custom op ``ppma::<name>`` (one node for
``torch.compile``, ``torch.export`` and FLOP tracing whatever backend runs) with its fake
implementation and its autograd (:mod:`._custom_op`). Backend selection, :func:`backend_report`,
the FLOP counter (:mod:`ppma.models.flops`) and :func:`export_decompositions` read the registry;
nothing else lists ops.

Each op has three plain-PyTorch forms: ``reference`` (the oracle of the tests, written for
clarity), ``torch`` (what the ``'torch'`` backend runs, e.g. a chunked form; the reference by
default) and ``export`` (plain ATen ops that ONNX can express; ``torch`` by default). Backends:
``'torch'`` (autograd through the ``torch`` form, by ``torch.func.vjp``) and the kernels'
(:data:`KERNEL_BACKENDS`). ``select_backend`` takes the ``backend`` argument, else the
environment variable ``PPMA_BACKEND=auto|torch|cpu|triton``; ``auto`` picks the first kernel that
runs natively on the device (never Triton's CPU interpreter), else ``torch``.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping, NamedTuple, Sequence

import torch

from ._custom_op import contiguous_like, define_custom_op, output_count, plain_eager, tensor_positions, torch_backward

BACKENDS = ("auto", "torch", "cpu", "triton")
KERNEL_BACKENDS = BACKENDS[2:]  # the backends that kernels register under
ENV_VAR = "PPMA_BACKEND"


class Impl(NamedTuple):
    """One backend's implementation of an op, called with the op's arguments (``backend`` left out).

    - ``forward(*args) -> (outputs, residuals)``: ``outputs`` a tensor (a tuple for an op with
      several), ``residuals`` a tuple of tensors that ``backward`` needs (log-sum-exps, chunk
      states), saved by autograd; they must not alias the inputs or outputs;
    - ``backward(grads, residuals, *args) -> list[Tensor]``: ``grads`` one tensor per output;
      returns the gradients of the tensor arguments that are not None, in argument order. With
      ``saves_outputs``, ``residuals`` is ``(*outputs, *residuals)``. None (a kernel without a
      backward of its own): the registry gives it the torch backward, autograd through
      the op's ``torch`` form by ``torch.func.vjp``;
    - ``residuals_fake(*args)``: the residuals as empty tensors (when there are any).

    The gradients' layout is the op's (:attr:`Op.backward_fake`), whatever the backend.
    """

    forward: Callable[..., tuple]
    backward: Callable[..., list] | None = None
    residuals_fake: Callable[..., tuple] = lambda *args: ()
    saves_outputs: bool = False


def _always(device: torch.device) -> bool:
    return True


def cpu_only(device: torch.device) -> str | None:
    """The ``unavailable`` of a CPU kernel: None on CPU tensors."""
    return None if torch.device(device).type == "cpu" else "the cpu backend runs on CPU tensors"


def _no_note(device: torch.device) -> None:
    return None


def _every_call(*arguments) -> bool:
    return True


@dataclass(frozen=True)
class Kernel:
    """A kernel of an op.

    ``backend``: its name (one of :data:`KERNEL_BACKENDS`); ``unavailable(device)``: None when it
    can run on ``device``, else the reason; ``load()``: imports it (only when selected) and returns
    its :class:`Impl`; ``auto(device)``: whether ``auto`` may pick it there (False where it only
    runs emulated, as Triton's CPU interpreter); ``configurations(device)``: a note on its launch
    configurations there (those pruned because they do not fit), None when there is nothing to say;
    ``auto_for(*arguments)``: whether ``auto`` picks it for one call, given the op's arguments with
    each tensor replaced by its shape (as :attr:`Op.flops` takes them): a measured per-shape rule,
    its docstring's first line says which (:func:`backend_report` shows it); default every call.
    """

    backend: str
    unavailable: Callable[[torch.device], str | None]
    load: Callable[[], Impl]
    auto: Callable[[torch.device], bool] = _always
    configurations: Callable[[torch.device], str | None] = _no_note
    auto_for: Callable[..., bool] = _every_call


@dataclass(frozen=True)
class Op:
    """A registered op; calling it runs the custom op ``ppma::<name>`` on a resolved backend.

    ``flops(*args) -> {term: FLOPs}``: the op's arguments with each tensor replaced by its shape
    (a tuple; None stays None). Convention: one multiply-add is one FLOP; elementwise ops and
    softmax one FLOP per output element. ``outputs``: how many tensors it returns.
    ``backward_fake(grads, residuals, *args)``: the gradients of the present tensor arguments as
    empty tensors with the strides every backend's backward gives them (a kernel's backward is the
    custom op ``ppma::<name>_backward`` and this its fake).
    """

    name: str
    arguments: str
    reference: Callable
    torch: Callable
    export: Callable
    fake: Callable
    backward_fake: Callable
    flops: Callable[..., Mapping[str, int]]
    kernels: tuple[Kernel, ...] = ()
    outputs: int = 1
    custom_op: Callable = field(default=None, repr=False, compare=False)
    eager: Callable = field(default=None, repr=False, compare=False)

    def __call__(self, *args, backend: str):
        """Run the custom op (its eager form for a plain eager call, :mod:`._custom_op`);
        ``backend`` is a resolved name (``'torch'`` or a kernel's). Returns a tensor, or a tuple
        for an op with several outputs. Residuals are kept only when autograd will need them (grad
        mode on, a tensor argument requiring grad, not exporting)."""
        keep = (
            torch.is_grad_enabled()
            and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
            and not torch.compiler.is_exporting()
        )
        run = self.eager if plain_eager(args) else self.custom_op
        outputs = run(*args, backend, keep)[: self.outputs]
        return outputs[0] if self.outputs == 1 else tuple(outputs)

    def kernel(self, backend: str) -> Kernel | None:
        return next((k for k in self.kernels if k.backend == backend), None)


_OPS: dict[str, Op] = {}


def register(
    name: str,
    *,
    arguments: str,
    reference: Callable,
    fake: Callable,
    flops: Callable[..., Mapping[str, int]],
    backward_fake: Callable | None = None,
    returns: str = "Tensor",
    torch: Callable | None = None,
    export: Callable | None = None,
    kernels: Sequence[Kernel] = (),
) -> Op:
    """Register op ``name`` and define its custom op ``ppma::<name>``; returns the :class:`Op`.

    ``arguments``: the op's arguments in ``torch.library`` schema syntax (``Tensor``,
    ``Tensor?``, ``str``, ``bool``, ``int``, ``float``, ``ScalarType``), in the order
    ``reference``, ``torch``, ``export``, ``fake``, ``flops`` and the kernels take them;
    ``returns``: ``"Tensor"`` or a tuple such as ``"(Tensor, Tensor)"``, what those functions
    return. ``torch``: the forward of the ``'torch'`` backend (default ``reference``); ``export``:
    the form :func:`export_decompositions` gives (default ``torch``). ``backward_fake``: the
    gradients' layout (:class:`Op`; default: contiguous, shaped and typed like the present tensor
    arguments).
    """
    if name in _OPS:
        raise ValueError(f"op {name!r} is already registered")
    for kernel in kernels:
        if kernel.backend not in KERNEL_BACKENDS:
            raise ValueError(f"op {name!r}: kernel backend {kernel.backend!r} is not one of {KERNEL_BACKENDS}")
    torch_forward = torch or reference
    outputs = output_count(returns)
    backward_fake = backward_fake or functools.partial(_contiguous_gradients, tensor_positions(name, arguments))
    custom_op, eager = define_custom_op(name, arguments, outputs, fake, backward_fake,
                                        lambda backend: implementation(get_op(name), backend))
    op = Op(name, arguments, reference, torch_forward, export or torch_forward, fake, backward_fake, flops,
            tuple(kernels), outputs, custom_op, eager)
    _OPS[name] = op
    return op


def _contiguous_gradients(positions, grads, residuals, *args) -> list:
    return contiguous_like(*[args[i] for i in positions])


def registered_ops() -> Mapping[str, Op]:
    """Every registered op by name (read-only)."""
    return MappingProxyType(_OPS)


def get_op(name: str) -> Op:
    if name not in _OPS:
        raise ValueError(f"unknown op {name!r}; registered: {sorted(_OPS)}")
    return _OPS[name]


_IMPLEMENTATIONS: dict[tuple[str, str], Impl] = {}


def implementation(op: Op, backend: str) -> Impl:
    """The :class:`Impl` of ``op`` for a resolved ``backend``, its ``backward`` filled in (a kernel
    without one gets the torch backward through the op's ``torch`` form). Built once per (op, backend)
    and cached; :func:`clear_implementations` drops the cache (e.g. after patching a kernel)."""
    key = (op.name, backend)
    if key not in _IMPLEMENTATIONS:
        _IMPLEMENTATIONS[key] = _build_implementation(op, backend)
    return _IMPLEMENTATIONS[key]


def clear_implementations() -> None:
    """Forget the cached implementations: the next call of each op loads its kernel again."""
    _IMPLEMENTATIONS.clear()


def _build_implementation(op: Op, backend: str) -> Impl:
    if backend == "torch":
        impl = Impl(lambda *args: (op.torch(*args), ()))
    else:
        kernel = op.kernel(backend)
        if kernel is None:
            raise RuntimeError(f"op '{op.name}' has no '{backend}' kernel")
        impl = kernel.load()
    if impl.backward is not None:
        return impl
    return impl._replace(backward=functools.partial(torch_backward, op.name, op.arguments, op.torch))


def export_decompositions() -> dict:
    """``{torch.ops.ppma.<name>.default: decomposition}`` for every op, for
    ``ExportedProgram.run_decompositions``: each ``ppma::<name>`` node becomes the op's ``export``
    form, whatever backend it was traced with. Export in inference (``torch.export`` does: the
    ops keep no residuals there)."""

    def decomposition(op: Op):
        def decompose(*args):
            *op_args, backend, keep_residuals = args
            if keep_residuals:
                raise RuntimeError(f"ppma::{op.name} was traced keeping residuals for autograd; export it "
                                   f"under torch.export (which keeps none) or torch.no_grad()")
            outputs = op.export(*op_args)
            return [outputs] if op.outputs == 1 else list(outputs)

        return decompose

    return {getattr(torch.ops.ppma, name).default: decomposition(op) for name, op in _OPS.items()}


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
def _candidates(op: str, device: torch.device | str, backend: str | None) -> tuple[str, ...]:
    """The backends :func:`select_backend` picks from, in order: the forced one alone, or ``auto``'s
    kernels that can run on ``device`` and whose ``auto(device)`` allows them, then ``'torch'``.
    The last one is taken when no earlier one's ``auto_for`` accepts the call. Under
    ``torch.compile`` it runs once, when compiling: the compiled graph keeps its answer."""
    name = requested_backend() if backend is None else backend
    if name not in BACKENDS:
        raise ValueError(f"backend={name!r} is not one of {BACKENDS}")
    entry, device = get_op(op), torch.device(device)
    if name == "torch":
        return ("torch",)
    if name != "auto":
        reason = _unavailable(entry, name, device)
        if reason is not None:
            raise RuntimeError(f"backend '{name}' was forced for {op} but is unavailable: {reason}")
        return (name,)
    usable = (k.backend for k in entry.kernels if k.unavailable(device) is None and k.auto(device))
    return (*usable, "torch")


def select_backend(op: str, device: torch.device | str, backend: str | None = None,
                   arguments: Sequence | None = None) -> str:
    """Resolve the backend of ``op`` on ``device``: the ``backend`` argument, else ``PPMA_BACKEND``.

    Returns ``'torch'`` or a kernel's backend name. ``auto``: the first kernel of the op that can
    run on ``device``, whose ``auto(device)`` allows it and, given ``arguments`` (the call's op
    arguments, tensors or their shapes), whose ``auto_for`` accepts them; else ``'torch'``. A
    forced backend is never overridden. Raises ``RuntimeError`` naming the reason when a kernel
    is forced but cannot run, ``ValueError`` for an unknown backend or op. Under
    ``torch.compile`` the device's part is decided once, when compiling; the per-shape rule is
    traced (guarded on the shapes).
    """
    *kernels, last = _candidates(op, device, backend)
    if not kernels or arguments is None:
        return kernels[0] if kernels else last
    shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in arguments]
    entry = get_op(op)
    return next((name for name in kernels if entry.kernel(name).auto_for(*shapes)), last)


def _first_line(fn: Callable) -> str:
    return (fn.__doc__ or fn.__name__).strip().splitlines()[0]


def backend_report(device: torch.device | str = "cpu") -> dict[str, dict[str, str]]:
    """Per registered op: the backend selected on ``device`` (``PPMA_BACKEND``, else auto; for
    calls its ``auto_for`` accepts) and, per kernel backend, ``'available'`` (followed by
    ``' (auto: <rule>)'`` for a kernel with a per-shape rule), ``'available (not picked by
    auto)'``, the reason it is not, or ``'no kernel'``; under ``'<backend> configurations'``, the
    kernel's note on its launch configurations on ``device`` when it has one (e.g. those pruned
    for lack of shared memory).

    >>> backend_report("cpu")["polyline_scan"]
    {'selected': 'torch', 'cpu': 'no kernel', 'triton': "Triton kernels run on CUDA tensors (or ...)"}
    """
    device = torch.device(device)
    report = {}
    for name, op in _OPS.items():
        try:
            selected = select_backend(name, device)
        except (RuntimeError, ValueError) as err:
            selected = f"error: {err}"
        row = {"selected": selected}
        for backend in KERNEL_BACKENDS:
            kernel = op.kernel(backend)
            reason = "no kernel" if kernel is None else kernel.unavailable(device)
            if reason is None:
                reason = "available" if kernel.auto(device) else "available (not picked by auto)"
                if kernel.auto(device) and kernel.auto_for is not _every_call:
                    reason += f" (auto: {_first_line(kernel.auto_for)})"
            row[backend] = reason
            note = kernel.configurations(device) if kernel is not None else None
            if note is not None:
                row[f"{backend} configurations"] = note
        report[name] = row
    return report
