"""Autocast as the references see it, for kernels that take their inputs' dtype as given."""
from __future__ import annotations

import contextlib

import torch


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """Autocast's dtype where it is on for ``device_type``; None where it is off or the device type
    has no autocast (``'meta'``: shape inference on meta tensors)."""
    if not torch.amp.is_autocast_available(device_type) or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def autocast_as(device_type: str, dtype: torch.dtype | None):
    """A context with autocast on in ``dtype`` (None: off) for ``device_type``, as
    :func:`autocast_dtype` saw it; nothing where the device type has no autocast."""
    if not torch.amp.is_autocast_available(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype, enabled=dtype is not None)


def autocast_off(device_type: str):
    """A context with autocast off for ``device_type`` (nothing where it has no autocast)."""
    return autocast_as(device_type, None)


def autocast_inputs(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors in autocast's dtype when it is on for their device (the dtype the references'
    products run in); unchanged when it is off or the last tensor is fp64."""
    dtype = autocast_dtype(tensors[-1].device.type)
    if tensors[-1].dtype == torch.float64 or dtype is None:
        return tensors
    return tuple(t.to(dtype) for t in tensors)
