"""The selective-scan kernels compile for sm_80 and sm_90 without a GPU: no register spills,
shared memory within 101,376 bytes (the least of the supported GPUs'), and vector loads along the
contiguous axis.

``triton.compile`` with an explicit target runs Triton's bundled ``ptxas`` on this CPU machine;
``ptxas -v`` with Triton's options (:func:`ppma.kernels.common.resources.ptxas_usage`) reports
registers and spills. The cases are the ones
``compile_cases()`` lists (every configuration; the resource table compiles them all), a few
here: bf16, forward and backward, the first configuration (the one the interpreter runs) with
``N`` of 1 and 16 on sequences, the first 16 channels wide on VMamba's routes (``N = 1``); sm_90
all, sm_80 the sequences with ``N = 1``. Divisibility by 16 of the pointers, sizes
and strides is declared as Triton's launcher specializes it for contiguous inputs with ``L`` and
``dim`` multiples of 16 (VMamba-T's 3136 positions and 192 channels). In a subprocess:
``TRITON_INTERPRET`` acts at import time.
"""
from __future__ import annotations

import pytest
from compile_only import run_compile_script

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

SCRIPT = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ppma.kernels.common.resources import ptxas_usage  # ptxas -v with Triton's options
from ppma.kernels.selective_scan import compile_cases

UNALIGNED = ("N", "G", "n_tiles", "height", "width")  # sizes not multiples of 16 in general
picked = {}
for case in compile_cases():  # bf16; the first configuration (the routes: the first 16 channels wide)
    kernel, variant, config = case.name.split(" | ")
    routes = variant == "bf16 N<=1 routes" and config.startswith("BLOCK_D=16 ")
    if variant in ("bf16 N<=1", "bf16 N<=16") or routes:
        picked.setdefault((kernel, variant), case)
out = {}
for arch, keys in ((90, list(picked)), (80, [k for k in picked if k[1] == "bf16 N<=1"])):
    for case in (picked[k] for k in keys):
        signature = dict(case.signature, **{k: "constexpr" for k in case.constexprs})
        attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(case.kernel.arg_names)
                 if name in case.signature and name not in UNALIGNED}
        compiled = triton.compile(ASTSource(fn=case.kernel, signature=signature, constexprs=case.constexprs,
                                            attrs=attrs),
                                  target=GPUTarget("cuda", arch, 32),
                                  options=dict(num_warps=case.num_warps, num_stages=case.num_stages, **case.options))
        ptx = compiled.asm["ptx"]
        registers, spills = ptxas_usage(ptx, arch)
        out[f"sm_{arch} | {case.name} | BLOCK_T={case.constexprs['BLOCK_T']}"] = dict(
            registers=registers, spills=spills, shared=compiled.metadata.shared,
            vector_loads=len(re.findall(r"ld\.global(?:\.\w+)*\.v[24]\.", ptx)),
            scalar_16bit_loads=len(re.findall(r"ld\.global(?:\.\w+)*\.[bu]16", ptx)),
        )
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def resources():
    return run_compile_script(SCRIPT)


def test_every_case_compiles_without_spills_within_shared_memory(resources):
    assert len(resources) == 8, sorted(resources)  # sm_90: fwd, bwd x (N = 1, 16, routes); sm_80: N = 1
    for name, r in resources.items():
        assert r["spills"] == 0, f"{name}: {r}"
        assert r["shared"] <= 101_376, f"{name}: {r}"


def test_tiles_load_with_vector_instructions(resources):
    """``ld.global.v4`` / ``.v2`` along the contiguous axis (time on sequences, channels on the
    map) in every case. The forward with ``N = 1`` on sequences has no scalar 16-bit load left;
    elsewhere some remain: with ``N = 16`` a ``(BLOCK_D, BLOCK_T)`` tile of this configuration is one
    element a thread (still coalesced: neighbouring threads, neighbouring steps), the backward reads
    ``dt`` one step ahead (unaligned), the routes' ``B``/``C`` with ``N = 1`` are one value a position."""
    for name, r in resources.items():
        assert r["vector_loads"] > 0, f"{name}: {r}"
        if "_fwd_kernel | bf16 N<=1 |" in name:
            assert r["scalar_16bit_loads"] == 0, f"{name}: {r}"
