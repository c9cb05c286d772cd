"""``auto``'s per-shape rule for ``polyline_attention`` (the Triton kernel's ``auto_for`` in the
registry): criss-cross on small grids takes the torch path (measured faster there), everything
else keeps the device's choice; a forced backend is never overridden."""
from __future__ import annotations

import pytest
import torch

import ppma.kernels.common.runtime as runtime
from ppma.ops import backend_report, registry, select_backend
from ppma.ops.polyline_attention_impl import op
from ppma.ops.polyline_attention_impl.op import triton_auto_for


def shapes(kind, grid, d=8):
    """The op's arguments as ``auto_for`` takes them (tensors replaced by their shapes)."""
    x, decay = (1, 2, *grid, d), (1, 2, *grid)
    return x, x, x, decay, decay, decay if len(grid) == 3 else None, kind, "official"


@pytest.fixture
def on_cuda(monkeypatch):
    """Triton available natively (as on an sm_90 GPU), ``PPMA_BACKEND`` unset."""
    monkeypatch.delenv("PPMA_BACKEND", raising=False)
    monkeypatch.setattr(runtime, "interpreted", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


@pytest.mark.parametrize("requested,kind,grid,expected", [
    (None, "criss_cross", (14, 14), "triton"),  # whole lines
    (None, "criss_cross", (64, 64), "triton"),
    (None, "criss_cross", (2, 57, 57), "triton"),
    (None, "criss_cross", (65, 65), "torch"),  # tiled lines
    (None, "criss_cross", (80, 80), "torch"),
    (None, "criss_cross", (1, 100), "torch"),
    (None, "criss_cross", (2, 65, 65), "triton"),  # 3-D: tokens of the whole grid
    (None, "criss_cross", (128, 128), "triton"),
    ("triton", "criss_cross", (80, 80), "triton"),  # forced
    ("torch", "criss_cross", (128, 128), "torch"),  # forced
    (None, "vanilla", (14, 14), "triton"),
])
def test_select_backend_applies_the_rule_to_auto_only(on_cuda, requested, kind, grid, expected):
    arguments = shapes(kind, grid)
    assert select_backend("polyline_attention", "cuda", requested, arguments=arguments) == expected
    assert select_backend("polyline_attention", "cuda", requested) == (requested or "triton")  # the device's
    if requested is None:
        assert triton_auto_for(*arguments) == (expected == "triton")


def test_the_report_names_the_rule(on_cuda):
    row = backend_report("cuda")["polyline_attention"]
    assert row["selected"] == "triton"
    assert row["triton"] == "available (auto: not the criss-cross kind with lines over 64 tokens on grids " \
                            "of at most 80 x 80 tokens)"


def test_auto_routes_criss_cross_grids_through_the_public_op(monkeypatch):
    """With the device's candidates Triton then torch (as on CUDA), ``auto`` runs a 1 x 70
    criss-cross (rows too long for whole lines) on the torch path, a 7 x 9 one and the vanilla
    kind on Triton; a forced Triton stays."""
    ran = []
    monkeypatch.setattr(registry, "_candidates",
                        lambda name, device, backend: ("triton", "torch") if backend is None else (backend,))
    monkeypatch.setattr(op, "OP", lambda *args, backend: ran.append(backend))
    for grid, kind, backend in (((1, 70), "criss_cross", None), ((7, 9), "criss_cross", None),
                                ((7, 9), "vanilla", None), ((1, 70), "criss_cross", "triton")):
        q, k, v = (torch.randn(1, 2, *grid, 8) for _ in range(3))
        decays = [-torch.rand(1, 2, *grid) for _ in range(2)]
        op.polyline_attention(q, k, v, *decays, kind=kind, backend=backend)
    assert ran == ["torch", "triton", "triton", "triton"]
