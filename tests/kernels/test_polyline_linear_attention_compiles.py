"""The strip kernels of the linear kind compile for the A100 (sm_80) and the H100 (sm_90) without a
GPU: no register spills, shared memory within the smallest supported GPU's, and vector loads of
``q``, ``k``, ``v`` rows: ``ld.global.v2/.v4``, or where the loads are pipelined (``num_stages``
2) ``cp.async`` copies of 8 or 16 bytes.

As in ``test_plane_scan_compiles.py``: ``triton.compile`` with an explicit target goes down to
PTX here and ``ptxas -v`` reports registers and spills; it runs in a subprocess because
``TRITON_INTERPRET=1`` replaces ``@triton.jit`` at import time. The kernels are compiled as the
JIT specializes them for contiguous channels (pointers, strides and channel counts divisible by
16), for a sample: fp32 at both head-dim blocks; bf16 at head dim 32, every intra-strip configuration
(32-column tiles) and the first and last of the edge kernel.
"""
from __future__ import annotations

import pytest
from compile_only import run_compile_script

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

SHARED_LIMIT = 101_376  # sm_86/sm_89, the smallest-memory supported GPUs

SCRIPT = r"""
import json, os, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ppma.kernels.common.resources import ptxas_usage
from ppma.kernels.polyline_linear_attention import tiled

SIZES = ("heads", "H", "W")  # not specialized: any grid
VECTOR_LOAD = r"ld\.global(?:\.\w+)*\.(v[24])\.|cp\.async\.\w+\.shared\.global \[[^]]*\], \[[^]]*\], (0x8|0x10)\b"
out = {}
cases = [c for c in tiled.compile_cases() if " | fp32 " in c.name or (" | bf16 d<=32 " in c.name and any(
    s in c.name for s in ("cols32", "ROWS=32 ", "ROWS=128 ")))]
for arch in (80, 90):
    for case in cases:
        sig = {**case.signature, **{k: "constexpr" for k in case.constexprs}}
        attrs = {(case.kernel.arg_names.index(n),): [["tt.divisibility", 16]]
                 for n, t in case.signature.items() if n not in SIZES}
        compiled = triton.compile(ASTSource(fn=case.kernel, signature=sig, constexprs=case.constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", arch, 32),
                                  options=dict(num_warps=case.num_warps, num_stages=case.num_stages))
        registers, spills = ptxas_usage(compiled.asm["ptx"], arch)
        out[f"sm_{arch} {case.name}"] = {
            "registers": registers, "spills": spills, "shared": compiled.metadata.shared,
            "vector_loads": sorted(set(re.findall(VECTOR_LOAD, compiled.asm["ptx"])))}
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def compiled():
    return run_compile_script(SCRIPT)


def test_strip_kernels_fit_without_spills_and_load_vectors(compiled):
    assert {name.split(" | ")[0].split()[-1] for name in compiled} == {
        "polyline_linear_attention.tiled._intra_kernel", "polyline_linear_attention.tiled._edge_kernel"}
    assert len(compiled) == 16, sorted(compiled)
    for name, r in compiled.items():
        assert r["spills"] == 0, f"{name} spills: {r}"
        assert r["shared"] <= SHARED_LIMIT, f"{name} needs {r['shared']} bytes of shared memory"
        assert r["vector_loads"], f"{name}: no ld.global.v2/.v4 or 8/16-byte cp.async in its PTX"
