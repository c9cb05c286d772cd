"""Backend selection: auto, forced by argument or PPMA_BACKEND, and the report."""
import pytest
import torch

from ppma.ops import backend_report, polyline_scan, select_backend


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("PPMA_BACKEND", raising=False)


def test_auto_uses_torch_on_cpu_without_interpreter(no_interpreter):
    assert select_backend("polyline_scan", "cpu") == "torch"
    assert select_backend("polyline_mask", "cpu") == "torch"


def test_forcing_unavailable_triton_raises(no_interpreter, monkeypatch):
    with pytest.raises(RuntimeError, match="forced for polyline_scan but is unavailable"):
        select_backend("polyline_scan", "cpu", "triton")
    monkeypatch.setenv("PPMA_BACKEND", "triton")
    x, d = torch.randn(1, 1, 2, 3, 4), torch.zeros(1, 1, 2, 3)
    with pytest.raises(RuntimeError, match="unavailable"):
        polyline_scan(x, d, d)
    with pytest.raises(RuntimeError, match="has no Triton kernel"):
        select_backend("polyline_mask", "cpu")


def test_unknown_backend_names_raise(no_interpreter, monkeypatch):
    with pytest.raises(ValueError, match="backend='cuda'"):
        select_backend("polyline_scan", "cpu", "cuda")
    monkeypatch.setenv("PPMA_BACKEND", "fast")
    with pytest.raises(ValueError, match="PPMA_BACKEND='fast'"):
        select_backend("polyline_scan", "cpu")


def test_forced_torch_wins_and_report_says_what_ran(monkeypatch):
    monkeypatch.setenv("PPMA_BACKEND", "torch")
    x, d = torch.randn(1, 1, 2, 3, 4), torch.zeros(1, 1, 2, 3)
    polyline_scan(x, d, d)
    report = backend_report("cpu")
    assert report["polyline_scan"]["selected"] == "torch"
    assert report["polyline_scan"]["last_used"] == "torch"
    assert report["polyline_mask"]["triton"] == "no kernel"


def test_interpreter_makes_triton_the_cpu_default(monkeypatch):
    pytest.importorskip("triton", reason="triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("PPMA_BACKEND", raising=False)
    assert select_backend("polyline_scan", "cpu") == "triton"
    assert backend_report("cpu")["polyline_scan"]["triton"] == "available"
