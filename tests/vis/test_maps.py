"""ppma.vis.maps: per-query mask rows and implied attention rows against dense references."""
import math

import pytest
import torch
from torch import nn

from ppma.layers import PolylineAttention
from ppma.ops import polyline_mask
from ppma.vis import attention_row, capture_attention, grid_query, mask_row


def _decays(shape, seed, three_d=False):
    g = torch.Generator().manual_seed(seed)
    n = 3 if three_d else 2
    return [-torch.rand(1, 2, *shape, generator=g) * 1.5 for _ in range(n)]


def _flat(query, shape):
    return sum(q * math.prod(shape[i + 1 :]) for i, q in enumerate(query))


@pytest.mark.parametrize("shape", [(7, 9), (1, 6), (5, 1), (3, 4, 5)])
@pytest.mark.parametrize("order", ["v2h", "h2v", "both"])
def test_mask_row_is_a_row_of_the_materialized_mask(shape, order):
    seed = torch.initial_seed()
    decays = _decays(shape, seed, three_d=len(shape) == 3)
    full = polyline_mask(decays[0], decays[1], order, *decays[2:])
    for query in [(0,) * len(shape), tuple(s - 1 for s in shape), tuple(s // 2 for s in shape)]:
        row = mask_row(decays[0], decays[1], query, order, *decays[2:])
        assert row.shape == (1, 2, *shape)
        torch.testing.assert_close(row.flatten(2), full[:, :, _flat(query, shape)], rtol=1e-5, atol=1e-7)


def test_both_mask_row_peaks_at_the_query_and_is_symmetric():
    seed = torch.initial_seed()
    la, lb = _decays((7, 9), seed)
    queries = [(0, 0), (3, 4), (6, 8), (2, 7)]
    rows = {q: mask_row(la, lb, q, "both") for q in queries}
    for q, row in rows.items():
        # L2D = L + L^T has 2 on the diagonal and entries <= 1 + 1 elsewhere, with equality only
        # where the decays are exactly 1; random decays < 1 make the query the unique peak.
        assert row[0, 0].flatten().argmax().item() == _flat(q, (7, 9))
        torch.testing.assert_close(row[:, :, q[0], q[1]], torch.full((1, 2), 2.0))
        for p in queries:
            torch.testing.assert_close(row[:, :, p[0], p[1]], rows[p][:, :, q[0], q[1]])
    # The one-way masks are each other's transpose: L_v2h[q, p] = L_h2v[p, q].
    v2h = mask_row(la, lb, (2, 7), "v2h")
    h2v = mask_row(la, lb, (5, 1), "h2v")
    torch.testing.assert_close(v2h[:, :, 5, 1], h2v[:, :, 2, 7])


@pytest.mark.parametrize(
    "kind, layout, shape, form",
    [
        ("vanilla", "2d", (5, 7), "official"),
        ("vanilla", "2d", (7, 5), "paper"),
        ("criss_cross", "2d", (5, 7), "official"),
        ("criss_cross", "2d", (6, 3), "paper"),
        ("linear", "2d", (5, 7), None),
        ("vanilla", "3d", (3, 4, 5), "official"),
        ("criss_cross", "3d", (2, 3, 5), "official"),
        ("linear", "3d", (3, 4, 5), None),
    ],
)
def test_attention_row_equals_the_layers_attention(kind, layout, shape, form, dense_oracle):
    layer = PolylineAttention(32, 2, kind=kind, token_layout=layout, form=form).eval()
    with torch.no_grad():  # decays far from 1 so that a wrong mask shows
        layer.decay.A_log.uniform_(0.0, 1.0)
        layer.decay.dt_bias.uniform_(-0.5, 0.5)
    x = torch.randn(1, *shape, 32)
    model = nn.Sequential(layer)
    with capture_attention(model) as records:
        with torch.no_grad():
            model(x)
    rec = records["0"]
    dense = dense_oracle(layer, x)  # (B, heads, N, N), row = query
    for query in [(0,) * len(shape), tuple(s - 1 for s in shape), tuple(s // 2 for s in shape)]:
        row = attention_row(rec, query, masked=True)
        assert row.shape == (1, 2, *shape)
        torch.testing.assert_close(row.flatten(2), dense[:, :, _flat(query, shape)], rtol=1e-4, atol=1e-6)
        if form == "official":
            torch.testing.assert_close(row.flatten(2).sum(-1), torch.ones(1, 2))
    plain = attention_row(rec, tuple(s // 2 for s in shape), masked=False)
    torch.testing.assert_close(plain.flatten(2).sum(-1), torch.ones(1, 2))


def test_grid_query_maps_pixels_to_cells_and_rejects_outside_points():
    assert grid_query((0, 0), (224, 320), (56, 80)) == (0, 0)
    assert grid_query((319.9, 223.9), (224, 320), (56, 80)) == (55, 79)
    assert grid_query((100, 50), (200, 400), (3, 7, 14)) == (1, 3)
    for bad in [(-1, 5), (5, 200), (400, 5)]:
        with pytest.raises(ValueError, match="outside the image"):
            grid_query(bad, (200, 400), (7, 14))
    la, lb = _decays((4, 5), 0)
    with pytest.raises(ValueError, match="not a cell of the grid"):
        mask_row(la, lb, (4, 0))
