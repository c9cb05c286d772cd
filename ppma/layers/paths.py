"""Per-device layer arrangements: one place that says how layers lay out the same arithmetic.

What wins in CPU inference (narrow layers bound by elementwise passes and allocations, in-place
updates wherever autograd does not record) costs on a GPU and in training (more launches, more
copies in the backward: an in-place update of a view is copied back whole by autograd). Layers
ask :func:`paths_for` with their input's device and branch on the answer: :data:`CPU_PATHS` for
CPU inference (autograd off), :data:`GPU_PATHS` on GPUs and wherever autograd records (a CPU
training step is as fast or faster with it, and dispatches fewer ops: ``ppma.bench.step_count``);
every arrangement computes the same function with the same parameters (tests compare them on
random inputs), so checkpoints and outputs do not depend on it. One value,
``LayerPaths.cpu_inference``, sets the layout choices below (each true on :data:`CPU_PATHS`):

- ``qk_channels_first``: MILA's ``q`` and ``k`` as channels-first ``(B, C, N)`` maps (each head
  a contiguous block: batched matmuls without copies on the CPU) rather than the released
  channels-last ``(B, N, 2C)`` linear map with one rotary pass over both.
- ``conv1x1_as_linear``: 1x1 convs as linear maps over a channels-last view (PyTorch's CPU conv
  sends small 1x1 convs to a slow path) rather than convs.
- ``fold_conv_residual``: ``x + dwconv(x)`` as one depthwise conv with 1 added at its kernel's
  centre rather than a conv and an add.
- ``channels_last_stem``: stem convs on channels-last maps rather than NCHW.
- ``update_views_in_place``: residuals added into a conv's permuted output view in place rather than
  into a new tensor (under autograd, an in-place update of a view costs a copy of its base in the
  backward).

Eval-mode BatchNorms are folded into their convs on every device (no batch statistics to keep).
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading

import torch


@dataclasses.dataclass(frozen=True)
class LayerPaths:
    """The arrangement of one kind of device. ``cpu_inference`` decides every layout choice
    below (they move together; see the module docstring for each), which layers ask by name."""

    cpu_inference: bool

    qk_channels_first = conv1x1_as_linear = fold_conv_residual = channels_last_stem = update_views_in_place = (
        property(lambda self: self.cpu_inference))


CPU_PATHS = LayerPaths(cpu_inference=True)
GPU_PATHS = LayerPaths(cpu_inference=False)
PATHS = {"cpu": CPU_PATHS, "gpu": GPU_PATHS}

_forced = threading.local()


def paths_for(device: torch.device | str) -> LayerPaths:
    """The arrangement for tensors on ``device``: :data:`CPU_PATHS` on the CPU while grad mode is off
    (``torch.no_grad``, ``torch.inference_mode``), :data:`GPU_PATHS` otherwise (CUDA, ROCm, XPU, meta,
    and CPU training), unless :func:`use_paths_of` says otherwise. A symbolic device (``torch.fx``
    tracing) gets :data:`CPU_PATHS`: traced graphs are for inference and keep the arrangement they
    were traced with."""
    forced = getattr(_forced, "paths", None)
    if forced is not None:
        return forced
    if not isinstance(device, (torch.device, str)):
        return CPU_PATHS
    return CPU_PATHS if torch.device(device).type == "cpu" and not torch.is_grad_enabled() else GPU_PATHS


@contextlib.contextmanager
def use_paths_of(kind: str):
    """Within the block, every layer takes the arrangement of ``kind`` (``'cpu'``, ``'gpu'``, or a
    device type such as ``'cuda'``) whatever its tensors' device: to count or test one device's
    arrangement on another. Not seen by code that ``torch.compile`` already traced."""
    key = "cpu" if kind == "cpu" else "gpu" if kind in ("gpu", "cuda", "xpu", "hip", "meta") else None
    if key is None:
        raise ValueError(f"use_paths_of: unknown device kind {kind!r}, expected one of 'cpu', 'gpu', 'cuda'")
    previous = getattr(_forced, "paths", None)
    _forced.paths = PATHS[key]
    try:
        yield PATHS[key]
    finally:
        _forced.paths = previous
