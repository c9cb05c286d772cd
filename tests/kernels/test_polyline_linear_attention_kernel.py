"""The Triton kernels of the linear polyline attention against the reference, on a GPU or in
Triton's interpreter. The strip kernels (``ppma.kernels.polyline_linear_attention``): odd grids,
H != W, 1 x W and H x 1, batch 1, several strips along both paths, fp32 and fp16. The fused
quadratic forward and backward (the vanilla kernels without the softmax): odd 2-D grids both ways,
a one-row grid, a 3-D grid, fp32 and fp16. Through the op's ``'triton'`` backend, on either
forward route and either backward route: the output and every gradient."""
import pytest
import torch
from kernel_configs import run_config

from ppma.kernels.common.runtime import triton_unavailable_reason
from ppma.ops import polyline_linear_attention
from ppma.ops.polyline_linear_attention_impl import polyline_linear_attention_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(triton_unavailable_reason(DEVICE) is not None,
                                reason="Triton cannot run here: set TRITON_INTERPRET=1 (CI does) or use a GPU")

NAMES = ["out", "q", "k", "v", "log_alpha", "log_beta"]


def make_inputs(grid, seed, dtype=torch.float32, batch=1, heads=2, d=4, dv=3):
    """Positive features q, k, values v (``dtype``) and fp32 decays ``(log_alpha, log_beta)``."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.rand(batch, heads, *grid, d, generator=gen) + 0.1 for _ in range(2))
    v = torch.randn(batch, heads, *grid, dv, generator=gen)
    decays = [-torch.rand(batch, heads, *grid, generator=gen) * 2 for _ in range(2)]
    return [t.to(DEVICE) for t in (q.to(dtype), k.to(dtype), v.to(dtype), *decays)]


def fwd(inputs, strip=None):
    from ppma.kernels.polyline_linear_attention import linear_attention_tiled_fwd

    return linear_attention_tiled_fwd(*inputs, 1e-6, strip=strip)[0]


def reference(inputs):
    return polyline_linear_attention_reference(*[t.double() for t in inputs])


def assert_close(got, want, rtol, name="out"):
    err = ((got.double() - want).abs().max() / want.abs().max()).item()
    assert err < rtol, f"{name}: relative error {err:.2e}"


# (grid, batch, strip): strips of 8 rows cut (10, 17) into 2 strips for H2V and 3 (of columns) for V2H
@pytest.mark.parametrize("grid, batch, strip", [((7, 9), 2, None), ((10, 17), 1, 8), ((1, 9), 1, None),
                                                ((9, 1), 1, None)], ids=str)
def test_forward_matches_reference_fp32(grid, batch, strip):
    inputs = make_inputs(grid, seed=sum(grid), batch=batch, heads=2 if batch == 1 and strip is None else 1)
    out = fwd(inputs, strip)
    assert out.dtype == torch.float32 and out.shape == inputs[2].shape
    assert_close(out, reference(inputs), 1e-5)


def test_forward_strong_decays_fp32():
    """Log decays log-uniform in magnitude from 1e-6 to 30 over several strips: every mask factor
    is exp of minus a non-negative difference of cumulative sums (finite, within fp32 rounding)."""
    inputs = make_inputs((10, 17), seed=17, heads=1)
    gen = torch.Generator().manual_seed(18)
    inputs[3:] = [-(10 ** (torch.rand(1, 1, 10, 17, generator=gen) * 7.477 - 6)).to(DEVICE) for _ in range(2)]
    out = fwd(inputs, strip=8)
    assert torch.isfinite(out).all()
    assert_close(out, reference(inputs), 1e-5)


def test_forward_strided_views_and_head_dims():
    """Transposed (non-raster) views of q, k, v, d = 20 and dv = 9 (padded channel blocks)."""
    inputs = make_inputs((9, 11), seed=3, heads=1, d=20, dv=9)
    views = [t.transpose(2, 3).contiguous().transpose(2, 3) for t in inputs[:3]] + inputs[3:]
    assert not views[0].is_contiguous()
    assert_close(fwd(views, strip=8), reference(inputs), 1e-5)


def test_forward_fp16():
    inputs = make_inputs((9, 10), seed=5, dtype=torch.float16, heads=1)
    out = fwd(inputs, strip=8)
    assert out.dtype == torch.float16
    assert_close(out, reference(inputs), 1e-2)


def test_forward_mixed_dtypes_run_promoted():
    """fp16 features with fp32 values (autocast can hand over such a mix): fp32 kernels, fp32 out."""
    inputs = make_inputs((5, 7), seed=7)
    mixed = [inputs[0].half(), inputs[1].half(), *inputs[2:]]
    out = fwd(mixed)
    assert out.dtype == torch.float32
    assert_close(out, reference(mixed), 1e-5)


@pytest.mark.parametrize("fused_max", [None, 0], ids=["fused", "strips"])
@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-5), (torch.float16, 1e-2)], ids=["fp32", "fp16"])
def test_op_triton_backend_values_and_gradients(dtype, rtol, fused_max, monkeypatch):
    """The op's ``'triton'`` backend on a small grid: the fused quadratic forward, or, with its
    bound at 0, the strip kernels; the fused backward passes."""
    from ppma.ops.polyline_linear_attention_impl import op

    if fused_max is not None:
        monkeypatch.setattr(op, "FUSED_FORWARD_MAX_TOKENS", fused_max)
    inputs = make_inputs((7, 9), seed=11, dtype=dtype)
    grad = torch.randn(inputs[2].shape, generator=torch.Generator().manual_seed(12)).to(DEVICE)

    def values_and_grads(fn, tensors, g):
        tensors = [t.detach().requires_grad_() for t in tensors]
        out = fn(*tensors)
        return [out, *torch.autograd.grad(out, tensors, g)]

    got = values_and_grads(lambda *t: polyline_linear_attention(*t, backend="triton"), inputs, grad.to(dtype))
    want = values_and_grads(polyline_linear_attention_reference, [t.double() for t in inputs], grad.double())
    assert got[0].dtype == dtype
    for name, g, w in zip(NAMES, got, want):
        assert_close(g, w, rtol, name)


@pytest.mark.parametrize("fused_max", [None, 0], ids=["fused", "chunked"])
@pytest.mark.parametrize("grid", [(7, 9), (2, 3, 4)], ids=str)
def test_op_triton_backward_runs_no_forward(grid, fused_max, monkeypatch):
    """The ``'triton'`` backend keeps its forward's numerator and starts its backward from it (the
    fused quadratic kernels on these small grids, or, with their bounds at 0, the 2-D strip
    kernels and the 3-D chunked path forward and the chunked path's backward): the backward
    computes no forward scan (``chunked._paths``), and every gradient (``log_gamma``'s too) is the
    reference's."""
    from ppma.ops.polyline_linear_attention_impl import chunked, op

    if fused_max is not None:
        monkeypatch.setattr(op, "FUSED_FORWARD_MAX_TOKENS", fused_max)
        monkeypatch.setattr(op, "FUSED_BACKWARD_MAX_TOKENS", fused_max)

    calls = []
    paths = chunked._paths
    monkeypatch.setattr(chunked, "_paths", lambda *a: calls.append(1) or paths(*a))
    gen = torch.Generator().manual_seed(21)
    q, k = ((torch.rand(1, 2, *grid, 4, generator=gen) + 0.1).to(DEVICE) for _ in range(2))
    v = torch.randn(1, 2, *grid, 3, generator=gen).to(DEVICE)
    decays = [(-torch.rand(1, 2, *grid, generator=gen) * 2).to(DEVICE).requires_grad_() for _ in grid]
    leaves = [t.requires_grad_() for t in (q, k, v)] + decays[::-1]
    out = polyline_linear_attention(*leaves[:5], leaves[5] if len(grid) == 3 else None, backend="triton")
    forward_calls = len(calls)
    grad = torch.randn(out.shape, generator=gen).to(DEVICE)
    grads = torch.autograd.grad(out, leaves, grad)
    assert len(calls) == forward_calls, "the backward ran the forward again"
    want_out = polyline_linear_attention_reference(*[t.detach().double() for t in leaves[:5]],
                                                   leaves[5].detach().double() if len(grid) == 3 else None)
    assert_close(out, want_out, 1e-5)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref = polyline_linear_attention_reference(*ref_leaves[:5], ref_leaves[5] if len(grid) == 3 else None)
    want = torch.autograd.grad(ref, ref_leaves, grad.double())
    for name, g, w in zip(NAMES[1:] + ["log_gamma"], grads, want):
        assert_close(g, w, 1e-5, name)


def test_op_triton_backend_opcheck():
    inputs = make_inputs((5, 7), seed=13)
    torch.library.opcheck(torch.ops.ppma.polyline_linear_attention.default, (*inputs, None, 1e-6, "triton", True))


@pytest.mark.parametrize("dtype, grid, d", [(torch.float32, (7, 18), 16), (torch.float16, (5, 33), 20)], ids=str)
def test_launches_name_rows_of_the_resource_table(dtype, grid, d, monkeypatch):
    """Every launch's variant (default strips, head dims 16 and 20; V2H's transposed grids have two
    strips) has rows for the configurations the autotuner may time: all (fp16), the first (fp32)."""
    from triton.runtime.autotuner import Autotuner

    from ppma.kernels.common import tuning

    seen = []
    run = Autotuner.run

    def recording_run(self, *args, **kwargs):
        named = {**dict(zip(self.arg_names, args)), **{k: v for k, v in kwargs.items() if k in self.arg_names}}
        seen.append((self.tuning, self.tuning.variant(tuning.launch_types(named))))
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Autotuner, "run", recording_run)
    fwd(make_inputs(grid, seed=2, dtype=dtype, heads=1, d=d, dv=d))
    table = tuning.resource_table()
    assert {t.kernel_id.rsplit(".", 1)[-1] for t, _ in seen} == {"_intra_kernel", "_edge_kernel"}  # V2H: 2 strips
    for t, variant in seen:
        configs = t.configs[:1] if dtype == torch.float32 else t.configs
        assert all(tuning.row_name(t.kernel_id, variant, c) in table for c in configs), variant


def test_bad_strip_and_dtype_are_refused():
    inputs = make_inputs((5, 7), seed=1)
    with pytest.raises(ValueError, match="power of two"):
        fwd(inputs, strip=12)
    with pytest.raises(ValueError, match="fp32, fp16 or bf16 q"):
        fwd([inputs[0].double(), *inputs[1:]])


def _grid_inputs(grid, seed, dtype, batch, heads=2, d=8, dv=5):
    """Like :func:`make_inputs` on 2-D or 3-D grids: ``(q, k, v, log_alpha, log_beta, log_gamma)``."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.rand(batch, heads, *grid, d, generator=gen) + 0.1 for _ in range(2))
    v = torch.randn(batch, heads, *grid, dv, generator=gen)
    decays = [-torch.rand(batch, heads, *grid, generator=gen) * 2 for _ in grid]
    gamma = decays[0].to(DEVICE) if len(grid) == 3 else None
    return [t.to(DEVICE) for t in (q.to(dtype), k.to(dtype), v.to(dtype), decays[-1], decays[-2])] + [gamma]


# (grid, dtype, batch): odd 2-D grids both ways, a one-row grid, a 3-D grid; fp16 at bf16-like tolerance
FUSED_CASES = [((7, 9), torch.float32, 2), ((9, 7), torch.float32, 1), ((1, 6), torch.float32, 1),
               ((2, 3, 4), torch.float32, 1), ((13, 11), torch.float16, 1)]


@pytest.mark.parametrize("grid, dtype, batch", FUSED_CASES, ids=str)
def test_fused_quadratic_backward_matches_reference(grid, dtype, batch):
    """The vanilla kernel's backward passes without the softmax (``LINEAR``) give the linear
    kind's gradients from its forward's numerator, every decay's included."""
    from ppma.kernels.polyline_attention.vanilla import linear_attention_quadratic_bwd
    from ppma.ops.polyline_linear_attention_impl import cpu

    inputs = _grid_inputs(grid, 31, dtype, batch)
    present = [t for t in inputs if t is not None]
    grad = torch.randn(inputs[2].shape, generator=torch.Generator().manual_seed(32)).to(DEVICE)
    num = cpu.numerator(*[t.float().cpu() if t is not None else None for t in inputs]).contiguous().to(DEVICE)
    got = linear_attention_quadratic_bwd(grad.to(dtype), num, *inputs)
    leaves = [t.detach().double().requires_grad_() for t in present]
    ref = polyline_linear_attention_reference(*leaves[:5], leaves[5] if len(leaves) == 6 else None)
    want = torch.autograd.grad(ref, leaves, grad.double())
    assert [g.dtype for g in got] == [t.dtype for t in present]
    for name, g, w in zip(NAMES[1:] + ["log_gamma"], got, want):
        if w.abs().max() == 0:  # a one-row grid's log_beta gets no gradient
            assert g.abs().max() == 0, name
            continue
        assert_close(g, w, 1e-5 if dtype == torch.float32 else 5e-3, name)


@pytest.mark.parametrize("grid, dtype, batch", FUSED_CASES, ids=str)
def test_fused_quadratic_forward_matches_reference(grid, dtype, batch):
    """The vanilla kernel's forward without the softmax (``LINEAR``): the output and the numerator
    ``num'`` the backward takes, as the fp64 reference's, in their dtypes and shapes."""
    from ppma.kernels.polyline_attention.vanilla import linear_attention_quadratic_fwd
    from ppma.ops.polyline_linear_attention_impl import cpu

    inputs = _grid_inputs(grid, 35, dtype, batch)
    out, num = linear_attention_quadratic_fwd(*inputs)
    fp64 = [t.double() if t is not None else None for t in inputs]
    want_num = cpu.numerator(*fp64)
    assert out.dtype == dtype and out.shape == inputs[2].shape
    assert num.dtype == torch.float32 and num.shape == want_num.shape
    rtol = 1e-5 if dtype == torch.float32 else 2e-3
    assert_close(num, want_num, rtol, "num")
    assert_close(out, polyline_linear_attention_reference(*fp64), rtol)


@pytest.mark.parametrize("lrows", [2, 4])
@pytest.mark.parametrize("grid", [(7, 9), (2, 3, 4)], ids=str)
def test_fused_quadratic_loop_tiles_of_several_rows(grid, lrows, monkeypatch):
    """The quadratic forward and backward with loop tiles of two and four image rows (GPU
    configurations; the interpreter runs a kernel's first): values and every gradient."""
    from ppma.kernels.polyline_attention import vanilla

    run_config(monkeypatch, (vanilla._fwd_kernel, vanilla._bwd_dkdv_kernel, vanilla._bwd_dq_kernel), LROWS=lrows)
    inputs = _grid_inputs(grid, 36, torch.float32, 1)
    out, num = vanilla.linear_attention_quadratic_fwd(*inputs)
    present = [t for t in inputs if t is not None]
    grad = torch.randn(inputs[2].shape, generator=torch.Generator().manual_seed(37)).to(DEVICE)
    got = vanilla.linear_attention_quadratic_bwd(grad, num, *inputs)
    leaves = [t.detach().double().requires_grad_() for t in present]
    ref = polyline_linear_attention_reference(*leaves[:5], leaves[5] if len(leaves) == 6 else None)
    assert_close(out, ref, 1e-5, "out")
    for name, g, w in zip(NAMES[1:] + ["log_gamma"], got, torch.autograd.grad(ref, leaves, grad.double())):
        assert_close(g, w, 1e-5, name)


def test_fused_quadratic_forward_mixed_dtypes_and_strided_views():
    """fp16 features with fp32 values run in fp32 (out fp32); transposed views of ``q``, ``k``,
    ``v`` with head dims 20 and 9 (padded channel blocks) and a custom ``eps``."""
    from ppma.kernels.polyline_attention.vanilla import linear_attention_quadratic_fwd

    inputs = make_inputs((5, 7), seed=36)
    mixed = [inputs[0].half(), inputs[1].half(), *inputs[2:]]
    out, _ = linear_attention_quadratic_fwd(*mixed)
    assert out.dtype == torch.float32
    assert_close(out, reference(mixed), 1e-5)
    inputs = make_inputs((9, 11), seed=37, heads=1, d=20, dv=9)
    views = [t.transpose(2, 3).contiguous().transpose(2, 3) for t in inputs[:3]] + inputs[3:]
    assert not views[0].is_contiguous()
    out, _ = linear_attention_quadratic_fwd(*views, eps=0.5)
    assert_close(out, polyline_linear_attention_reference(*[t.double() for t in inputs], eps=0.5), 1e-5)


@pytest.mark.parametrize("grid", [(5, 6), (2, 3, 4)], ids=str)
@pytest.mark.parametrize("fused_max", [None, 4], ids=["fused", "large grid"])
def test_op_triton_forward_route(grid, fused_max, monkeypatch):
    """The ``'triton'`` backend's forward: the fused quadratic kernel on grids of at most
    ``FUSED_FORWARD_MAX_TOKENS`` tokens, else the strip kernels (2-D) or the chunked path (3-D)."""
    from ppma.ops.polyline_linear_attention_impl import op

    if fused_max is not None:
        monkeypatch.setattr(op, "FUSED_FORWARD_MAX_TOKENS", fused_max)
    calls = []
    for name in ("_fused_forward", "_strip_forward", "chunked_forward"):
        original = getattr(op, name)
        monkeypatch.setattr(op, name, lambda *a, _f=original, _n=name, **kw: calls.append(_n) or _f(*a, **kw))
    inputs = _grid_inputs(grid, 38, torch.float32, 1)
    out = polyline_linear_attention(*inputs, backend="triton")
    large = "_strip_forward" if len(grid) == 2 else "chunked_forward"
    assert calls == ["_fused_forward" if fused_max is None else large]
    assert_close(out, polyline_linear_attention_reference(*[t.double() if t is not None else None for t in inputs]),
                 1e-5)


@pytest.mark.parametrize("fused_max, route", [(None, "fused"), (4, "chunked")], ids=["fused", "chunked"])
def test_op_triton_backward_route(fused_max, route, monkeypatch):
    """The ``'triton'`` backend's backward: the fused quadratic passes on grids of at most
    ``FUSED_BACKWARD_MAX_TOKENS`` tokens, else the chunked path's; gradients as the reference's."""
    from ppma.ops.polyline_linear_attention_impl import op

    if fused_max is not None:
        monkeypatch.setattr(op, "FUSED_BACKWARD_MAX_TOKENS", fused_max)
    calls = []
    for name in ("_fused_backward", "chunked_backward"):
        original = getattr(op, name)
        monkeypatch.setattr(op, name, lambda *a, _f=original, _n=name, **kw: calls.append(_n) or _f(*a, **kw))
    inputs = [t.requires_grad_() for t in _grid_inputs((5, 6), 33, torch.float32, 1)[:5]]
    grad = torch.randn(inputs[2].shape, generator=torch.Generator().manual_seed(34)).to(DEVICE)
    got = torch.autograd.grad(polyline_linear_attention(*inputs, backend="triton"), inputs, grad)
    assert calls == ["_fused_backward" if route == "fused" else "chunked_backward"]
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    want = torch.autograd.grad(polyline_linear_attention_reference(*leaves), leaves, grad.double())
    for name, g, w in zip(NAMES[1:], got, want):
        assert_close(g, w, 1e-5, name)
