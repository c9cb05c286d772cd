"""``depthwise_conv``: the reference against ``nn.Conv2d``, the Triton kernel against the reference
(values and gradients; odd grids, H != W, batch 1, 3x3 and 5x5, strided inputs, with and without
bias and the input added, fp64, fp32 and fp16, and under autocast), the layer's two arrangements
against each other, and the errors that name the argument."""
import pytest
import torch
from torch import nn

from ppma.bench.gpu import correctness
from ppma.layers import GridDepthwiseConv
from ppma.layers.paths import use_paths_of
from ppma.ops import depthwise_conv
from ppma.ops.depthwise_conv_impl import depthwise_conv_reference


def test_reference_is_nn_conv2d_on_the_channels_first_view():
    conv = nn.Conv2d(6, 6, 5, padding=2, groups=6).double()
    x = torch.randn(2, 7, 9, 6, dtype=torch.float64)
    want = conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    torch.testing.assert_close(depthwise_conv_reference(x, conv.weight, conv.bias, False), want)
    torch.testing.assert_close(depthwise_conv_reference(x, conv.weight, conv.bias, True), want + x)
    assert depthwise_conv_reference(x, conv.weight, conv.bias, True).is_contiguous()


def inputs(shape, k, bias, dtype, layout):
    """``x`` (``'contiguous'``, ``'pixels'``: every other pixel of a wider grid, ``'channels'``: every
    other channel, a non-unit channel stride), ``weight``, ``bias`` and the leaves."""
    n, h, w, c = shape
    if layout == "pixels":
        leaf = torch.randn(n, h, 2 * w, c, dtype=dtype, requires_grad=True)
        x = leaf[:, :, ::2]
    elif layout == "channels":
        leaf = torch.randn(n, h, w, 2 * c, dtype=dtype, requires_grad=True)
        x = leaf[..., 1::2]
    else:
        leaf = x = torch.randn(shape, dtype=dtype, requires_grad=True)
    weight = torch.randn(c, 1, k, k, dtype=dtype, requires_grad=True)
    b = torch.randn(c, dtype=dtype, requires_grad=True) if bias else None
    return x, weight, b, [t for t in (leaf, weight, b) if t is not None]


def outputs_and_gradients(backend, x, weight, bias, add_input, leaves):
    out = depthwise_conv(x, weight, bias, add_input, backend=backend)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(out.dtype)
    return (out, *torch.autograd.grad((out * g).sum(), leaves))


def relative_error(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


@pytest.mark.parametrize("shape,k,bias,add_input,layout", [
    ((2, 7, 9, 5), 3, True, False, "contiguous"),     # odd grid, channels below one block
    ((1, 9, 7, 20), 3, True, True, "pixels"),         # batch 1, H != W, pixel strides of a wider grid
    ((2, 5, 33, 70), 5, False, False, "channels"),    # a partial column block and channel block, no bias
    ((1, 1, 1, 16), 5, True, True, "contiguous"),     # one pixel: every tap but the centre outside
    ((3, 70, 3, 16), 3, True, True, "contiguous"),    # several row bands, the last one partial
])
def test_triton_kernel_matches_the_reference(shape, k, bias, add_input, layout):
    x, weight, b, leaves = inputs(shape, k, bias, torch.float32, layout)
    want = outputs_and_gradients("torch", x, weight, b, add_input, leaves)
    got = outputs_and_gradients("triton", x, weight, b, add_input, leaves)
    for name, g, w in zip(("out", "dx", "dweight", "dbias"), got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.is_contiguous(), name
        assert relative_error(g, w) < 1e-5, (name, relative_error(g, w))


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-12), (torch.float16, 1e-2)])
def test_triton_kernel_in_other_dtypes(dtype, tolerance):
    x, weight, b, leaves = inputs((2, 6, 11, 24), 3, True, dtype, "contiguous")
    reference_leaves = [t.detach().double().requires_grad_() for t in leaves]
    want = outputs_and_gradients("torch", *reference_leaves, True, reference_leaves)
    got = outputs_and_gradients("triton", x, weight, b, True, leaves)
    for name, g, w in zip(("out", "dx", "dweight", "dbias"), got, want):
        assert g.dtype == dtype, name
        assert relative_error(g, w) < tolerance, (name, relative_error(g, w))


@pytest.mark.parametrize("add_input", [False, True])
def test_under_autocast_the_kernel_rounds_as_the_reference_conv(add_input):
    """fp32 input and weights under fp16 autocast: the conv's products in fp16 as autocast casts
    them, its output fp16; with the input added, the promoted fp32."""
    x, weight, b, leaves = inputs((2, 5, 9, 16), 3, True, torch.float32, "contiguous")
    results = {}
    for backend in ("torch", "triton"):
        with torch.autocast("cpu", dtype=torch.float16):
            results[backend] = outputs_and_gradients(backend, x, weight, b, add_input, leaves)
    assert results["triton"][0].dtype == results["torch"][0].dtype == (torch.float32 if add_input else torch.float16)
    for name, g, w in zip(("out", "dx", "dweight", "dbias"), results["triton"], results["torch"]):
        assert g.dtype == w.dtype, name
        assert relative_error(g, w) < 1e-2, (name, relative_error(g, w))


@pytest.mark.parametrize("token_layout", ["2d", "3d"])
def test_the_layer_runs_the_op_where_a_kernel_runs_and_matches_nn_conv2d(token_layout):
    """Outside CPU inference with ``PPMA_BACKEND=triton`` the layer's conv and its residual are
    the op (counted), with the values and gradients of ``nn.Conv2d``'s arrangement."""
    conv = GridDepthwiseConv(12, 3)
    x = torch.randn((2, 3, 5, 7, 12) if token_layout == "3d" else (2, 5, 7, 12), requires_grad=True)
    results = {}
    for backend in ("torch", "triton"):
        with use_paths_of("cuda"), correctness.backend(backend):
            out = conv(x) + conv.plus_input(x)
        results[backend] = (out, *torch.autograd.grad(out.square().sum(), [x, conv.weight, conv.bias]))
    for g, w in zip(results["triton"], results["torch"]):
        assert g.shape == w.shape
        assert relative_error(g, w) < 1e-5


def test_a_hook_on_the_conv_sees_its_call_in_plus_input():
    conv = GridDepthwiseConv(8, 3)
    seen = []
    conv.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    x = torch.randn(1, 4, 5, 8)
    with use_paths_of("cuda"), correctness.backend("triton"):
        out = conv.plus_input(x)
    assert seen == [x.shape]
    torch.testing.assert_close(out, depthwise_conv_reference(x, conv.weight, conv.bias, True))


@pytest.mark.parametrize("args,message", [
    ((torch.randn(2, 4, 4), torch.randn(4, 1, 3, 3)), "x must be a floating-point \\(N, H, W, C\\)"),
    ((torch.randn(1, 4, 4, 4), torch.randn(4, 1, 2, 2)), "K odd"),
    ((torch.randn(1, 4, 4, 4), torch.randn(5, 1, 3, 3)), "C=4"),
    ((torch.randn(1, 4, 4, 4), torch.randn(4, 1, 3, 3), torch.randn(3)), "bias must be None or have shape \\(4,\\)"),
    ((torch.randn(1, 4, 4, 4), torch.randn(4, 1, 3, 3, dtype=torch.float64)), "without autocast they must match"),
])
def test_bad_input_names_the_problem(args, message):
    with pytest.raises(ValueError, match=message):
        depthwise_conv(*args)
