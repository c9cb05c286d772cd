"""Timing and memory helpers shared by the benchmarks in ``kernels/bench/``."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int, repeat: int,
                   wait: bool = True) -> float:
    """Median wall time of ``fn()`` over ``repeat`` runs after ``warmup`` runs, each started with the
    device idle. ``wait=False``: until ``fn`` returns, not waiting for the work it queued (the
    host's time)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        sync(device)
        start = time.perf_counter()
        fn()
        if wait:
            sync(device)
        times.append(time.perf_counter() - start)
    sync(device)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, nbytes: int, repeat: int) -> float:
    """Copy bandwidth on ``device`` in bytes/s (read + write) for a buffer of ``nbytes``."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / median_seconds(lambda: dst.copy_(src), device, 2, repeat)


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated by ``fn`` beyond what existed before it.

    CUDA: the caching allocator's peak. CPU: the running sum of the allocation and free events
    that the profiler records with ``profile_memory=True``.
    """
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        current += event.nbytes()
        peak = max(peak, current)
    return peak


def cuda_launches(fn: Callable[[], object], device: torch.device) -> str:
    """Kernels one call of ``fn`` runs on CUDA (profiled), as text; ``''`` on other devices."""
    if device.type != "cuda":
        return ""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    return str(sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA))
