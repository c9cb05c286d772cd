"""ppma.vis.capture: hooks record every kind, 2-D and 3-D, and change nothing."""
import pytest
import torch

from ppma.vis import AttentionRecord, attention_row, capture_attention, last_per_stage, mask_row, select_layers

KINDS = ("criss_cross", "linear", "vanilla", "vanilla")


def _forward(model, x, layers=None):
    with torch.no_grad(), capture_attention(model, layers) as records:
        out = model(x)
    return out, records


def test_capture_does_not_change_outputs_and_removes_its_hooks(micro_model):
    model = micro_model(KINDS)
    x = torch.randn(1, 3, 45, 61)
    with torch.no_grad():
        expected = model(x)
    out, records = _forward(model, x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert len(records) == 4
    assert all(not m._forward_hooks for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def test_records_of_every_kind_have_the_contract_shapes(micro_model):
    model = micro_model(KINDS)
    _, records = _forward(model, torch.randn(2, 3, 64, 96))
    assert [r.kind for r in records.values()] == list(KINDS)
    for stage, rec in enumerate(records.values()):
        assert isinstance(rec, AttentionRecord)
        heads, grid = (1, 2, 4, 8)[stage], (16 >> stage, 24 >> stage)
        assert rec.grid_shape == grid and rec.num_heads == heads and rec.log_gamma is None
        assert rec.log_alpha.shape == rec.log_beta.shape == (2, heads, *grid)
        assert rec.log_alpha.dtype == torch.float32 and (rec.log_alpha <= 0).all()
        assert rec.q.shape == rec.k.shape == (2, heads, *grid, (16 << stage) // heads)
        assert (rec.feature_map is not None) == (rec.kind == "linear")
        row = attention_row(rec, (grid[0] // 2, grid[1] - 1))
        assert row.shape == (2, heads, *grid) and torch.isfinite(row).all()
        torch.testing.assert_close(row.sum((-1, -2)), torch.ones(2, heads))


def test_capture_of_the_3d_model(micro_model):
    model = micro_model(("criss_cross", "vanilla", "linear", "vanilla"), name="ppma_tiny_3d")
    _, records = _forward(model, torch.randn(1, 3, 3, 32, 40))
    rec = records["stages.0.blocks.0.mixer"]
    assert rec.token_layout == "3d" and rec.grid_shape == (3, 8, 10)
    assert rec.log_gamma.shape == rec.log_alpha.shape == (1, 1, 3, 8, 10)
    for rec in records.values():
        query = tuple(s // 2 for s in rec.grid_shape)
        row = attention_row(rec, query)
        assert row.shape == rec.log_alpha.shape
        torch.testing.assert_close(row.flatten(2).sum(-1), torch.ones(1, rec.num_heads))
        both = mask_row(rec.log_alpha, rec.log_beta, query, "both", rec.log_gamma)
        torch.testing.assert_close(both.flatten(2).max(-1).values, both[(slice(None), slice(None)) + query])


def test_layer_selection_by_index_and_name(micro_model):
    model = micro_model(KINDS)
    names = list(select_layers(model))
    assert list(select_layers(model, [-1, 0])) == [names[-1], names[0]]
    assert list(select_layers(model, [names[2]])) == [names[2]]
    _, records = _forward(model, torch.randn(1, 3, 32, 32), layers=[1])
    assert list(records) == [names[1]]
    with pytest.raises(ValueError, match="out of range"):
        select_layers(model, [4])
    with pytest.raises(ValueError, match="not an attention layer"):
        select_layers(model, ["stem"])
    with pytest.raises(ValueError, match="no PolylineAttention"):
        select_layers(torch.nn.Linear(2, 2))


def test_last_per_stage_picks_the_deepest_layer_of_each_grid(micro_model):
    model = micro_model(KINDS, depths=(2, 1, 3, 1))
    _, records = _forward(model, torch.randn(1, 3, 32, 32))
    assert [r.name for r in last_per_stage(records)] == [
        "stages.0.blocks.1.mixer",
        "stages.1.blocks.0.mixer",
        "stages.2.blocks.2.mixer",
        "stages.3.blocks.0.mixer",
    ]
