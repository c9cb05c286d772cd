"""The fused polyline-scan kernels compile for the A100 (sm_80) and the H100 (sm_90) without a GPU.

Triton's interpreter runs code that its GPU compiler rejects (e.g. a value defined in one loop
and used after it), so the CPU tests alone do not show that the CUDA path builds. Triton ships
``ptxas``; ``triton.compile`` with an explicit target goes all the way to a cubin here, and
``ptxas -v`` on its PTX reports registers and spills. It runs in a subprocess because
``TRITON_INTERPRET=1`` replaces ``@triton.jit`` functions at import time.

The kernels are checked as the JIT specializes them at run time for a channels-last tensor: unit
channel stride, the other strides, the channel count and the pointers divisible by 16. Their tile
loads along the channels must be vector loads (``ld.global.v2/.v4``). The sample covers 2-D
(``BLOCK_T=1``) and 3-D (``BLOCK_T>1``) tiles of both kernels; ``tools/kernel_resources.py`` has
every configuration.
"""
from __future__ import annotations

import pytest
from compile_only import run_compile_script

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

from ppma.kernels.polyline_scan import plane_scan  # noqa: E402

# Shared memory of the smallest-memory supported GPUs (sm_86/sm_89); the kernels must fit it.
SHARED_LIMIT = 101_376

SCRIPT = r"""
import dataclasses, json, os, re, subprocess, sys, tempfile
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ppma.kernels.polyline_scan import plane_scan

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def resources(compiled, arch):
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(compiled.asm["ptx"])
        f.flush()
        log = subprocess.run([PTXAS, f"-arch=sm_{arch}a" if arch == 90 else f"-arch=sm_{arch}", "-v", f.name,
                              "-o", os.devnull], capture_output=True, text=True, check=True).stderr
    return {"regs": int(re.search(r"Used (\d+) registers", log).group(1)),
            "spills": int(re.search(r"(\d+) bytes spill stores", log).group(1)),
            "shared": compiled.metadata.shared,
            "vector_loads": sorted(set(re.findall(r"ld\.global(?:\.\w+)*\.(v[24])\.", compiled.asm["ptx"])))}


def as_fp32(case):  # the fp32 twin of a bf16 case (the resource table has no 3-D fp32 rows)
    signature = {n: t.replace("bf16", "fp32") for n, t in case.signature.items()}
    return dataclasses.replace(case, name=case.name.replace(" | bf16 ", " | fp32 "), signature=signature)


# A sample of the fused kernels' bf16 cases, 2-D and 3-D alternating, and 3-D fp32 (the most
# registers) at the widest tiles of both kernels.
bf16 = [c for c in plane_scan.compile_cases() if " | bf16 " in c.name]
sample = bf16[::7]
widest = [c for c in bf16 if "BLOCK_T=1 " not in c.name and "TILE_H=1 " in c.name]
out = {}
for arch in (80, 90):
    for case in sample + [as_fp32(c) for c in widest]:
        sig, consts = dict(case.signature), dict(case.constexprs)
        for name in [n for n in sig if n.startswith("s") and n.endswith("c")]:  # channel strides
            sig[name], consts[name] = "constexpr", 1
        sig.update({k: "constexpr" for k in consts})
        attrs = {(case.kernel.arg_names.index(n),): [["tt.divisibility", 16]]
                 for n, t in sig.items() if t != "constexpr" and n not in ("heads", "T", "H", "W")}
        compiled = triton.compile(ASTSource(fn=case.kernel, signature=sig, constexprs=consts, attrs=attrs),
                                  target=GPUTarget("cuda", arch, 32),
                                  options=dict(num_warps=case.num_warps, num_stages=case.num_stages))
        out[f"sm_{arch} {case.name}"] = resources(compiled, arch)
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def compiled():
    if not plane_scan.compiler_fuses():
        pytest.skip(f"Triton {plane_scan.triton.__version__} runs the 1-D passes, never these kernels (plane_scan.FUSED_SINCE)")
    return run_compile_script(SCRIPT)


# Known: the 3-D fp32 forward's 1-row tiles (the only forward tile of 128-token 3-D rows) spill 4
# bytes on sm_90 at 80 registers as the JIT specializes a channels-last tensor (the table's
# generic-stride compile: none). ptxas keeps three 8-warp programs an SM there (maxnreg=88 compiles
# it without spills, two programs an SM); any more spills fail here.
KNOWN_SPILLS = {"sm_90 polyline_scan.plane_scan._plane_fwd_kernel | fp32 acc fp32 V2H=True H2V=True BLOCK_T=4 "
                "BLOCK_W=32 | BLOCK_C=8 TILE_H=1 w8 s3": 4}


def test_fused_kernels_fit_without_spills_and_load_vectors(compiled):
    fused = compiled
    assert len(fused) >= 8, sorted(fused)
    for kernel in ("_plane_fwd_kernel", "_plane_bwd_kernel"):
        for frames in ("BLOCK_T=1 ", "BLOCK_T=4 "):
            assert any(kernel in name and frames in name for name in fused), f"no {kernel} {frames}case: {sorted(fused)}"
    for name, r in fused.items():
        assert r["spills"] <= KNOWN_SPILLS.get(name, 0), f"{name} spills: {r}"
        assert r["shared"] <= SHARED_LIMIT, f"{name} needs {r['shared']} bytes of shared memory"
        assert r["vector_loads"], f"{name}: no ld.global.v2/.v4 in its PTX"
