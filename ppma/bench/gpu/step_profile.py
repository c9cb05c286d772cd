"""Where a training step's time goes: one step under ``torch.profiler``, summarised as kernel
launches per step, kernel time per step and the kernels that take the most of it; and the host's
side of the step (:class:`HostTime`), which bounds it where the device waits for the launches:
its operators by self host time, and its Python functions by self time (``cProfile``).

On CUDA the summary counts GPU kernels (and memory copies and sets: every activity the profiler
records on the device) by their self device time. On the CPU there are no kernels: it counts the
``aten::`` operator calls (nested calls included) by their self CPU time.
"""
from __future__ import annotations

import cProfile
import pstats
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePath

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from ppma.kernels.common.timing import median_seconds, sync

from ..step_count import STEP_PHASES


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
    """Summarise ``prof.key_averages()`` rows (``key``, ``count``, ``device_type``,
    ``is_user_annotation`` and ``self_device_time_total`` / ``self_cpu_time_total`` in
    microseconds) recorded over ``steps`` steps on ``device_type`` (``'cuda'``: device activities
    but the ranges that ``record_function`` marks on the device's timeline, e.g. the optimizer's
    ``Optimizer.step#AdamW.step``, whose time is its kernels' again; ``'cpu'``: ``aten::`` operators)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if device_type == "cuda":
        rows = [(e.key, e.count, e.self_device_time_total) for e in events
                if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
    elif device_type == "cpu":
        rows = [(e.key, e.count, e.self_cpu_time_total) for e in events
                if e.device_type == DeviceType.CPU and e.key.startswith("aten::")]
    else:
        raise ValueError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
    kernels = sorted((KernelTime(name, count / steps, us / steps / 1e3) for name, count, us in rows),
                     key=lambda k: k.ms, reverse=True)
    return StepSummary(launches=sum(k.calls for k in kernels), kernel_ms=sum(k.ms for k in kernels),
                       top=kernels[:top])


def runtime_calls(events: Iterable, steps: int, top: int = 5) -> list[KernelTime]:
    """The CUDA runtime and driver calls among ``prof.key_averages()`` rows (host-side events named
    ``cuda*`` / ``cu*``: launches, copies, synchronizations) over ``steps`` steps, by their host
    milliseconds per step, the ``top`` first."""
    return _host_rows(events, steps, top, runtime=True)


def host_operators(events: Iterable, steps: int, top: int = 12) -> list[KernelTime]:
    """The host-side rows of ``prof.key_averages()`` but the CUDA runtime calls (:func:`runtime_calls`):
    aten operators, autograd's nodes, the ops' autograd functions (``ppma_<name>``), the
    optimizer's step; by their self host milliseconds per step over ``steps`` steps, the ``top``
    first. A row's self time is its own code's: Python included (an autograd function's), the
    operators it calls left out."""
    return _host_rows(events, steps, top, runtime=False)


def _host_rows(events: Iterable, steps: int, top: int, runtime: bool) -> list[KernelTime]:
    """The host-side rows that are (``runtime``) or are not CUDA runtime and driver calls (keys
    ``cu*``), by self host milliseconds per step, the ``top`` first."""
    rows = [KernelTime(e.key, e.count / steps, e.self_cpu_time_total / steps / 1e3) for e in events
            if e.device_type == DeviceType.CPU and e.key.startswith("cu") == runtime]
    return sorted(rows, key=lambda k: k.ms, reverse=True)[:top]


def host_phases(events: Iterable, steps: int) -> list[KernelTime]:
    """The host milliseconds per step of the ranges a training step marks
    (:data:`ppma.bench.step_count.STEP_PHASES`: forward, backward, update), in that order, their
    operators included; none for a step without them."""
    totals = {e.key: e for e in events if e.device_type == DeviceType.CPU and e.key in STEP_PHASES}
    return [KernelTime(name, totals[name].count / steps, totals[name].cpu_time_total / steps / 1e3)
            for name in STEP_PHASES if name in totals]


@dataclass(frozen=True)
class PythonTime:
    """One Python function (or built-in) in a ``cProfile`` run: ``name`` ``'path:line(function)'``
    (the path from its package's folder on), its calls, its self and its cumulative milliseconds."""

    name: str
    calls: int
    self_ms: float
    cumulative_ms: float


# the folder that holds the ppma package (and, in a checkout, kernels/ and tests/)
_PROJECT = PurePath(__file__).parents[3]


def _short_path(path: str) -> str:
    """A source path from its package's folder on: ``'.../site-packages/torch/nn/modules/module.py'``
    -> ``'torch/nn/modules/module.py'``, ``'<checkout>/ppma/ops/registry.py'`` -> ``'ppma/ops/registry.py'``;
    elsewhere its last three parts."""
    pure = PurePath(path)
    if pure.is_relative_to(_PROJECT):
        return pure.relative_to(_PROJECT).as_posix()
    parts = pure.parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1:])
    return "/".join(parts[-3:])


def python_functions(step: Callable[[], None], device: torch.device, top: int = 12) -> list[PythonTime]:
    """One run of ``step`` under ``cProfile``: its ``top`` functions by self time. ``cProfile``
    sees the calling thread only: a CUDA backward runs in autograd's device thread and shows as
    one ``run_backward`` call (:func:`host_operators` has its operators)."""
    profiler = cProfile.Profile()
    sync(device)
    profiler.runcall(step)
    sync(device)
    rows = []
    for (path, line, function), (_, calls, self_s, cumulative_s, _) in pstats.Stats(profiler).stats.items():
        name = function if path == "~" else f"{_short_path(path)}:{line}({function})"
        rows.append(PythonTime(name, calls, 1e3 * self_s, 1e3 * cumulative_s))
    return sorted(rows, key=lambda r: r.self_ms, reverse=True)[:top]


@dataclass(frozen=True)
class HostTime:
    """The host's side of a step. ``ms``: from the step's call, the device idle, until the call
    returns, not waiting for the device (median): about the step's time where the host bounds it,
    well below it where the device does (unless the host waits, which ``syncs`` tells).
    ``syncs``: the synchronizing calls in one step as ``torch.cuda.set_sync_debug_mode`` reports
    them (None off CUDA), ``first_sync`` the first one's message; ``runtime``: the CUDA runtime
    and driver calls by host time in the profiled step (:func:`runtime_calls`; none off CUDA);
    ``phases``: the profiled training step's forward, backward and update (:func:`host_phases`);
    ``operators``: the profiled step's other host rows by self time (:func:`host_operators`);
    ``python``: one more step's Python functions by self time (:func:`python_functions`)."""

    ms: float
    syncs: int | None
    first_sync: str
    runtime: list[KernelTime]
    phases: list[KernelTime]
    operators: list[KernelTime]
    python: list[PythonTime]


def count_syncs(step: Callable[[], None], device: torch.device) -> tuple[int | None, str]:
    """``(synchronizing calls in one run of step, the first one's message)`` by torch's sync
    debug mode (CUDA; ``(None, '')`` elsewhere)."""
    if device.type != "cuda":
        return None, ""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    sync(device)
    found = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    return len(found), (found[0].splitlines()[0] if found else "")


@dataclass(frozen=True)
class StepProfile:
    """One model's training step: its wall milliseconds (median, unprofiled), its summary and
    its host side."""

    model: str
    step_ms: float
    summary: StepSummary
    host: HostTime


def profile_step(label: str, step: Callable[[], None], device: torch.device, warmup: int, timed: int,
                 top: int = 12) -> StepProfile:
    """Time ``step`` (``warmup`` then ``timed`` runs) and its host side (``timed`` runs, one
    counting synchronizations, one under ``cProfile``), then profile one more run of it."""
    seconds = median_seconds(step, device, warmup, timed)
    host = median_seconds(step, device, 0, timed, wait=False)
    syncs, first_sync = count_syncs(step, device)
    python = python_functions(step, device, top)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        sync(device)
    events = prof.key_averages()
    return StepProfile(label, 1e3 * seconds, summarize(events, 1, device.type, top),
                       HostTime(1e3 * host, syncs, first_sync, runtime_calls(events, 1), host_phases(events, 1),
                                host_operators(events, 1, top), python))
