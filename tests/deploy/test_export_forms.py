"""Every op's export form (plain ATen ops, ``ppma/ops/<op>/export.py`` or the reference where that
already is one) against the op's plain reference, and its graph staying symbolic in the sizes."""
import pytest
import torch
from torch.export import Dim

from ppma.ops import selective_scan
from ppma.ops.registry import export_decompositions, get_op, registered_ops
from ppma.ops.selective_scan_impl.reference import random_inputs, selective_scan_reference

RTOL = 1e-5
GRIDS = [(7, 9), (9, 7), (1, 5), (70, 3), (3, 4, 5)]  # odd sizes, H != W, lines longer than 64, 3-D


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _decays(grid, batch=1, heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    decays = [-torch.rand(batch, heads, *grid, generator=g) * 2 for _ in range(3)]
    return decays[0], decays[1], decays[2] if len(grid) == 3 else None


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("order", ["v2h", "h2v", "both"])
def test_polyline_scan_export_matches_reference(grid, order):
    op = get_op("polyline_scan")
    la, lb, lg = _decays(grid)
    x = torch.randn(1, 2, *grid, 3, generator=torch.Generator().manual_seed(1))
    assert _rel(op.export(x, la, lb, order, lg), op.reference(x, la, lb, order, lg)) < RTOL


@pytest.mark.parametrize("grid", GRIDS)
def test_polyline_linear_attention_export_matches_reference(grid):
    op = get_op("polyline_linear_attention")
    la, lb, lg = _decays(grid, batch=2)
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.rand(2, 2, *grid, 4, generator=g), torch.rand(2, 2, *grid, 4, generator=g), torch.randn(2, 2, *grid, 5, generator=g)
    assert _rel(op.export(q, k, v, la, lb, lg, 1e-6), op.reference(q, k, v, la, lb, lg, 1e-6)) < RTOL


@pytest.mark.parametrize("kind", ["vanilla", "criss_cross"])
@pytest.mark.parametrize("grid", [(7, 9), (3, 4, 5)])
def test_polyline_attention_and_mask_export_match_reference(kind, grid):
    la, lb, lg = _decays(grid)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, *grid, 4, generator=g) for _ in range(3))
    op = get_op("polyline_attention")
    for form in ("official", "paper"):
        args = (q, k, v, la, lb, lg, kind, form)
        assert _rel(op.export(*args), op.reference(*args)) < RTOL
    mask = get_op("polyline_mask")
    assert _rel(mask.export(la, lb, "both", lg), mask.reference(la, lb, "both", lg)) < RTOL


@pytest.mark.parametrize("batch,dim,n_state,length,groups", [(1, 4, 3, 7, 1), (2, 8, 4, 300, 2), (1, 4, 2, 1, 4),
                                                            (1, 2, 1, 600, 1)])
@pytest.mark.parametrize("optional", [False, True])
def test_selective_scan_export_matches_reference(batch, dim, n_state, length, groups, optional):
    torch.manual_seed(length)
    softplus = optional
    inputs = random_inputs(batch, dim, n_state, length, groups, D=optional, z=optional, delta_bias=optional,
                           delta_softplus=softplus, a_max=5.0)
    y, last = get_op("selective_scan").export(**inputs, delta_softplus=softplus, out_dtype=torch.float32)
    y_ref, last_ref = selective_scan_reference(**inputs, delta_softplus=softplus)
    assert _rel(y, y_ref) < RTOL and _rel(last, last_ref) < RTOL


@pytest.mark.parametrize("height,width,n_state", [(7, 9, 1), (9, 7, 3), (1, 5, 1), (6, 37, 2)])
def test_cross_selective_scan_export_matches_reference(height, width, n_state):
    g = torch.Generator().manual_seed(height)
    dim, rank = 6, 2
    args = (torch.randn(2, height, width, dim, generator=g), torch.randn(4, rank + 2 * n_state, dim, generator=g) / 3,
            torch.randn(4, dim, rank, generator=g), torch.randn(4, dim, generator=g) - 2,
            -torch.rand(4 * dim, n_state, generator=g) * 2, torch.randn(4 * dim, generator=g))
    op = get_op("cross_selective_scan")
    assert _rel(op.export(*args), op.reference(*args)) < RTOL


def test_cross_scan_export_matches_reference():
    x = torch.randn(1, 3, 7, 9)
    assert torch.equal(get_op("cross_scan").export(x), get_op("cross_scan").reference(x))
    y = torch.randn(2, 4, 3, 7, 9)
    assert torch.equal(get_op("cross_merge").export(y), get_op("cross_merge").reference(y))


class _Scan(torch.nn.Module):
    """One selective scan over a sequence whose length is the input's."""

    def forward(self, u, A, B):
        return selective_scan(u, u.abs() * 0.5, A, B, B, return_last_state=True, backend="torch")


def test_selective_scan_export_graph_is_symbolic_in_the_length():
    """Exported at L = 16 (one chunk, no padding needed), the decomposed graph runs at other L
    and batch sizes: no size of the example is baked in."""
    torch.manual_seed(0)
    u, A, B = torch.randn(2, 4, 16), -torch.rand(4, 3), torch.randn(2, 3, 16)
    batch, length = Dim("batch", min=1, max=64), Dim("length", min=2, max=100000)
    ep = torch.export.export(_Scan(), (u, A, B), dynamic_shapes=({0: batch, 2: length}, None, {0: batch, 2: length}))
    ep = ep.run_decompositions({**torch.export.default_decompositions(), **export_decompositions()})
    assert not any("ppma" in str(n.target) for n in ep.graph.nodes)
    for b, n in [(1, 7), (3, 300), (1, 4099)]:
        u, B = torch.randn(b, 4, n), torch.randn(b, 3, n)
        y, last = ep.module()(u, A, B)
        y_ref, last_ref = selective_scan_reference(u, u.abs() * 0.5, A, B, B)
        assert _rel(y, y_ref) < RTOL and _rel(last, last_ref) < RTOL


def test_every_op_has_an_export_form_without_python_loops_over_tokens():
    """The forms that loop over tokens (the references of the scans, the chunked torch forms) are
    never the export form."""
    for name, op in registered_ops().items():
        if name in ("polyline_scan", "polyline_linear_attention", "selective_scan", "cross_selective_scan"):
            assert op.export.__module__.endswith(".export"), name
