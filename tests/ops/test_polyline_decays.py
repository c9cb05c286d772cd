"""``polyline_decays``: the reference against the formula, the Triton kernels against the reference
(values and every gradient), and the errors that name the argument."""
import pytest
import torch
import torch.nn.functional as F

from ppma.ops import polyline_decays
from ppma.ops.polyline_decays_impl import polyline_decays_reference


def inputs(grid, heads, d, axes, dtype=torch.float32, batch=2):
    x = torch.randn(batch, *grid, heads * d, dtype=dtype, requires_grad=True)
    weight = (torch.randn(axes, d, dtype=torch.float64) / d**0.5).to(dtype if dtype == torch.float64 else torch.float32)
    dt_bias = torch.rand(heads, dtype=weight.dtype) * 4 - 6  # softplus(dt_bias) in Mamba-2's range, and below
    A_log = torch.rand(heads, dtype=weight.dtype) * 0.5
    return x, weight.requires_grad_(), dt_bias.requires_grad_(), A_log.requires_grad_()


def test_reference_is_the_formula_per_head_and_axis():
    x, weight, dt_bias, A_log = inputs((3, 4), 3, 5, 2, torch.float64)
    out = polyline_decays_reference(x, weight, dt_bias, A_log)
    assert out.shape == (2, 2, 3, 3, 4) and out.is_contiguous() and (out <= 0).all()
    for a in range(2):
        for h in range(3):
            u = x[..., h * 5:(h + 1) * 5] @ weight[a] + dt_bias[h]
            torch.testing.assert_close(out[a, :, h], -F.softplus(u) * A_log[h].exp())


def outputs_and_gradients(backend, x, weight, dt_bias, A_log):
    out = polyline_decays(x, weight, dt_bias, A_log, backend=backend)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    return (out, *torch.autograd.grad((out * weights).sum(), [x, weight, dt_bias, A_log]))


@pytest.mark.parametrize("grid,heads,d,axes,batch", [
    ((7, 9), 3, 4, 2, 2),      # odd grid, heads and a head dim below the tile's padding
    ((9, 7), 4, 20, 2, 1),     # H != W, batch 1, a head dim that is not a power of two
    ((70, 3), 4, 16, 2, 2),    # 210 tokens: four token tiles, the last one partial
    ((2, 3, 4), 2, 8, 3, 1),   # a 3-D grid, three axes
    ((5, 6), 8, 4, 1, 2),      # one decay shared by the axes
])
def test_triton_kernels_match_the_reference(grid, heads, d, axes, batch):
    torch.manual_seed(0)
    args = inputs(grid, heads, d, axes, batch=batch)
    want = outputs_and_gradients("torch", *args)
    got = outputs_and_gradients("triton", *args)
    for name, g, w in zip(("out", "dx", "dweight", "ddt_bias", "dA_log"), got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.is_contiguous(), name
        # sums over hundreds of tokens (dweight, ddt_bias, dA_log): absolute error at fp32's rounding of their scale
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6 * w.abs().max().item(), msg=name)


def test_triton_kernels_keep_float64():
    torch.manual_seed(0)
    args = inputs((5, 6), 4, 16, 2, torch.float64, batch=1)
    for g, w in zip(outputs_and_gradients("triton", *args), outputs_and_gradients("torch", *args)):
        assert g.dtype == torch.float64
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_tokens_against_the_reference_on_their_values(dtype):
    """Half-precision tokens: the kernels read them and compute in fp32, as the reference does on
    their values in fp32; ``dx`` comes back in their dtype."""
    torch.manual_seed(0)
    x, weight, dt_bias, A_log = inputs((7, 9), 4, 8, 2)
    low = x.detach().to(dtype).requires_grad_()
    got = outputs_and_gradients("triton", low, weight, dt_bias, A_log)
    want = outputs_and_gradients("torch", low.detach().float().requires_grad_(), weight, dt_bias, A_log)
    assert got[0].dtype == torch.float32 and got[1].dtype == dtype
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w, rtol=1e-2, atol=1e-2)


def test_errors_name_the_argument():
    x, weight, dt_bias, A_log = (t.detach() for t in inputs((3, 4), 2, 4, 2))
    with pytest.raises(ValueError, match="weight must have shape"):
        polyline_decays(x, weight[:, :3], dt_bias, A_log)
    with pytest.raises(ValueError, match="weight must have shape"):
        polyline_decays(x, torch.zeros(4, 4), dt_bias, A_log)
    with pytest.raises(ValueError, match="dt_bias and A_log"):
        polyline_decays(x, weight, dt_bias, A_log[:1])
    with pytest.raises(ValueError, match="x must have shape"):
        polyline_decays(x[:, 0, 0], weight, dt_bias, A_log)
    with pytest.raises(ValueError, match="A_log must be a floating-point tensor"):
        polyline_decays(x, weight, dt_bias, A_log.long())
    with pytest.raises(ValueError, match="x must have shape"):
        polyline_decays(x[:, :0], weight, dt_bias, A_log)
