"""``auto``'s per-shape route of ``polyline_attention``: criss-cross on small grids takes the torch
path (measured faster there), everything else keeps the registry's choice; a forced backend is
never overridden."""
from __future__ import annotations

import pytest
import torch

from ppma.ops.polyline_attention_impl import op
from ppma.ops.polyline_attention_impl.op import CRISS_CROSS_TORCH_MAX_TOKENS, route


@pytest.mark.parametrize("chosen,requested,kind,grid,expected", [
    ("triton", "auto", "criss_cross", (14, 14), "torch"),
    ("triton", "auto", "criss_cross", (80, 80), "torch"),
    ("triton", "auto", "criss_cross", (2, 57, 57), "triton"),  # 3-D: tokens of the whole grid
    ("triton", "auto", "criss_cross", (128, 128), "triton"),
    ("triton", "triton", "criss_cross", (14, 14), "triton"),  # forced
    ("triton", "auto", "vanilla", (14, 14), "triton"),
    ("torch", "auto", "criss_cross", (128, 128), "torch"),
])
def test_route(chosen, requested, kind, grid, expected):
    assert route(chosen, requested, kind, grid) == expected


def test_auto_routes_small_criss_cross_grids_through_the_public_op(monkeypatch):
    """With ``select_backend`` answering ``'triton'`` (as on CUDA), ``auto`` runs a 7 x 9
    criss-cross on the torch path: the result equals the torch backend's exactly."""
    assert 7 * 9 <= CRISS_CROSS_TORCH_MAX_TOKENS
    ran = []
    monkeypatch.setattr(op, "select_backend", lambda *args: "triton")
    monkeypatch.setattr(op, "OP", lambda *args, backend: ran.append(backend))
    monkeypatch.delenv("PPMA_BACKEND", raising=False)
    q, k, v = (torch.randn(1, 2, 7, 9, 8) for _ in range(3))
    decays = [-torch.rand(1, 2, 7, 9) for _ in range(2)]
    op.polyline_attention(q, k, v, *decays, kind="criss_cross")
    op.polyline_attention(q, k, v, *decays, kind="vanilla")
    op.polyline_attention(q, k, v, *decays, kind="criss_cross", backend="triton")
    assert ran == ["torch", "triton", "triton"]
