"""Custom ops from registry entries: ``ppma::<name>`` and ``ppma::<name>_backward``.

The forward op runs the selected backend's :class:`~ppma.ops.registry.Impl` and returns a tensor
laid out as the op's fake implementation says (``torch.compile`` plans memory from it). Its
autograd saves the tensor arguments and, under the autocast state of the forward, computes the
gradients with the same backend:

- torch: the reference's own gradient, in the autograd formula itself: the reference is run
  again under ``torch.func.vjp`` (the forward keeps nothing but its inputs), so gradients are
  those of autograd through the reference, values and strides alike, and ``torch.compile``
  traces them as plain PyTorch;
- a kernel: the op ``ppma::<name>_backward`` (one node), whose fake is the kernel's
  ``backward_fake``.
"""
from __future__ import annotations

import functools

import torch


@functools.cache
def tensor_positions(name: str, arguments: str) -> tuple[int, ...]:
    """Positions of the ``Tensor`` / ``Tensor?`` arguments in ``arguments``."""
    schema = torch._C.parse_schema(f"ppma::{name}({arguments}) -> Tensor")
    return tuple(i for i, a in enumerate(schema.arguments) if str(a.type) in ("Tensor", "Optional[Tensor]"))


def _present(args, positions) -> list[int]:
    return [i for i in positions if args[i] is not None]


def _laid_out_like(out: torch.Tensor, expected: torch.Tensor, what: str) -> torch.Tensor:
    """``out``, copied into ``expected`` (a fresh tensor) when their strides differ."""
    if out.shape != expected.shape or out.dtype != expected.dtype:
        raise RuntimeError(
            f"{what} returned {tuple(out.shape)} {out.dtype}, its fake implementation says "
            f"{tuple(expected.shape)} {expected.dtype}"
        )
    return out if out.stride() == expected.stride() else expected.copy_(out)


def reference_backward(name, arguments, reference, grad, *args):
    """Gradients of ``reference(*args)`` for ``grad``, by ``torch.func.vjp`` (autocast as the caller's
    for the recomputed forward, off for the gradient itself, as in autograd)."""
    positions = _present(args, tensor_positions(name, arguments))

    def fn(*tensors):
        full = list(args)
        for i, t in zip(positions, tensors):
            full[i] = t
        return reference(*full)

    _, vjp_fn = torch.func.vjp(fn, *[args[i] for i in positions])
    with torch.autocast(grad.device.type, enabled=False):
        return list(vjp_fn(grad))


def define_custom_op(name: str, arguments: str, fake, impl_of):
    """Define ``ppma::<name>(<arguments>, str backend) -> Tensor`` with fake and autograd; returns it.

    ``impl_of(backend)`` gives the backend's :class:`~ppma.ops.registry.Impl` when the op runs.
    """
    positions = tensor_positions(name, arguments)

    def forward(*args):
        *op_args, backend = args
        out = impl_of(backend).forward(*op_args)
        return _laid_out_like(out, fake(*op_args), f"ppma::{name} ({backend})")

    def backward(grad, *args):
        *op_args, backend = args
        return impl_of(backend).backward(grad, *op_args)

    def backward_fake(grad, *args):
        *op_args, backend = args
        return impl_of(backend).backward_fake(grad, *op_args)

    op = torch.library.custom_op(
        f"ppma::{name}", forward, mutates_args=(), schema=f"({arguments}, str backend) -> Tensor"
    )
    op.register_fake(lambda *args: fake(*args[:-1]))
    backward_schema = f"(Tensor grad, {arguments}, str backend) -> Tensor[]"
    backward_op = torch.library.custom_op(f"ppma::{name}_backward", backward, mutates_args=(), schema=backward_schema)
    backward_op.register_fake(backward_fake)

    def setup_context(ctx, inputs, output):
        *op_args, ctx.backend = inputs
        ctx.present = _present(op_args, positions)
        ctx.others = [None if i in ctx.present else a for i, a in enumerate(op_args)]
        ctx.save_for_backward(*[op_args[i] for i in ctx.present])
        device_type = op_args[ctx.present[0]].device.type
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))

    def backward_formula(ctx, grad):
        args = list(ctx.others)
        for i, t in zip(ctx.present, ctx.saved_tensors):
            args[i] = t
        device_type, enabled, dtype = ctx.autocast
        with torch.autocast(device_type, dtype=dtype, enabled=enabled):
            if ctx.backend == "torch":
                grads = impl_of("torch").backward(grad, *args)
            else:
                grads = backward_op(grad, *args, ctx.backend)
        out = [None] * (len(args) + 1)
        for i, g in zip(ctx.present, grads):
            out[i] = g
        return tuple(out)

    op.register_autograd(backward_formula, setup_context=setup_context)
    return op
