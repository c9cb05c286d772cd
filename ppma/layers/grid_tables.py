"""Tables that depend only on a grid's sizes (rotary angles): computed once per grid in eager calls."""
from __future__ import annotations

import functools

import torch

#: the latest grids (sizes, dims, devices) a table function keeps
CACHED_GRIDS = 8


def _plain(value) -> bool:
    """A concrete, hashable argument: a number, string or device, or a tuple of them (not a
    symbolic size or an ``torch.fx`` proxy)."""
    if type(value) is tuple:
        return all(_plain(v) for v in value)
    return type(value) in (int, float, bool, str, torch.device)


def cached_per_grid(build):
    """``build(*args)``, the calls of plain eager code cached (the :data:`CACHED_GRIDS` latest
    argument sets, e.g. the four stages of two input sizes) and built as normal tensors (not
    inference tensors: usable by later autograd-tracked calls, which save them for the backward).
    Under ``torch.compile`` / ``torch.export``, with fake tensors, and for symbolic sizes
    (``torch.fx``) the caller's graph computes them."""

    @functools.lru_cache(maxsize=CACHED_GRIDS)
    def cached(*args) -> torch.Tensor:
        with torch.inference_mode(False), torch.no_grad():
            return build(*args)

    @functools.wraps(build)
    def table(*args) -> torch.Tensor:
        if (torch.compiler.is_compiling() or not _plain(args)
                or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None):
            return build(*args)
        return cached(*args)

    table.cache_clear = cached.cache_clear
    return table
