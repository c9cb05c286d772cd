"""Per-thread scratch buffers for the CPU kernels' large temporaries.

A fresh CPU allocation of tens of MB is handed back to the system when freed, and touching it
again costs a page fault per 4 kB page: for a 77 MB product on 2 threads that took 24 ms where
the product itself took 3 ms. The CPU kernels write their large temporaries into buffers kept
between calls instead (never into their outputs, which autograd and callers keep).
"""
from __future__ import annotations

import math
import threading

import torch

_LOCAL = threading.local()


def scratch(slot: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A ``dtype`` CPU tensor of ``shape`` in this thread's reusable buffer ``slot`` (name it after
    the kernel and the temporary), grown when too small; its values are left as they were."""
    buffers = _LOCAL.__dict__.setdefault("buffers", {})
    numel = math.prod(shape)
    key = (slot, dtype)
    if key not in buffers or buffers[key].numel() < numel:
        with torch.inference_mode(False):  # a normal tensor: updated in place in and out of inference mode
            buffers[key] = torch.empty(numel, dtype=dtype)
    return buffers[key][:numel].view(shape)


def release_scratch() -> None:
    """Free this thread's scratch buffers (the next call allocates them again)."""
    _LOCAL.__dict__.pop("buffers", None)
