"""Whether Triton can run here, and whether it runs kernels in its CPU interpreter.

Importable without Triton: nothing here imports it until asked. Triton decides to interpret
when ``@triton.jit`` decorates a kernel, from its ``TRITON_INTERPRET`` knob; :func:`interpreted`
reads that same knob once and keeps the answer for the life of the process.
"""
from __future__ import annotations

import functools
import importlib.util

import torch


@functools.cache
def triton_installed() -> bool:
    """True when the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


@functools.cache
def interpreted() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter (``TRITON_INTERPRET=1``)."""
    if not triton_installed():
        return False
    import triton

    return bool(triton.knobs.runtime.interpret)


def triton_unavailable_reason(device: torch.device | str) -> str | None:
    """Why Triton kernels cannot run on ``device``, or None when they can.

    They run on CUDA tensors, and on CPU tensors when Triton interprets.
    """
    device = torch.device(device)
    if not triton_installed():
        return "the 'triton' package is not installed"
    if device.type == "cuda" or (device.type == "cpu" and interpreted()):
        return None
    return f"Triton kernels run on CUDA tensors (or on CPU with TRITON_INTERPRET=1), got device '{device}'"


def triton_runs_natively(device: torch.device | str) -> bool:
    """True on CUDA devices: elsewhere Triton only interprets (for tests), so ``auto`` never picks it."""
    return torch.device(device).type == "cuda"
