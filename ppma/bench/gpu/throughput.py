"""Whole models: inference and training images/s with their peak memory, and backbones at large
sizes, batch 1 (time and peak memory beyond the weights).

Inference runs under ``torch.inference_mode``; training is one AdamW step on the mean of the
logits; both under bf16 autocast. Times are medians of synchronised runs after warm-up. Peak
memory is what one more run allocates beyond what was allocated before it (the weights, the input
and, when training, the optimizer's state): on CUDA the caching allocator's peak, on the CPU the
running sum of the allocations the profiler records.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ppma.kernels.common.timing import median_seconds, peak_memory

from .. import step_count
from .correctness import backend

MIB = 2**20


@dataclass(frozen=True)
class Repeats:
    """Untimed and timed runs per measurement."""

    warmup: int
    timed: int


def inference_step(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    """One bf16-autocast inference call of ``model`` on ``x``."""
    def step():
        with torch.inference_mode(), torch.autocast(x.device.type, dtype=torch.bfloat16):
            model(x)
    return step


def training_step(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    """One bf16-autocast training step of ``model`` on ``x`` (AdamW, loss: the mean of every
    output, :func:`ppma.bench.step_count.training_step`), its forward, backward and update marked
    for the profiler (:data:`ppma.bench.step_count.STEP_PHASES`)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return functools.partial(step_count.training_step, model, x, optimizer, torch.bfloat16, outputs="all",
                             phases=True)


def measure(step: Callable[[], None], device: torch.device, repeats: Repeats) -> tuple[float, float]:
    """``(median seconds, peak MiB)`` of ``step``."""
    seconds = median_seconds(step, device, repeats.warmup, repeats.timed)
    return seconds, peak_memory(step, device) / MIB


@dataclass(frozen=True)
class SpeedRow:
    """One model on one backend (``'-'``: an official model)."""

    model: str
    backend: str
    infer_img_s: float
    infer_peak_mib: float
    train_img_s: float
    train_peak_mib: float


def model_speed(label: str, build: Callable[[], torch.nn.Module], backend_name: str, device: torch.device,
                size: tuple[int, int], infer_batch: int, train_batch: int, repeats: Repeats) -> SpeedRow:
    """Inference at ``infer_batch`` and training at ``train_batch`` of ``build()`` at ``size``."""
    torch.manual_seed(0)
    model = build().to(device)
    with backend(backend_name if backend_name != "-" else "auto"):
        x = torch.randn(infer_batch, 3, *size, device=device)
        infer_s, infer_mib = measure(inference_step(model.eval(), x), device, repeats)
        x = torch.randn(train_batch, 3, *size, device=device)
        train_s, train_mib = measure(training_step(model.train(), x), device, repeats)
    return SpeedRow(label, backend_name, infer_batch / infer_s, infer_mib, train_batch / train_s, train_mib)


@dataclass(frozen=True)
class BackboneRow:
    """A backbone at one square size, batch 1."""

    model: str
    backend: str
    size: int
    ms: float
    peak_mib: float


def backbone_speed(label: str, build: Callable[[], torch.nn.Module], backend_name: str, device: torch.device,
                   size: int, repeats: Repeats) -> BackboneRow:
    """Inference time and peak memory beyond the weights of ``build()`` on one ``size`` x ``size`` image."""
    torch.manual_seed(0)
    model = build().to(device).eval()
    with backend(backend_name if backend_name != "-" else "auto"):
        seconds, mib = measure(inference_step(model, torch.randn(1, 3, size, size, device=device)), device, repeats)
    return BackboneRow(label, backend_name, size, 1e3 * seconds, mib)
