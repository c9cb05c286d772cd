"""Autocast as the references see it, for kernels that take their inputs' dtype as given."""
from __future__ import annotations

import torch


def autocast_inputs(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors in autocast's dtype when it is on for their device (the dtype the references'
    products run in); unchanged when it is off or the last tensor is fp64."""
    device_type = tensors[-1].device.type
    if tensors[-1].dtype == torch.float64 or not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) for t in tensors)
