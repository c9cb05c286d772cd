"""Custom ops from registry entries: ``ppma::<name>`` and ``ppma::<name>_backward``.

``ppma::<name>(<arguments>, str backend, bool keep_residuals) -> Tensor[]`` runs the selected
backend's :class:`~ppma.ops.registry.Impl` and returns the op's outputs, laid out as its fake
implementation says (``torch.compile`` plans memory from it), followed, when
``keep_residuals``, by the residuals the backend's backward needs. Its autograd saves the tensor
arguments and those residuals and, under the autocast state of the forward, computes the
gradients with the same backend:

- torch: autograd through the op's ``torch`` form, in the autograd formula itself: the form is
  run again under ``torch.func.vjp`` (it keeps no residuals), so gradients are those of autograd,
  values and strides alike, and ``torch.compile`` traces them as plain PyTorch;
- a kernel: the op ``ppma::<name>_backward`` (one node), whose fake is the op's
  ``backward_fake``.

Plain eager calls (:func:`plain_eager`: real tensors, nothing tracing, no dispatch mode, no
functorch transform) skip the dispatcher: :func:`define_custom_op` also gives an eager form that
runs the same forward, saves the same tensors and computes the same gradients in a
``torch.autograd.Function``. Through ``torch.library`` a call and its backward cost about 150
microseconds more host time (pytree flattening, the dispatcher's Python autograd:
``tools/op_overhead.py``); a host-bound training step makes dozens of them (docs/benchmarks.md).
"""
from __future__ import annotations

import functools

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ._autocast import autocast_as, autocast_dtype, autocast_off

# What the custom op appends to the op's own arguments.
APPENDED_ARGUMENTS = ("backend", "keep_residuals")


def contiguous_like(*tensors) -> list:
    """Fake gradients (a ``backward_fake``'s result): contiguous empty tensors shaped and typed like
    ``tensors``, the ``None`` ones skipped."""
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors if t is not None]


@functools.cache
def tensor_positions(name: str, arguments: str) -> tuple[int, ...]:
    """Positions of the ``Tensor`` / ``Tensor?`` arguments in ``arguments``."""
    schema = torch._C.parse_schema(f"ppma::{name}({arguments}) -> Tensor")
    return tuple(i for i, a in enumerate(schema.arguments) if str(a.type) in ("Tensor", "Optional[Tensor]"))


def output_count(returns: str) -> int:
    """How many tensors a schema's ``returns`` (``"Tensor"``, ``"(Tensor, Tensor)"``) names."""
    schema = torch._C.parse_schema(f"ppma::count() -> {returns}")
    if not schema.returns or any(str(r.type) != "Tensor" for r in schema.returns):
        raise ValueError(f"an op returns one or more tensors, got {returns!r}")
    return len(schema.returns)


def _present(args, positions) -> list[int]:
    return [i for i in positions if args[i] is not None]


def _as_tuple(outputs) -> tuple:
    return outputs if isinstance(outputs, (tuple, list)) else (outputs,)


def _laid_out_like(out: torch.Tensor, expected: torch.Tensor, what: str) -> torch.Tensor:
    """``out``, or, when its strides differ from ``expected``'s, a copy of it laid out as
    ``expected`` (into ``expected`` itself when it is a fresh tensor, not a meta one)."""
    if out.shape != expected.shape or out.dtype != expected.dtype:
        raise RuntimeError(
            f"{what} returned {tuple(out.shape)} {out.dtype}, its fake implementation says "
            f"{tuple(expected.shape)} {expected.dtype}"
        )
    if out.stride() == expected.stride():
        return out
    if expected.is_meta:
        expected = torch.empty_strided(out.shape, expected.stride(), dtype=out.dtype, device=out.device)
    return expected.copy_(out)


_TENSOR = object()  # marks a tensor in a :func:`_signature`


def _signature(value):
    """A hashable description of ``value``: every tensor (also inside lists and tuples) as its
    shape, strides and dtype; other values as they are."""
    if isinstance(value, torch.Tensor):
        return (_TENSOR, tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_signature(v) for v in value))
    return value


def _on_meta(signature):
    """The value a :func:`_signature` describes, with meta tensors of its shapes, strides and
    dtypes: fakes run on it allocate no memory."""
    if isinstance(signature, tuple) and signature and signature[0] is _TENSOR:
        _, shape, stride, dtype = signature
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    if isinstance(signature, tuple) and signature and signature[0] in (list, tuple):
        return signature[0](_on_meta(v) for v in signature[1])
    return signature


def torch_backward(name, arguments, forward, grads, residuals, *args):
    """Gradients of ``forward(*args)`` for ``grads`` (one per output), by ``torch.func.vjp``
    (autocast as the caller's for the recomputed forward, off for the gradient itself, as in
    autograd); ``residuals`` is empty: the torch backend recomputes."""
    positions = _present(args, tensor_positions(name, arguments))

    def fn(*tensors):
        full = list(args)
        for i, t in zip(positions, tensors):
            full[i] = t
        return _as_tuple(forward(*full))

    _, vjp_fn = torch.func.vjp(fn, *[args[i] for i in positions])
    with autocast_off(grads[0].device.type):
        return list(vjp_fn(tuple(grads)))


def define_custom_op(name: str, arguments: str, outputs: int, fake, gradients_fake, impl_of):
    """Define ``ppma::<name>(<arguments>, str backend, bool keep_residuals) -> Tensor[]`` with fake
    and autograd; returns it and its eager form (the same arguments; the op's outputs alone).
    ``outputs``: how many tensors ``fake`` and the forwards return;
    ``gradients_fake(grads, residuals, *args)``: the kernels' gradients as empty tensors.

    ``impl_of(backend)`` gives the backend's :class:`~ppma.ops.registry.Impl` when the op runs.
    """
    positions = tensor_positions(name, arguments)

    def forward(*args):
        *op_args, backend, keep = args
        impl = impl_of(backend)
        outs, residuals = impl.forward(*op_args)
        expected = _as_tuple(fake(*op_args))  # on the arguments: fakes read autocast's state for their device
        outs = [_laid_out_like(o, e, f"ppma::{name} ({backend})") for o, e in zip(_as_tuple(outs), expected)]
        return outs + (list(residuals) if keep else [])

    def forward_fake(*args):
        *op_args, backend, keep = args
        residuals = impl_of(backend).residuals_fake(*op_args) if keep else ()
        return list(_as_tuple(fake(*op_args))) + list(residuals)

    @functools.lru_cache(maxsize=64)
    def expected_gradients(signature) -> tuple:
        """The gradients ``gradients_fake`` gives, as meta tensors, for the arguments ``signature``
        describes: the fake runs once per layout of the arguments (meta tensors' factories run
        in Python, tens of microseconds each), not once per step."""
        return tuple(gradients_fake(*_on_meta(signature)))

    def backward(grads, residuals, *args):
        *op_args, backend = args
        result = impl_of(backend).backward(grads, residuals, *op_args)
        # laid out as the fake says: compiled backward graphs view the gradients with its strides
        expected = expected_gradients(_signature((grads, residuals, *op_args)))
        return [_laid_out_like(g, e, f"ppma::{name}_backward ({backend})") for g, e in zip(result, expected)]

    def backward_fake(grads, residuals, *args):
        *op_args, backend = args
        return gradients_fake(grads, residuals, *op_args)

    op = torch.library.custom_op(
        f"ppma::{name}", forward, mutates_args=(),
        schema=f"({arguments}, str backend, bool keep_residuals) -> Tensor[]",
    )
    op.register_fake(forward_fake)
    backward_schema = f"(Tensor[] grads, Tensor[] residuals, {arguments}, str backend) -> Tensor[]"
    backward_op = torch.library.custom_op(f"ppma::{name}_backward", backward, mutates_args=(), schema=backward_schema)
    backward_op.register_fake(backward_fake)

    def setup_context(ctx, inputs, output):
        *op_args, ctx.backend, keep = inputs
        ctx.present = _present(op_args, positions)
        ctx.others = [None if i in ctx.present else a for i, a in enumerate(op_args)]
        saves_outputs = keep and impl_of(ctx.backend).saves_outputs
        residuals = list(output) if saves_outputs else list(output[outputs:])
        ctx.residuals = len(residuals)
        ctx.save_for_backward(*residuals, *[op_args[i] for i in ctx.present])
        ctx.output_meta = [(o.shape, o.dtype, o.device) for o in output[:outputs]]
        device_type = op_args[ctx.present[0]].device.type
        ctx.autocast = (device_type, autocast_dtype(device_type))
        # the residuals' gradients are never read: None, not zero-filled tensors (a launch each)
        ctx.set_materialize_grads(False)
        ctx.eager = False

    def backward_formula(ctx, grads):
        saved = ctx.saved_tensors
        residuals, tensors = list(saved[: ctx.residuals]), saved[ctx.residuals :]
        args = list(ctx.others)
        for i, t in zip(ctx.present, tensors):
            args[i] = t
        # an output that took no part in the loss gets a zero gradient, as autograd materializes
        grads = [torch.zeros(shape, dtype=dtype, device=device) if g is None else g
                 for g, (shape, dtype, device) in zip(grads[:outputs], ctx.output_meta)]
        with autocast_as(*ctx.autocast):
            if ctx.backend == "torch":
                result = impl_of("torch").backward(grads, residuals, *args)
            else:  # the eager form calls the backward op's function itself, unless a graph of the
                # gradients is asked for (create_graph): the op, whose own gradient is undefined, says so
                direct = ctx.eager and not torch.is_grad_enabled()
                result = (backward if direct else backward_op)(grads, residuals, *args, ctx.backend)
        out = [None] * (len(args) + 2)
        for i, g in zip(ctx.present, result):
            out[i] = g
        return tuple(out)

    op.register_autograd(backward_formula, setup_context=setup_context)

    def eager_forward(ctx, *args):
        output = forward(*args)
        setup_context(ctx, args, output)
        ctx.eager = True
        return tuple(output[:outputs])

    def eager_backward(ctx, *grads):
        return backward_formula(ctx, grads)

    # the custom op's forward, saved tensors and backward formula without the dispatcher; named
    # for profiles and autograd graphs (ppma_<name>Backward)
    eager_function = type(f"ppma_{name}", (torch.autograd.Function,), {
        "forward": staticmethod(eager_forward), "backward": staticmethod(eager_backward)})

    def eager(*args):
        """``op(*args)``'s outputs (residuals left out) for a :func:`plain_eager` call."""
        *_, keep = args
        return eager_function.apply(*args) if keep else forward(*args)

    return op, eager


PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def plain_eager(args) -> bool:
    """Whether a call with ``args`` may run an op's eager form: real tensors of the plain types
    (no fake, meta or subclass), nothing compiling or tracing, no dispatch mode (op counters, the
    FLOP counter) and no functorch transform. Elsewhere the custom op runs, so that those see it."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or _get_current_dispatch_mode() is not None:
        return False
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    return all(type(a) in PLAIN_TENSORS and not a.is_meta for a in args if isinstance(a, torch.Tensor))
