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
