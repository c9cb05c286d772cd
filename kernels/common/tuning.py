"""Launch configurations of the Triton kernels: autotuning over a small set, and the facts that
say which configuration fits which GPU.

- Every kernel launches through :func:`autotune` (``triton.autotune``'s arguments). Under
  Triton's CPU interpreter only the first configuration runs, so the tests stay fast; on a GPU
  the first call with a new key times every configuration that fits and keeps the fastest.
- :data:`SHARED_MEMORY_LIMIT`: the most shared memory one program may use, per architecture.
- :class:`CompileCase`: one compilation of a kernel without a GPU (a signature, its constexprs,
  warps and stages). Each kernel module lists its cases in ``compile_cases()``;
  ``tools/kernel_resources.py`` compiles them for every architecture in :data:`ARCHS`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import triton

from .runtime import interpreted

# Opt-in shared memory per thread block (bytes), by compute capability (major * 10 + minor).
SHARED_MEMORY_LIMIT = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}
ARCHS = tuple(SHARED_MEMORY_LIMIT)


@dataclass(frozen=True)
class CompileCase:
    """One compilation of ``kernel`` (the ``@triton.jit`` function, not its autotuner).

    ``signature``: every non-constexpr argument's Triton type (``'*bf16'``, ``'i32'``, ...);
    ``constexprs``: every constexpr argument's value; ``name``: what the resource table calls it.
    """

    name: str
    kernel: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 2
    options: dict[str, Any] = field(default_factory=dict)


def autotune(configs: list[triton.Config], key: list[str], **kwargs):
    """``triton.autotune(configs, key, **kwargs)``; under the interpreter, ``configs[0]`` alone."""
    if interpreted():
        configs = configs[:1]
    return triton.autotune(configs=configs, key=key, **kwargs)
