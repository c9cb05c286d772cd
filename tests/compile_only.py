"""Compile-only checks of the Triton kernels for GPUs this machine lacks: ``triton.compile`` with an
explicit target goes all the way to a cubin without a GPU. The checks run in a subprocess without
``TRITON_INTERPRET``, which replaces ``@triton.jit`` functions at import time."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest


def table_triton() -> str:
    """The Triton version the resource table (``kernels/common/resources.json``) was compiled with:
    its spill counts are that compiler's (another version's ptxas input differs)."""
    from ppma.kernels.common.tuning import RESOURCES_PATH

    return json.loads(RESOURCES_PATH.read_text())["triton"]


def same_minor(version: str, other: str) -> bool:
    return version.split(".")[:2] == other.split(".")[:2]


def run_compile_script(script: str, *args: str) -> Any:
    """The JSON that ``script`` (run as ``python -c script *args``) prints on its last line; skips
    where this Triton build has no NVIDIA backend."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    if proc.returncode != 0 and "No module named 'triton.backends.nvidia" in proc.stderr:
        pytest.skip("this Triton build has no NVIDIA backend")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
