import pytest
import torch

from ppma.layers import RasterRotaryEmbedding


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
