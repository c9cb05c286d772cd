"""``rotary_qk``: the reference against the rotation written out per channel pair, the Triton kernel
against the reference (values and gradients, on contiguous tensors and on the layer's views of one
GEMM's output), and the errors that name the argument."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ppma.layers.rope import raster_rotation
from ppma.ops import rotary_qk
from ppma.ops.rotary_qk_impl import rotary_qk_reference


def table(grid, d):
    return torch.view_as_real(raster_rotation(tuple(grid), d, 10000.0, torch.device("cpu")))


def test_reference_rotates_each_pair_and_scales_k():
    q, k = torch.randn(2, 3, 4, 5, 6, dtype=torch.float64), torch.randn(2, 3, 4, 5, 6, dtype=torch.float64)
    rotation = table((4, 5), 6)
    q_rot, k_rot = rotary_qk_reference(q, k, rotation, 0.5)
    cos, sin = rotation[..., 0].double(), rotation[..., 1].double()
    for x, scale, got in ((q, 1.0, q_rot), (k, 0.5, k_rot)):
        even, odd = scale * x[..., 0::2], scale * x[..., 1::2]
        torch.testing.assert_close(got[..., 0::2], even * cos - odd * sin)
        torch.testing.assert_close(got[..., 1::2], odd * cos + even * sin)
        assert got.is_contiguous()


def qk(shape, dtype, views):
    """``q``, ``k`` and the leaves their gradients reach: two tensors, or views of one
    ``(B, *grid, 3, heads, d)`` tensor as the layer makes them."""
    b, heads, *grid, d = shape
    if not views:
        q, k = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(2))
        return q, k, [q, k]
    leaf = torch.randn(b, *grid, 3, heads, d, dtype=dtype, requires_grad=True)
    q, k, _ = leaf.movedim((-3, -2), (0, 2)).unbind(0)
    return q, k, [leaf]


def outputs_and_gradients(backend, q, k, leaves, rotation, scale):
    outs = rotary_qk(q, k, rotation, scale, backend=backend)
    weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i), dtype=o.dtype) for i, o in enumerate(outs)]
    return (*outs, *torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, weights)), leaves))


@pytest.mark.parametrize("shape,views", [
    ((2, 3, 7, 9, 8), False),      # odd grid
    ((1, 2, 9, 7, 20), True),      # H != W, batch 1, d / 2 not a power of two, the layer's views
    ((2, 4, 70, 3, 16), True),     # 210 tokens: several token tiles, the last one partial
    ((2, 2, 2, 3, 4, 16), True),   # a 3-D grid
])
def test_triton_kernel_matches_the_reference(shape, views):
    torch.manual_seed(0)
    q, k, leaves = qk(shape, torch.float32, views)
    rotation = table(shape[2:-1], shape[-1])
    want = outputs_and_gradients("torch", q, k, leaves, rotation, 0.3)
    got = outputs_and_gradients("triton", q, k, leaves, rotation, 0.3)
    for name, g, w in zip(("q_rot", "k_rot", "grad", "grad"), got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=name)
    assert got[0].is_contiguous() and got[1].is_contiguous()


class Passing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_cpu_kernel_under_a_dispatch_mode():
    """Under a dispatch mode (an op counter) the CPU kernel's backward gives the torch backend's
    gradients: a lazy conjugate (``conj()``) of the table was lost there and rotated them the wrong way."""
    torch.manual_seed(0)
    q, k, leaves = qk((1, 2, 3, 5, 4), torch.float32, False)
    rotation = table((3, 5), 4)
    want = outputs_and_gradients("torch", q, k, leaves, rotation, 0.5)
    with Passing():
        got = outputs_and_gradients("cpu", q, k, leaves, rotation, 0.5)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-7), (torch.float16, 1e-2), (torch.bfloat16, 1e-2)])
def test_other_dtypes(dtype, tolerance):
    """fp64 computed in fp64 (``k_scale`` an fp32 number in the kernel: 1e-7); half precision in fp32,
    against the reference on the same values (which scales ``k`` in its dtype first)."""
    torch.manual_seed(0)
    q, k, leaves = qk((2, 2, 5, 6, 32), dtype, True)
    rotation = table((5, 6), 32)
    for g, w in zip(outputs_and_gradients("triton", q, k, leaves, rotation, 0.3),
                    outputs_and_gradients("torch", q, k, leaves, rotation, 0.3)):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), w.double(), rtol=tolerance, atol=tolerance)


def test_errors_name_the_argument():
    q, k = torch.randn(1, 2, 3, 4, 8), torch.randn(1, 2, 3, 4, 8)
    rotation = table((3, 4), 8)
    with pytest.raises(ValueError, match="k must be a tensor like q"):
        rotary_qk(q, k.double(), rotation)
    with pytest.raises(ValueError, match="even d"):
        rotary_qk(q[..., :7], k[..., :7], rotation)
    with pytest.raises(ValueError, match="rotation must be an fp32 tensor of shape"):
        rotary_qk(q, k, rotation[:2])
    with pytest.raises(ValueError, match="rotation must be an fp32 tensor of shape"):
        rotary_qk(q, k, rotation.double())
    with pytest.raises(ValueError, match="q must be a floating-point tensor"):
        rotary_qk(q.long(), k, rotation)
