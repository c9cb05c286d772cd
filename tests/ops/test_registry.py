"""The op registry: backend selection (argument, PPMA_BACKEND, auto), the report, registration."""
import pytest
import torch

import ppma.kernels.common.runtime as runtime
from ppma.ops import backend_report, polyline_scan, registered_ops, select_backend
from ppma.ops.registry import Impl, Kernel, export_decompositions, get_op, implementation, register


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
    assert [k.backend for k in get_op("polyline_attention").kernels] == ["triton", "cpu"]
    with pytest.raises(ValueError, match="already registered"):
        op = get_op("polyline_mask")
        register("polyline_mask", arguments=op.arguments, reference=op.reference, fake=op.fake, flops=op.flops)
    with pytest.raises(ValueError, match="unknown op 'no_such_op'"):
        select_backend("no_such_op", "cpu")


@pytest.mark.parametrize("interpreting", [False, True])
def test_auto_never_picks_the_interpreter(interpreter, interpreting):
    """On the CPU, ``auto`` picks no Triton kernel, interpreted or not; on CUDA it picks Triton."""
    interpreter(interpreting)
    for name, op in registered_ops().items():
        expected = "cpu" if op.kernel("cpu") is not None else "torch"
        assert select_backend(name, "cpu") == expected, name
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
    assert report["polyline_scan"]["selected"] == "torch"
    assert report["polyline_scan"]["triton"] == "available (not picked by auto)"
    assert report["polyline_mask"] == {"selected": "torch", "cpu": "no kernel", "triton": "no kernel"}


def test_the_interpreter_runs_triton_when_asked_by_name(interpreter):
    pytest.importorskip("triton", reason="triton is not installed")
    interpreter(True)
    assert select_backend("polyline_scan", "cpu", "triton") == "triton"
    assert isinstance(implementation(get_op("polyline_scan"), "triton"), Impl)


def test_reference_torch_and_export_forms_are_named_apart():
    """``reference`` is the tests' oracle; the torch backend runs ``torch`` (a chunked form where
    one exists); ``export`` defaults to ``torch``."""
    from ppma.ops.polyline_linear_attention.chunked import polyline_linear_attention_chunked
    from ppma.ops.polyline_linear_attention.reference import polyline_linear_attention_reference
    from ppma.ops.selective_scan.chunked import selective_scan_chunked
    from ppma.ops.selective_scan.reference import selective_scan_reference

    linear, scan = get_op("polyline_linear_attention"), get_op("selective_scan")
    assert linear.reference is polyline_linear_attention_reference and linear.torch is polyline_linear_attention_chunked
    assert scan.reference is selective_scan_reference and scan.torch is selective_scan_chunked
    assert scan.outputs == 2 and get_op("polyline_scan").outputs == 1
    mask = get_op("polyline_mask")
    assert mask.torch is mask.reference and mask.export is mask.torch


def test_export_decompositions_cover_every_op():
    table = export_decompositions()
    assert set(table) == {getattr(torch.ops.ppma, name).default for name in registered_ops()}
    x, d = torch.randn(1, 1, 2, 3, 4), -torch.rand(1, 1, 2, 3)
    got = table[torch.ops.ppma.polyline_scan.default](x, d, d, "both", None, "torch", False)
    torch.testing.assert_close(got[0], get_op("polyline_scan").export(x, d, d, "both", None))
    with pytest.raises(RuntimeError, match="residuals"):
        table[torch.ops.ppma.polyline_scan.default](x, d, d, "both", None, "torch", True)


def test_missing_triton_is_named(monkeypatch):
    monkeypatch.setattr(runtime, "triton_installed", lambda: False)
    assert runtime.triton_unavailable_reason("cuda") == "the 'triton' package is not installed"
