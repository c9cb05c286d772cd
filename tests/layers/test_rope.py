import pytest
import torch

from ppma.layers import RasterRotaryEmbedding
from ppma.layers.grid_tables import CACHED_GRIDS
from ppma.layers.rope import raster_rotation


def test_matches_complex_rotation_by_raster_index():
    d, h, w = 8, 3, 5
    rope = RasterRotaryEmbedding(d)
    x = torch.randn(2, 4, h, w, d, dtype=torch.float64)
    theta = 10000.0 ** -torch.linspace(0, 1, d // 2, dtype=torch.float64)
    pos = torch.arange(h * w, dtype=torch.float64).reshape(h, w)
    z = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())
    expected = torch.view_as_real(z * torch.polar(torch.ones_like(pos[..., None] * theta), pos[..., None] * theta))
    torch.testing.assert_close(rope(x), expected.flatten(-2), rtol=1e-6, atol=1e-6)


def test_relative_positions_and_norm():
    rope = RasterRotaryEmbedding(16, grid_rank=3)
    q = torch.randn(16, dtype=torch.float64).expand(2, 3, 4, 16)
    k = torch.randn(16, dtype=torch.float64).expand(2, 3, 4, 16)
    rq, rk = rope(q).flatten(0, 2), rope(k).flatten(0, 2)  # raster order over (T, H, W)
    torch.testing.assert_close(rq.norm(dim=-1), q.flatten(0, 2).norm(dim=-1))
    # <rope(q)_p, rope(k)_m> depends only on p - m
    dots = rq @ rk.T
    offset3 = torch.diagonal(dots, 3)
    torch.testing.assert_close(offset3, torch.full_like(offset3, dots[0, 3].item()), rtol=1e-5, atol=1e-5)


def test_odd_head_dim_raises():
    with pytest.raises(ValueError, match="head_dim"):
        RasterRotaryEmbedding(7)


def _release_rotation(x, sin, cos):
    """The release's real form: ``x * cos + rotate_every_two(x) * sin``."""
    rotated = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    return x * cos + rotated * sin


@pytest.mark.parametrize("inplace", [None, False, True])
@pytest.mark.parametrize("shape", [(1, 2, 7, 9, 16), (3, 1, 9, 7, 8)])
def test_equals_release_form_values_and_gradients(shape, inplace):
    torch.manual_seed(0)
    d, (h, w) = shape[-1], shape[-3:-1]
    rope = RasterRotaryEmbedding(d)
    angle = torch.arange(h * w, dtype=torch.float32)[:, None] * rope.theta
    sin, cos = angle.sin().reshape(h, w, d), angle.cos().reshape(h, w, d)
    q = torch.randn(shape, requires_grad=True)
    k = torch.randn(shape, requires_grad=True)
    rq, rk = rope(q, k) if inplace is None else rope(q * 1.0, k * 1.0, inplace=inplace)
    eq, ek = _release_rotation(q, sin, cos), _release_rotation(k, sin, cos)
    torch.testing.assert_close(rq, eq, rtol=1e-6, atol=1e-6, msg="seed 0")
    torch.testing.assert_close(rk, ek, rtol=1e-6, atol=1e-6, msg="seed 0")
    g = torch.randn(shape)
    grads = torch.autograd.grad((rq * g).sum() + rk.sum(), (q, k))
    expected = torch.autograd.grad((eq * g).sum() + ek.sum(), (q, k))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg="seed 0")


def test_half_precision_and_strided_inputs():
    torch.manual_seed(0)
    rope = RasterRotaryEmbedding(8)
    x = torch.randn(2, 5, 3, 8)
    y = rope(x)
    half = rope(x.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), y, rtol=2e-2, atol=2e-2, msg="seed 0")
    assert rope(x.to(torch.bfloat16), inplace=True).dtype == torch.bfloat16  # a new tensor
    strided = torch.randn(2, 3, 5, 8).transpose(1, 2)  # (2, 5, 3, 8), not contiguous
    torch.testing.assert_close(rope(strided), rope(strided.contiguous()), rtol=0, atol=0, msg="seed 0")
    copy = x.clone()
    assert rope(copy, inplace=True) is copy
    torch.testing.assert_close(copy, y, rtol=0, atol=0, msg="seed 0")


def test_rotation_is_kept_for_the_latest_grids_of_eager_calls():
    raster_rotation.cache_clear()
    rope, cpu = RasterRotaryEmbedding(8), torch.device("cpu")
    first = rope.rotation((3, 5), cpu)
    assert rope.rotation((3, 5), cpu) is first and raster_rotation((3, 5), 8, 10000.0, cpu) is first
    index = torch.arange(15, dtype=torch.float32)[:, None] * rope.theta[::2]
    torch.testing.assert_close(first, torch.complex(index.cos(), index.sin()).reshape(3, 5, 4), rtol=0, atol=0)
    for width in range(6, 6 + CACHED_GRIDS):  # as many newer grids as are kept
        rope.rotation((3, width), cpu)
    again = rope.rotation((3, 5), cpu)
    assert again is not first
    torch.testing.assert_close(again, first, rtol=0, atol=0)


def test_rotation_of_an_inference_call_is_usable_by_training():
    raster_rotation.cache_clear()
    rope = RasterRotaryEmbedding(8)
    x = torch.randn(1, 2, 3, 5, 8, requires_grad=True)
    with torch.inference_mode():
        expected = rope(x.detach())
    assert not rope.rotation((3, 5), x.device).is_inference()
    out = rope(x)  # an inference tensor saved for the backward would raise here
    out.sum().backward()
    torch.testing.assert_close(out.detach(), expected, rtol=0, atol=0)


def test_calls_on_fake_tensors_compute_the_rotation():
    """As ``torch.export`` runs the layer, its tensors fake: nothing fake is kept for later calls."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    raster_rotation.cache_clear()
    rope = RasterRotaryEmbedding(8)
    with FakeTensorMode(allow_non_fake_inputs=True):  # the module real, its input fake
        assert rope(torch.randn(1, 2, 3, 5, 8)).shape == (1, 2, 3, 5, 8)
    table = rope.rotation((3, 5), torch.device("cpu"))
    assert type(table) is torch.Tensor and table.abs().min() > 0.99
