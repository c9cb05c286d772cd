"""The criss-cross kind's kernels: whole lines (:mod:`ppma.kernels.polyline_attention.whole_line`,
lines of at most 64 tokens) and tiled lines (:mod:`~ppma.kernels.polyline_attention.line`,
longer ones). Values and every gradient against the reference at each line block of the
whole-line kernels (16, 32, 64 tokens) and on lines of several tiles, which kernels a grid's
axes take, and what a forward and a backward dispatch.

On the CPU through Triton's interpreter (``TRITON_INTERPRET=1``), as the other kernel tests (the
tiled kernels at their first configuration, 16-token tiles); the fp16 and bf16 criss-cross cases
and the tiled kernels' larger tiles are in ``test_polyline_attention_kernel.py``.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
    pytest.skip(
        "Triton kernels need a CUDA device or TRITON_INTERPRET=1 (CPU interpreter)", allow_module_level=True
    )

from compile_only import run_compile_script, same_minor, table_triton  # noqa: E402
from kernel_launches import Launches, aten_kernels  # noqa: E402

from ppma.bench.step_count import OpCounter  # noqa: E402
from ppma.kernels.polyline_attention import criss_cross, line, whole_line  # noqa: E402
from ppma.ops import polyline_attention, polyline_attention_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("out", "dq", "dk", "dv", "dlog_alpha", "dlog_beta", "dlog_gamma")


def inputs(batch, heads, grid, d=16, dv=16, seed=0):
    """q, k, v as the layer lays them out (heads moved out of channels-last tensors: strided
    views) and fp32 log-decays in ``[-1, 0)``."""
    torch.manual_seed(seed)
    q, k = (torch.randn(batch, *grid, heads, d, device=DEVICE).movedim(-2, 1) for _ in range(2))
    v = torch.randn(batch, *grid, heads, dv, device=DEVICE).movedim(-2, 1)
    decays = [-torch.rand(batch, heads, *grid, device=DEVICE) for _ in grid]
    return [q, k, v, decays[-1], decays[-2], decays[0] if len(grid) == 3 else None]


def run(fn, args, grad, form):
    leaves = [t if t is None else t.detach().requires_grad_() for t in args]
    out = fn(*leaves, kind="criss_cross", form=form)
    return [out, *torch.autograd.grad(out, [t for t in leaves if t is not None], grad)]


def assert_matches_reference(args, form):
    """The kernels' output and every gradient against the reference's, fp32, rtol 1e-5."""
    grad = torch.randn(args[2].shape, device=DEVICE)
    got = run(lambda *a, **kw: polyline_attention(*a, **kw, backend="triton"), args, grad, form)
    want = run(polyline_attention_reference, args, grad, form)
    for name, g, w in zip(NAMES, got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * w.abs().max().item(), msg=name)


# (B, heads, grid, form): each line block (lines of 1-16, 17-32 and 33-64 tokens), H != W, odd
# sizes, single-token lines, batch 1, 3-D grids with each axis the longest
CASES = [(1, 1, (7, 9), "official"), (2, 2, (7, 9), "paper"), (1, 2, (20, 3), "official"), (1, 1, (1, 33), "paper"),
         (2, 1, (2, 64), "official"), (1, 2, (11, 1), "official"), (1, 2, (2, 3, 5), "official"),
         (2, 1, (5, 2, 3), "paper"), (1, 1, (3, 17, 2), "official")]
# Lines longer than 64 tokens beside whole lines on the other axes: several 16-token tiles, the last
# partial (65 = 4 x 16 + 1, 90), a whole number of tiles (80), along each axis of a 2-D and of a
# 3-D grid (3-D: the first and the last), single-token lines, batch 2 and two heads. (The
# interpreter's time grows with lines x tiles^2: a grid long on two axes took minutes.)
LONG_CASES = [(1, 1, (2, 65), "official"), (2, 2, (67, 3), "paper"), (1, 1, (80, 1), "official"),
              (1, 2, (5, 90), "paper"), (1, 1, (66, 2, 3), "official"), (1, 1, (1, 3, 81), "paper")]


def case_id(case):
    return f"{case[0]}x{case[1]}-{'x'.join(map(str, case[2]))}-{case[3]}"


@pytest.mark.parametrize("case", CASES + LONG_CASES, ids=case_id)
def test_lines_match_the_reference(case):
    batch, heads, grid, form = case
    assert whole_line.fits(grid) == (case in CASES)
    assert_matches_reference(inputs(batch, heads, grid), form)


@pytest.mark.parametrize("grid", [(3, 5), (2, 67)], ids=["whole", "tiled"])
def test_head_dims_of_q_and_v_may_differ(grid):
    """``d = 20`` for ``q``, ``k`` and ``dv = 40`` for ``v`` (channel blocks 32 and 64: the
    latter has no resource-table rows and runs the first configuration), on whole and tiled lines."""
    assert_matches_reference(inputs(1, 2, grid, d=20, dv=40), "official")


def test_lines_of_at_most_64_tokens_fit():
    assert whole_line.MAX_LINE == 64
    assert whole_line.fits((64, 64)) and whole_line.fits((2, 64, 1)) and whole_line.fits((1, 1))
    assert not whole_line.fits((65, 2)) and not whole_line.fits((2, 3, 65))
    assert criss_cross._kernels(64) is whole_line and criss_cross._kernels(65) is line


@pytest.mark.parametrize("grid", [(5, 7), (2, 3, 4), (2, 66)])
def test_a_call_dispatches_one_launch_per_application(grid, monkeypatch):
    """Forward: one launch per application of an axis (4 on a 2-D grid, 6 on a 3-D one), nothing
    else, on the layer's layout (heads split from the channels: no copies); the residuals are each
    path order's intermediate products. Backward: one launch per application along whole lines,
    two along tiled ones, and no PyTorch kernel, for an output gradient in the same layout (the
    earlier tiled kernels' launchers, on copies, dispatched 4 launches and about 13 PyTorch
    kernels forward, 8 and about 49 backward)."""
    q, k, v, *decays = inputs(2, 2, grid)
    assert not v.is_contiguous()
    applications = 2 * len(grid)
    backward_launches = sum(2 * (1 if n <= whole_line.MAX_LINE else 2) for n in grid)
    launches = Launches(monkeypatch)
    with OpCounter() as forward:
        out, residuals = criss_cross.criss_cross_attention_fwd(q, k, v, *decays)
    assert (launches.count, aten_kernels(forward)) == (applications, {})
    assert len(residuals) == criss_cross.residual_count(grid) == 2 * (len(grid) - 1)
    assert all(r.shape == v.shape and r.dtype == v.dtype and r.is_contiguous() for r in residuals)
    launches.count, grad = 0, torch.randn(2, *grid, 2, 16, device=DEVICE).movedim(-2, 1)
    with OpCounter() as backward:
        grads = criss_cross.criss_cross_attention_bwd(grad, q, k, v, *decays, residuals=residuals)
    assert (launches.count, aten_kernels(backward)) == (backward_launches, {})
    assert len(grads) == 3 + len(grid)
    with pytest.raises(ValueError, match="takes the forward's"):
        criss_cross.criss_cross_attention_bwd(grad, q, k, v, *decays)


@pytest.mark.parametrize("layout", ["channels strided", "grid transposed"])
def test_other_layouts_are_copied_once(layout):
    """A tensor whose channels are not contiguous, or whose tokens are not in raster order with one
    stride, is made contiguous (:func:`whole_line.token_strides`); the split-heads view is kept."""
    t = torch.randn(2, 3, 4, 5, 6, device=DEVICE)
    view = t.transpose(-1, -2).contiguous().transpose(-1, -2) if layout == "channels strided" else t.transpose(2, 3)
    kept = torch.randn(2, 4, 5, 3, 6, device=DEVICE).movedim(-2, 1)
    assert whole_line.token_strides(kept) is kept
    copy = whole_line.token_strides(view)
    assert copy.is_contiguous() and torch.equal(copy, view)


COMPILE = r"""
import contextlib, io, json, os, re, sys, tempfile
os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"  # ptxas -v: registers and spills
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # a cache hit prints no log
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ppma.kernels.common import tuning
from ppma.kernels.polyline_attention import line, whole_line

SIZES = ("n", "inner", "image_lines", "heads", "scale")  # any value; strides and channel counts 16-divisible
VECTOR = r"ld\.global(?:\.\w+)*\.(v[24])\."
KERNELS = {"whole_line": (whole_line, (whole_line._whole_line_fwd_kernel, whole_line._whole_line_bwd_kernel)),
           "line": (line, (line._line_fwd_kernel, line._line_bwd_query_kernel, line._line_bwd_key_kernel))}
out = []
for name, variant, arch in json.loads(sys.argv[1]):
    module, kernels = KERNELS[name]
    for kernel in kernels:
        offered = {c.name.split(" | ")[2]: c for c in module.compile_cases()
                   if c.name.split(" | ")[:2] == [kernel.tuning.kernel_id, variant]}
        configs = [c for c in kernel.tuning.configs if tuning.config_label(c) in offered]
        case = offered[tuning.config_label(tuning.least_spilling(kernel.tuning, variant, configs, divmod(arch, 10))[0])]
        attrs = {(case.kernel.arg_names.index(n),): [["tt.divisibility", 16]]
                 for n, t in case.signature.items() if n not in SIZES and not n.startswith("accumulate")}
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(ASTSource(fn=case.kernel, signature=case.signature, constexprs=case.constexprs,
                                                attrs=attrs), target=GPUTarget("cuda", arch, 32),
                                      options=dict(num_warps=case.num_warps, num_stages=case.num_stages))
        spills = re.findall(r"(\d+) bytes spill stores", log.getvalue())
        out.append([case.name, arch, compiled.metadata.shared, int(spills[-1]) if spills else 0,
                    sorted(set(re.findall(VECTOR, compiled.asm["ptx"])))])
print(json.dumps(out))
"""
SHARED_MEMORY = {80: 166_912, 90: 232_448}


def test_the_kernels_compile_without_spills_and_load_rows_as_vectors():
    """The configuration a launch runs (by the resource table) of each kernel, bf16, both forms,
    head dim 32 (the whole-line kernels at 64-token lines), compiled for sm_80 and sm_90 without a
    GPU: within the shared memory, no register spills (under the table's Triton), and the rows of
    ``q``, ``k``, ``y`` and ``dO`` loaded as 16-byte vectors when the strides and channel counts are
    multiples of 16."""
    import triton

    wanted = [[module, f"bf16 {form}{block} d<=32", arch] for module, block in (("whole_line", " line<=64"), ("line", ""))
              for form in ("official", "paper") for arch in (80, 90)]
    rows = run_compile_script(COMPILE, json.dumps(wanted))
    assert len(rows) == sum(2 if module == "whole_line" else 3 for module, _, _ in wanted), rows
    for name, arch, shared, spills, vectors in rows:
        assert shared <= SHARED_MEMORY[arch], f"{name} on sm_{arch}: {shared} bytes of shared memory"
        if same_minor(triton.__version__, table_triton()):
            assert spills == 0, f"{name} on sm_{arch}: {spills} bytes of register spills"
        assert vectors == ["v4"], f"{name} on sm_{arch}: vector loads {vectors}"
