"""``polyline_linear_attention_tiled`` (row strips, states carried per column) against the
reference: values and every gradient, odd grids, H != W, batch 1, strips of 1 row to more than
the grid, decays from near 0 to -30."""
import pytest
import torch

from ppma.ops.polyline_linear_attention_impl import polyline_linear_attention_reference
from ppma.ops.polyline_linear_attention_impl.tiled import polyline_linear_attention_tiled

NAMES = ["out", "q", "k", "v", "log_alpha", "log_beta"]


def make_inputs(grid, dtype=torch.float64, batch=1, heads=2, d=4, dv=3, strong=False):
    """Positive features q, k, values v and decays ``(log_alpha, log_beta)``; ``strong``: log
    decays log-uniform in magnitude from 1e-6 to 30."""
    q, k = (torch.rand(batch, heads, *grid, d, dtype=dtype) + 0.1 for _ in range(2))
    v = torch.randn(batch, heads, *grid, dv, dtype=dtype)
    if strong:
        decays = [-(10 ** (torch.rand(batch, heads, *grid, dtype=torch.float64) * 7.477 - 6)) for _ in range(2)]
    else:
        decays = [-torch.rand(batch, heads, *grid, dtype=torch.float64) * 2 for _ in range(2)]
    return [q, k, v, *(d.to(torch.float32 if dtype != torch.float64 else dtype) for d in decays)]


def values_and_grads(fn, inputs, grad):
    inputs = [t.detach().requires_grad_() for t in inputs]
    out = fn(*inputs)
    return [out, *torch.autograd.grad(out, inputs, grad)]


@pytest.mark.parametrize("grid, rows", [((7, 9), 2), ((7, 9), 3), ((9, 7), None), ((1, 9), 2), ((9, 1), 4),
                                        ((5, 6), 1), ((5, 6), 8)], ids=str)
def test_matches_reference(grid, rows):
    inputs = make_inputs(grid, batch=2 if rows == 2 else 1)
    grad = torch.randn_like(inputs[2])
    got = values_and_grads(lambda *t: polyline_linear_attention_tiled(*t, rows=rows), inputs, grad)
    want = values_and_grads(polyline_linear_attention_reference, inputs, grad)
    for name, g, w in zip(NAMES, got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10 * w.abs().max().item(), msg=lambda m, name=name: f"{name}: {m}")


def test_strong_decays_fp32():
    """fp32, decays down to exp(-30): products of decays, nothing overflows or cancels."""
    inputs = make_inputs((7, 9), dtype=torch.float32, strong=True)
    grad = torch.randn_like(inputs[2])
    got = values_and_grads(lambda *t: polyline_linear_attention_tiled(*t, rows=3), inputs, grad)
    want = values_and_grads(polyline_linear_attention_reference, [t.double() for t in inputs], grad.double())
    for name, g, w in zip(NAMES, got, want):
        assert torch.isfinite(g).all(), name
        err = ((g.double() - w).abs().max() / w.abs().max()).item()
        assert err < 1e-5, f"{name}: relative error {err:.2e}"


def test_fp16_inputs_give_fp16():
    inputs = make_inputs((5, 7), dtype=torch.float16)
    out = polyline_linear_attention_tiled(*inputs)
    want = polyline_linear_attention_reference(*[t.float() for t in inputs])
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


def test_3d_grids_are_refused():
    q, k, v, la, lb = make_inputs((2, 3, 4))
    with pytest.raises(ValueError, match="2-D grids only"):
        polyline_linear_attention_tiled(q, k, v, la, lb, la)
