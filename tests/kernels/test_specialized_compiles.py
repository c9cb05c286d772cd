"""The decay and rotary kernels compile for the A100 (sm_80) and the H100 (sm_90) without a GPU, as
the JIT specializes them: integer arguments equal to 1 become constants (a model with one head, one
decay shared by the axes, a unit token stride), which the interpreter never shows; and pointers and
strides divisible by 16 (aligned tensors), where the rotary kernel reads and writes its rows as
vectors. In a subprocess, as ``TRITON_INTERPRET=1`` replaces ``@triton.jit`` functions at import time."""
from __future__ import annotations

import pytest
from compile_only import run_compile_script

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

SCRIPT = r"""
import json
import re
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ppma.kernels.common import tuning
from ppma.kernels.polyline_decays import projection
from ppma.kernels.rotary_qk import rotate


def shared_memory(kernel, pointers, constants, floats=()):
    # the kernel compiled for sm_80 and sm_90 with ``constants`` as constexprs: its shared memory
    signature = {**tuning.signature(kernel, pointers), **{name: "fp32" for name in floats}}
    signature.update({name: "constexpr" for name in constants})
    names = list(signature)
    source = ASTSource(kernel.fn, signature, constexprs={(names.index(k),): v for k, v in constants.items()})
    return [triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": 8}).metadata.shared
            for arch in (80, 90)]


out = {}
decay_pointers = {"X": "*bf16", "DX": "*bf16", "W": "*fp32", "DT": "*fp32", "ALOG": "*fp32", "OUT": "*fp32",
                  "G": "*fp32", "PARTIAL": "*fp32"}
for kernel, tile in ((projection._forward_kernel, projection.FORWARD_TILE),
                     (projection._backward_kernel, projection.BACKWARD_TILE)):
    for heads, axes, d in ((1, 1, 32), (8, 2, 32)):
        constants = dict(ACC=tl.float32, BLOCK_T=projection.block_tokens(tile, heads, d),
                         HP=triton.next_power_of_2(heads), DP=triton.next_power_of_2(d))
        constants.update({name: 1 for name, value in (("HEADS", heads), ("AXES", axes)) if value == 1})
        out[f"{kernel.fn.__name__} heads={heads} axes={axes}"] = shared_memory(kernel, decay_pointers, constants)
rotary_pointers = {name: "*bf16" for name in ("Q", "K", "QO", "KO")} | {"ROT": "*fp32"}
for ones in ((), ("HEADS", "sqn", "skn")):
    for sign in (1, -1):
        constants = dict(ACC=tl.float32, SIGN=sign, BLOCK_N=128, BLOCK_M=16) | {name: 1 for name in ones}
        out[f"_rotate_kernel ones={ones} sign={sign}"] = shared_memory(rotate._rotate_kernel, rotary_pointers,
                                                                         constants, floats=("k_scale",))
for dtype in ("bf16", "fp32"):  # aligned: every pointer and stride divisible by 16, as the layer's q and k are
    pointers = {name: f"*{dtype}" for name in ("Q", "K", "QO", "KO")} | {"ROT": "*fp32"}
    signature = {**tuning.signature(rotate._rotate_kernel, pointers), "k_scale": "fp32"}
    constants = dict(ACC=tl.float32, SIGN=1, BLOCK_N=128, BLOCK_M=16)
    signature.update({name: "constexpr" for name in constants})
    names = list(signature)
    aligned = {(names.index(n),): [["tt.divisibility", 16]] for n in pointers | dict.fromkeys(("sqb", "sqh", "sqn"))}
    source = ASTSource(rotate._rotate_kernel.fn, signature, constexprs={(names.index(k),): v for k, v in constants.items()},
                       attrs=aligned)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    out[f"vectors {dtype}"] = sorted(set(re.findall(r"(?:ld|st)\.global\.v[24]", ptx)))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled():
    return run_compile_script(SCRIPT)


def test_kernels_compile_with_one_head_one_axis_and_unit_strides(compiled):
    shared = {name: v for name, v in compiled.items() if not name.startswith("vectors")}
    assert len(shared) == 2 * 2 + 2 * 2, shared
    assert all(len(v) == 2 and all(b <= 101_376 for b in v) for v in shared.values()), shared  # fits every GPU


def test_rotary_kernel_moves_rows_as_vectors(compiled):
    """Each token's row of ``q`` / ``k`` is loaded as vectors (``ld.global.v2/.v4``), not as every
    other 2-byte element (the first kernel's scalar accesses moved a ``ppma_tiny`` step's 1.08 GB in
    3.74 ms on an H100, about a tenth of copy bandwidth); in fp32 the rotated rows are stored as
    vectors too."""
    assert "ld.global.v2" in compiled["vectors bf16"] or "ld.global.v4" in compiled["vectors bf16"], compiled
    assert {"ld.global.v2", "st.global.v2"} <= set(compiled["vectors fp32"]), compiled
