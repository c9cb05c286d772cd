"""What one training step dispatches: aten ops, copies and the bytes they move, optimizer tensors.

A step is ``loss = model(x).float().mean()``, ``loss.backward()``, ``optimizer.step()``,
``optimizer.zero_grad(set_to_none=True)``, with ``torch.optim.AdamW`` (``foreach=True``: one
multi-tensor op per update, as on CUDA by default). One warm-up step runs first (optimizer state,
cached tables), then one step is counted under a ``TorchDispatchMode``, which sees every aten op
after autograd: the forward's, the backward's and the optimizer's. A custom op of ``ppma.ops``
counts as one op (its body is not seen), as a Triton kernel would be one launch.

Counts are per step and nearly independent of the input size (they follow the number of layers),
so a small input on the CPU gives the numbers of a full-size step on any device, for the layer
arrangement that :mod:`ppma.layers.paths` picks (``paths=`` chooses it for the count).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import threading

import torch
from torch import nn
from torch.profiler import record_function
from torch.utils._python_dispatch import TorchDispatchMode

# The copies of the count: explicit copies, ``.contiguous()`` / ``.clone()``, dtype and
# device conversions (``.to``, autocast's casts).
COPY_OPS = ("aten::copy_", "aten::clone", "aten::_to_copy")
# Ops that allocate or describe memory without running a kernel.
NO_KERNEL_OPS = ("aten::empty", "aten::empty_like", "aten::empty_strided", "aten::empty_permuted",
                 "aten::detach", "aten::_local_scalar_dense", "aten::lift_fresh", "aten::promote_types")


@dataclasses.dataclass
class StepCount:
    """Per training step: ``ops`` every aten op dispatched; ``kernel_ops`` those that run a kernel
    (not views, not allocations); ``copies`` / ``copied_bytes`` the ops of :data:`COPY_OPS` and the
    bytes they write; ``optimizer_tensors`` the parameter tensors the optimizer updates;
    ``by_op`` the count of each op."""

    ops: int
    kernel_ops: int
    copies: int
    copied_bytes: int
    optimizer_tensors: int
    by_op: collections.Counter

    def row(self) -> str:
        return (f"{self.ops} ops ({self.kernel_ops} with a kernel), {self.copies} copies "
                f"({self.copied_bytes / 2**20:.2f} MiB), {self.optimizer_tensors} optimizer tensors")


def _written_bytes(out) -> int:
    tensors = out if isinstance(out, (tuple, list)) else (out,)
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _run_outside(func, args, kwargs):
    """``func(*args, **kwargs)`` in a fresh thread: a custom op's body (``torch.func`` transforms
    included, which fail under a Python dispatch mode) runs with none of this thread's modes."""
    result, grad_enabled = {}, torch.is_grad_enabled()

    def run():
        try:
            with torch.set_grad_enabled(grad_enabled):
                result["out"] = func(*args, **(kwargs or {}))
        except Exception as err:  # re-raised in the caller's thread
            result["error"] = err

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["out"]


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside it (``by_op``, ``kernel_ops``, ``copies``, ``copied_bytes``)."""

    def __init__(self):
        super().__init__()
        self.by_op = collections.Counter()
        self.kernel_ops = self.copies = self.copied_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {})) if func.namespace == "aten" else _run_outside(func, args, kwargs)
        name = func.name().split(".")[0]
        self.by_op[name] += 1
        if not func.is_view and name not in NO_KERNEL_OPS:
            self.kernel_ops += 1
        if name in COPY_OPS:
            self.copies += 1
            self.copied_bytes += _written_bytes(out)
        return out


LOSS_OUTPUTS = ("last", "all")
#: the ranges a training step marks for profilers (``torch.profiler.record_function``): its forward
#: (the loss included), its backward, its update (the gradients cleared included)
STEP_PHASES = ("step: forward", "step: backward", "step: optimizer")


def training_step(model: nn.Module, x: torch.Tensor, optimizer: torch.optim.Optimizer,
                  autocast: torch.dtype | None = None, outputs: str = "last", phases: bool = False) -> None:
    """One step: mean of the fp32 outputs as the loss, backward, update, gradients cleared.

    ``outputs``, for a model with several (``features_only``): ``'last'``, the last map's mean;
    ``'all'``, the mean of every map's elements together. ``phases``: each part in its range of
    :data:`STEP_PHASES`, for a profiler (off where ops are counted: a range is two ops more)."""
    if outputs not in LOSS_OUTPUTS:
        raise ValueError(f"outputs={outputs!r} is not one of {LOSS_OUTPUTS}")
    forward, backward, update = (record_function(name) if phases else contextlib.nullcontext() for name in STEP_PHASES)
    with forward:
        with torch.autocast(x.device.type, dtype=autocast, enabled=autocast is not None):
            out = model(x)
        if isinstance(out, (tuple, list)):
            out = out[-1] if outputs == "last" else torch.cat([o.float().flatten() for o in out])
        loss = out.float().mean()
    with backward:
        loss.backward()
    with update:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """``--autocast bf16`` and ``--paths cpu|gpu``: how :func:`count_training_step` runs the counted
    step (:func:`step_autocast` reads the first)."""
    parser.add_argument("--autocast", choices=["bf16"], help="--count: the forward under bf16 autocast")
    parser.add_argument("--paths", default="gpu", choices=["cpu", "gpu"],
                        help="--count: the layer arrangement of ppma's models (ppma.layers.paths)")


def step_autocast(args: argparse.Namespace) -> torch.dtype | None:
    """The autocast dtype that ``--autocast`` asks for (None: off)."""
    return torch.bfloat16 if args.autocast == "bf16" else None


def count_training_step(model: nn.Module, x: torch.Tensor, autocast: torch.dtype | None = None,
                        paths: str | None = None) -> StepCount:
    """:class:`StepCount` of one training step of ``model`` on ``x`` (after one warm-up step).

    ``model`` is put in train mode and trained for two steps (its weights change). ``paths``:
    the device whose layer arrangement :mod:`ppma.layers.paths` uses (default: ``x``'s device),
    e.g. ``'cuda'`` to count the GPU's arrangement on CPU tensors.
    """
    from ppma.layers.paths import use_paths_of

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    with use_paths_of(paths) if paths else contextlib.nullcontext():
        training_step(model, x, optimizer, autocast)
        with OpCounter() as counter:
            training_step(model, x, optimizer, autocast)
    return StepCount(ops=sum(counter.by_op.values()), kernel_ops=counter.kernel_ops, copies=counter.copies,
                     copied_bytes=counter.copied_bytes, optimizer_tensors=len(params), by_op=counter.by_op)
