"""Which implementation of an op runs: the PyTorch reference or a Triton kernel.

``auto`` picks Triton for CUDA tensors, and for CPU tensors when ``TRITON_INTERPRET=1`` (Triton's
numpy interpreter, how CI tests kernels without a GPU); PyTorch otherwise. The environment
variable ``PPMA_BACKEND=torch|triton|auto`` forces a choice; forcing an unavailable backend raises.
``backend_report()`` says what each op would use and what it last used.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import torch

BACKENDS = ("auto", "torch", "triton")
ENV_VAR = "PPMA_BACKEND"

# Ops that have a Triton kernel; every op has a PyTorch reference.
TRITON_OPS = ("polyline_scan",)

_last_used: dict[str, str] = {}


def interpreting() -> bool:
    """True when Triton kernels run on the CPU through Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_unavailable_reason(device: torch.device | str) -> str | None:
    """Why Triton cannot run on ``device``, or None when it can."""
    device = torch.device(device)
    if not _triton_installed():
        return "the 'triton' package is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and interpreting():
        return None
    return f"Triton kernels run on CUDA tensors (or on CPU with TRITON_INTERPRET=1), got device '{device}'"


def requested_backend() -> str:
    """The backend asked for through ``PPMA_BACKEND`` (``'auto'`` when unset)."""
    name = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if name not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={name!r} is not one of {BACKENDS}")
    return name


def select_backend(op: str, device: torch.device | str, backend: str | None = None) -> str:
    """Resolve the backend for ``op`` on ``device``: ``backend`` argument, else ``PPMA_BACKEND``.

    Returns ``'torch'`` or ``'triton'``; raises ``RuntimeError`` when Triton is forced but
    cannot run, ``ValueError`` for an unknown name.
    """
    name = requested_backend() if backend is None else backend
    if name not in BACKENDS:
        raise ValueError(f"backend={name!r} is not one of {BACKENDS}")
    has_kernel = op in TRITON_OPS
    reason = triton_unavailable_reason(device) if has_kernel else f"op '{op}' has no Triton kernel"
    if name == "triton":
        if reason is not None:
            raise RuntimeError(f"backend 'triton' was forced for {op} but is unavailable: {reason}")
        return "triton"
    if name == "torch":
        return "torch"
    return "triton" if reason is None else "torch"


def record_backend(op: str, backend: str) -> None:
    _last_used[op] = backend


def backend_report(device: torch.device | str = "cpu") -> dict[str, dict[str, str | None]]:
    """Per op: the backend ``auto``/``PPMA_BACKEND`` selects on ``device`` and the one last run.

    >>> backend_report("cpu")["polyline_scan"]
    {'selected': 'torch', 'last_used': None, 'triton': "..."}
    """
    report = {}
    for op in ("polyline_mask", "polyline_scan"):
        try:
            selected = select_backend(op, device)
        except RuntimeError as err:
            selected = f"error: {err}"
        reason = triton_unavailable_reason(device) if op in TRITON_OPS else "no kernel"
        report[op] = {
            "selected": selected,
            "last_used": _last_used.get(op),
            "triton": "available" if reason is None else reason,
        }
    return report
