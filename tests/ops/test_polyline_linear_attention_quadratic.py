"""The linear kind's backward in the quadratic form against autograd through the reference: odd
2-D and 3-D grids, batch 1, heads > 1, fp32, fp64 and bf16, row chunks; and the ``'cpu'``
backend's choice between it and the chunked path's backward."""
import pytest
import torch

from ppma.ops import polyline_linear_attention
from ppma.ops.polyline_linear_attention_impl import chunked, cpu, op, polyline_linear_attention_reference, quadratic
from ppma.ops.polyline_linear_attention_impl.chunked import _with_ones

GRIDS = [(7, 9), (9, 7), (1, 5), (13, 11), (2, 3, 4), (3, 7, 5)]


def make_inputs(grid, dtype=torch.float32, batch=1, heads=2, d=4, dv=3, seed=0):
    """Positive features q, k, values v and decays ``(log_alpha, log_beta, log_gamma)``."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.rand(batch, heads, *grid, d, generator=g, dtype=dtype) + 0.1 for _ in range(2))
    v = torch.randn(batch, heads, *grid, dv, generator=g, dtype=dtype)
    decays = [-torch.rand(batch, heads, *grid, generator=g, dtype=dtype) * 2 for _ in grid]
    return q, k, v, decays[-1], decays[-2], decays[0] if len(grid) == 3 else None


def relative(got, want):
    """Largest difference over the largest ``want`` (0 where both are exactly 0: a decay along a
    one-token axis gets no gradient)."""
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-300)).item()


def reference_gradients(inputs, grad):
    inputs = [None if t is None else t.detach().double().requires_grad_() for t in inputs]
    present = [t for t in inputs if t is not None]
    return torch.autograd.grad(polyline_linear_attention_reference(*inputs), present, grad.double())


def numerator(inputs):
    """``num'`` as a forward keeps it (``(B * heads, *grid, dv + 1)``, fp32 or fp64)."""
    return cpu.numerator(*inputs).contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_dense_numerator_is_the_reference_numerator(grid, dtype):
    q, k, v, log_alpha, log_beta, log_gamma = make_inputs(grid, dtype)
    decays = [t.flatten(0, 1) for t in (log_gamma, log_beta, log_alpha) if t is not None]
    got = quadratic.dense_numerator(q.flatten(0, 1), k.flatten(0, 1), _with_ones(v.flatten(0, 1), dtype), decays)
    want = numerator((q, k, v, log_alpha, log_beta, log_gamma))
    assert relative(got, want) < (1e-5 if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("budget", [1, None], ids=["row_chunks", "default"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_gradients_match_the_reference(grid, dtype, budget):
    inputs = make_inputs(grid, dtype, batch=2, heads=1 if len(grid) == 3 else 2)
    grad = torch.randn(inputs[2].shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    got = quadratic.quadratic_backward(grad, numerator(inputs), *inputs, eps=1e-6, budget=budget)
    want = reference_gradients(inputs, grad)
    assert len(got) == len(want)
    for g, w, t in zip(got, want, [t for t in inputs if t is not None]):
        assert g.shape == t.shape and g.dtype == t.dtype
        assert relative(g, w) < (1e-5 if dtype == torch.float32 else 1e-10)


def test_bfloat16_inputs_give_their_dtype_and_fp32_accuracy():
    inputs = make_inputs((5, 6), torch.bfloat16, d=8, dv=7)
    grad = torch.randn(inputs[2].shape, generator=torch.Generator().manual_seed(1)).bfloat16()
    got = quadratic.quadratic_backward(grad, numerator(inputs), *inputs)
    want = reference_gradients(inputs, grad)
    for g, w, t in zip(got, want, inputs):
        assert g.dtype == t.dtype and relative(g, w) < 1e-2


# d = 8, dv = 7 on 5 x 6: the quadratic form is the cheaper; d = 4, dv = 3 on 13 x 11: the scans
ROUTES = {"quadratic": ((5, 6), 8, 7), "chunked": ((13, 11), 4, 3), "quadratic 3-D": ((2, 3, 4), 8, 7)}


@pytest.mark.parametrize("route", ROUTES)
def test_the_cpu_backend_takes_the_cheaper_backward(route, monkeypatch):
    """Through the custom op (``backend='cpu'``): the quadratic backward where
    :func:`cpu.quadratic_is_cheaper` says so, else the chunked one; gradients as the reference's.
    (The ``'triton'`` backend's choice: tests/kernels/test_polyline_linear_attention_kernel.py.)"""
    grid, d, dv = ROUTES[route]
    assert cpu.quadratic_is_cheaper(grid, d, dv + 1) == route.startswith("quadratic")
    calls = []
    for module, name in ((op, "quadratic_backward"), (op, "chunked_backward")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **kw: calls.append(_n) or _f(*a, **kw))
    inputs = [t if t is None else t.requires_grad_() for t in make_inputs(grid, d=d, dv=dv)]
    present = [t for t in inputs if t is not None]
    grad = torch.randn(inputs[2].shape, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(polyline_linear_attention(*inputs, backend="cpu"), present, grad)
    assert calls == ["quadratic_backward" if route.startswith("quadratic") else "chunked_backward"]
    for g, w in zip(got, reference_gradients(inputs, grad)):
        assert relative(g, w) < 1e-5


def test_opcheck_on_the_quadratic_route():
    inputs = make_inputs((5, 6), torch.float64, d=8, dv=7)
    torch.library.opcheck(torch.ops.ppma.polyline_linear_attention.default, (*inputs, 1e-6, "cpu", True))


def test_numerator_gradient_is_autograd_of_the_division():
    num = torch.rand(3, 4, 5, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 4, 4, dtype=torch.float64)
    (want,) = torch.autograd.grad(chunked.output_from_numerator(num, 1e-6, torch.float64), num, grad)
    torch.testing.assert_close(chunked.numerator_gradient(grad, num.detach(), 1e-6), want)
