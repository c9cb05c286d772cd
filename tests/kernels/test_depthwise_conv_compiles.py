"""The depthwise conv kernels, compiled for the H100 (sm_90) without a GPU as the JIT specializes
them for aligned channels-last grids (pointers, pixel strides and the channel count divisible by
16): every pixel's channels are read and written as 16-byte vectors (``ld.global.v4``), forward and
backward. In a subprocess, as ``TRITON_INTERPRET=1`` replaces ``@triton.jit`` functions at import time."""
from __future__ import annotations

import pytest
from compile_only import run_compile_script

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

SCRIPT = r"""
import json
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ppma.kernels.depthwise_conv import conv

out = {}
for case in conv.compile_cases():
    if "bf16" not in case.name or "BLOCK_W=32" not in case.name or case.num_warps != 4:
        continue
    names = list(case.kernel.arg_names)
    aligned = {(names.index(n),): [["tt.divisibility", 16]] for n, t in case.signature.items()
               if t.startswith("*") or n in ("C", "sxn", "sxh", "sxw")}
    source = ASTSource(case.kernel, case.signature, case.constexprs, attrs=aligned)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    out[case.name] = sorted(set(re.findall(r"(?:ld|st)\.global\.v4", ptx)))
print(json.dumps(out))
"""


def test_pixels_channels_move_as_vectors():
    compiled = run_compile_script(SCRIPT)
    assert len(compiled) == 6, compiled  # forward and backward of the three conv kinds
    for name, vectors in compiled.items():
        assert vectors == ["ld.global.v4", "st.global.v4"], (name, vectors)
