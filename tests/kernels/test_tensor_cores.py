"""The attention kernels' products run on tensor cores in bf16 with fp32 accumulation (issue 33):
each kernel with a ``tl.dot``, compiled for sm_80 and sm_90 at the first configuration of its bf16
variant in the resource table's cases, has bf16 matrix instructions in its PTX (``mma.sync`` on
sm_80, ``wgmma``'s ``mma_async`` or ``mma.sync`` on sm_90) and no tf32 or fp16 ones: no operand was
widened to fp32 or narrowed to fp16 before its product. In a subprocess without ``TRITON_INTERPRET``."""
from __future__ import annotations

import pytest
from compile_only import run_compile_script

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

# the kernels with products: vanilla forward and both backward passes, the whole-line and tiled-line
# criss-cross kernels, the linear kind's strip kernels
KERNELS = (
    "polyline_attention.vanilla._fwd_kernel", "polyline_attention.vanilla._bwd_dkdv_kernel",
    "polyline_attention.vanilla._bwd_dq_kernel", "polyline_attention.whole_line._whole_line_fwd_kernel",
    "polyline_attention.whole_line._whole_line_bwd_kernel", "polyline_attention.line._line_fwd_kernel",
    "polyline_attention.line._line_bwd_query_kernel", "polyline_attention.line._line_bwd_key_kernel",
    "polyline_linear_attention.tiled._intra_kernel", "polyline_linear_attention.tiled._edge_kernel",
)

SCRIPT = r"""
import collections
import json
import re
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ppma.kernels.common import resources

first = {}
for name, case in resources.all_cases().items():
    kernel, variant, _ = name.split(" | ")
    if kernel in sys.argv[1:] and variant.startswith("bf16") and case.same_as is None:
        first.setdefault(kernel, case)
out = {}
for kernel, case in first.items():
    signature = {**case.signature, **{k: "constexpr" for k in case.constexprs}}
    for arch in (80, 90):
        compiled = triton.compile(ASTSource(fn=case.kernel, signature=signature, constexprs=case.constexprs),
                                  target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": case.num_warps, "num_stages": case.num_stages, **case.options})
        found = re.findall(r"\b(?:mma\.sync|mma_async\.sync)\.aligned\.[\w.]+", compiled.asm["ptx"])
        out[f"{case.name} sm_{arch}"] = dict(collections.Counter(found))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def instructions():
    return run_compile_script(SCRIPT, *KERNELS)


def test_every_product_is_a_bf16_tensor_core_instruction(instructions):
    assert {name.split(" | ")[0] for name in instructions} == set(KERNELS)
    assert len(instructions) == 2 * len(KERNELS)
    for name, found in instructions.items():
        assert found, f"{name}: no tensor-core instruction"
        assert all(".bf16.bf16" in i and ".f32" in i for i in found), f"{name}: {found}"
        assert not any(t in i for i in found for t in (".tf32", ".f16.f16")), f"{name}: {found}"


def test_hopper_runs_the_vanilla_kernels_on_warpgroup_instructions(instructions):
    """On sm_90 the vanilla kernels' tiles (64 rows) compile to ``wgmma`` (``mma_async``), Hopper's
    warpgroup products; the line kernels' small tiles keep ``mma.sync``."""
    vanilla = {n: f for n, f in instructions.items() if n.startswith("polyline_attention.vanilla.") and n.endswith("sm_90")}
    assert len(vanilla) == 3
    assert all(any(i.startswith("mma_async") for i in f) for f in vanilla.values()), vanilla
