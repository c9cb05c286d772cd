"""Where a training step's time goes: one step under ``torch.profiler``, summarised as kernel
launches per step, kernel time per step and the kernels that take the most of it.

On CUDA the summary counts GPU kernels (and memory copies and sets: every activity the profiler
records on the device) by their self device time. On the CPU there are no kernels: it counts the
``aten::`` operator calls (nested calls included) by their self CPU time.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from ppma.kernels.common.timing import median_seconds, sync


@dataclass(frozen=True)
class KernelTime:
    """One kernel (CPU: operator): calls and milliseconds per step."""

    name: str
    calls: float
    ms: float


@dataclass(frozen=True)
class StepSummary:
    """Per step: kernel launches, summed kernel milliseconds and the ``top`` kernels by time."""

    launches: float
    kernel_ms: float
    top: list[KernelTime]


def summarize(events: Iterable, steps: int, device_type: str, top: int = 12) -> StepSummary:
    """Summarise ``prof.key_averages()`` rows (``key``, ``count``, ``device_type`` and
    ``self_device_time_total`` / ``self_cpu_time_total`` in microseconds) recorded over ``steps``
    steps on ``device_type`` (``'cuda'``: device activities; ``'cpu'``: ``aten::`` operators)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if device_type == "cuda":
        rows = [(e.key, e.count, e.self_device_time_total) for e in events if e.device_type == DeviceType.CUDA]
    elif device_type == "cpu":
        rows = [(e.key, e.count, e.self_cpu_time_total) for e in events
                if e.device_type == DeviceType.CPU and e.key.startswith("aten::")]
    else:
        raise ValueError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
    kernels = sorted((KernelTime(name, count / steps, us / steps / 1e3) for name, count, us in rows),
                     key=lambda k: k.ms, reverse=True)
    return StepSummary(launches=sum(k.calls for k in kernels), kernel_ms=sum(k.ms for k in kernels),
                       top=kernels[:top])


@dataclass(frozen=True)
class StepProfile:
    """One model's training step: its wall milliseconds (median, unprofiled) and its summary."""

    model: str
    step_ms: float
    summary: StepSummary


def profile_step(label: str, step: Callable[[], None], device: torch.device, warmup: int, timed: int,
                 top: int = 12) -> StepProfile:
    """Time ``step`` (``warmup`` then ``timed`` runs), then profile one more run of it."""
    seconds = median_seconds(step, device, warmup, timed)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        sync(device)
    return StepProfile(label, 1e3 * seconds, summarize(prof.key_averages(), 1, device.type, top))
