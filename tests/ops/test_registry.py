"""The op registry: backend selection (argument, PPMA_BACKEND, auto), the report, registration."""
import pytest
import torch

import ppma.kernels.common.runtime as runtime
from ppma.ops import backend_report, polyline_scan, registered_ops, select_backend
from ppma.ops.registry import Impl, Kernel, get_op, implementation, register


@pytest.fixture
def interpreter(monkeypatch):
    """Set whether Triton interprets (decided once per process; patched here)."""
    monkeypatch.delenv("PPMA_BACKEND", raising=False)

    def set_to(value: bool):
        monkeypatch.setattr(runtime, "interpreted", lambda: value)

    return set_to


def test_every_op_is_registered_once_with_its_custom_op():
    assert {"polyline_mask", "polyline_scan", "polyline_attention"} <= set(registered_ops())
    for name, op in registered_ops().items():
        assert op.name == name
        assert hasattr(torch.ops.ppma, name) and hasattr(torch.ops.ppma, f"{name}_backward")
    assert [k.backend for k in get_op("polyline_scan").kernels] == ["triton"]
    assert [k.backend for k in get_op("polyline_attention").kernels] == ["triton"]
    with pytest.raises(ValueError, match="already registered"):
        op = get_op("polyline_mask")
        register("polyline_mask", arguments=op.arguments, reference=op.reference, fake=op.fake, flops=op.flops)
    with pytest.raises(ValueError, match="unknown op 'no_such_op'"):
        select_backend("no_such_op", "cpu")


def test_auto_uses_torch_on_cpu_without_interpreter(interpreter):
    interpreter(False)
    assert select_backend("polyline_scan", "cpu") == "torch"
    assert select_backend("polyline_mask", "cpu") == "torch"
    assert select_backend("polyline_scan", "cuda") == "triton"


def test_forcing_an_unavailable_kernel_raises_with_the_reason(interpreter, monkeypatch):
    interpreter(False)
    with pytest.raises(RuntimeError, match="forced for polyline_scan but is unavailable: Triton kernels run on CUDA"):
        select_backend("polyline_scan", "cpu", "triton")
    monkeypatch.setenv("PPMA_BACKEND", "triton")
    x, d = torch.randn(1, 1, 2, 3, 4), torch.zeros(1, 1, 2, 3)
    with pytest.raises(RuntimeError, match="unavailable"):
        polyline_scan(x, d, d)
    with pytest.raises(RuntimeError, match="op 'polyline_mask' has no 'triton' kernel"):
        select_backend("polyline_mask", "cpu")


def test_unknown_backend_names_raise(interpreter, monkeypatch):
    with pytest.raises(ValueError, match="backend='cuda'"):
        select_backend("polyline_scan", "cpu", "cuda")
    monkeypatch.setenv("PPMA_BACKEND", "fast")
    with pytest.raises(ValueError, match="PPMA_BACKEND='fast'"):
        select_backend("polyline_scan", "cpu")
    with pytest.raises(ValueError, match="kernel backend 'cuda'"):
        register("new_op", arguments="Tensor x", reference=None, fake=None, flops=None,
                 kernels=[Kernel("cuda", lambda device: None, lambda: None)])
    assert "new_op" not in registered_ops()


def test_forced_torch_wins_and_the_report_is_derived_from_the_registry(interpreter, monkeypatch):
    interpreter(True)
    monkeypatch.setenv("PPMA_BACKEND", "torch")
    report = backend_report("cpu")
    assert set(report) == set(registered_ops())
    assert report["polyline_scan"] == {"selected": "torch", "triton": "available"}
    assert report["polyline_mask"] == {"selected": "torch", "triton": "no kernel"}


def test_interpreter_makes_triton_the_cpu_default(interpreter):
    pytest.importorskip("triton", reason="triton is not installed")
    interpreter(True)
    assert select_backend("polyline_scan", "cpu") == "triton"
    assert backend_report("cpu")["polyline_scan"]["triton"] == "available"
    impl = implementation(get_op("polyline_scan"), "triton")
    assert isinstance(impl, Impl) and impl.forward.__module__ == "ppma.kernels.polyline_scan.scan"


def test_missing_triton_is_named(monkeypatch):
    monkeypatch.setattr(runtime, "triton_installed", lambda: False)
    assert runtime.triton_unavailable_reason("cuda") == "the 'triton' package is not installed"
