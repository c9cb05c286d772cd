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


# Triton targets NVIDIA GPUs of compute capability 8.0 (Ampere) and newer.
MIN_CAPABILITY = (8, 0)


def triton_unavailable_reason(device: torch.device | str, kernels: tuple[str, ...] = ()) -> str | None:
    """Why Triton kernels cannot run on ``device``, or None when they can.

    They run on CUDA tensors of compute capability 8.0 or newer, and on CPU tensors when Triton
    interprets. ``kernels``: the op's kernel modules (``'polyline_attention.vanilla'``, ...); on
    a GPU where the resource table says a variant of theirs has no configuration that fits, the
    op cannot run them either.
    """
    device = torch.device(device)
    if not triton_installed():
        return "the 'triton' package is not installed"
    if device.type == "cpu" and interpreted():
        return None
    if device.type != "cuda":
        return f"Triton kernels run on CUDA tensors (or on CPU with TRITON_INTERPRET=1), got device '{device}'"
    if not torch.cuda.is_available():
        return f"no CUDA device is available (torch {torch.__version__}), got device '{device}'"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return (f"Triton kernels need compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer; "
                f"{device} has {capability[0]}.{capability[1]} (sm_{capability[0]}{capability[1]})")
    from .tuning import unfit_variants

    unfit = unfit_variants(kernels, capability)
    if unfit:
        return f"no launch configuration of {unfit[0]} fits the shared memory of sm_{capability[0]}{capability[1]}"
    return None


def triton_configuration_note(device: torch.device | str, kernels: tuple[str, ...] = ()) -> str | None:
    """On a GPU that runs the Triton kernels of ``kernels``: which of their launch configurations
    the autotuner never tries there (they need more shared memory than it has); None elsewhere or
    when every configuration fits."""
    device = torch.device(device)
    if device.type != "cuda" or triton_unavailable_reason(device, kernels) is not None:
        return None
    from .tuning import pruning_note

    return pruning_note(kernels, torch.cuda.get_device_capability(device))


def triton_runs_natively(device: torch.device | str) -> bool:
    """True on CUDA devices: elsewhere Triton only interprets (for tests), so ``auto`` never picks it."""
    return torch.device(device).type == "cuda"


def triton_checks(kernels: tuple[str, ...]) -> dict:
    """The device checks of an op's Triton kernel whose kernels are defined in the modules
    ``kernels`` (below ``ppma.kernels``): the ``unavailable``, ``auto`` and ``configurations``
    arguments of ``ppma.ops.registry.Kernel``."""
    return {"unavailable": functools.partial(triton_unavailable_reason, kernels=kernels),
            "auto": triton_runs_natively,
            "configurations": functools.partial(triton_configuration_note, kernels=kernels)}
