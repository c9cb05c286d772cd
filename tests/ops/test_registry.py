"""The op registry: backend selection (argument, PPMA_BACKEND, auto), the report, registration."""
import pytest
import torch

import ppma.kernels.common.runtime as runtime
from ppma.ops import backend_report, polyline_scan, registered_ops, registry, select_backend
from ppma.ops.registry import (
    Impl,
    Kernel,
    clear_implementations,
    export_decompositions,
    get_op,
    implementation,
    register,
)


@pytest.fixture
def interpreter(monkeypatch):
    """Set whether Triton interprets (decided once per process; patched here)."""
    monkeypatch.delenv("PPMA_BACKEND", raising=False)

    def set_to(value: bool):
        monkeypatch.setattr(runtime, "interpreted", lambda: value)

    return set_to


@pytest.fixture
def gpu(monkeypatch):
    """Pretend a CUDA device of a given compute capability is present (for the availability checks)."""
    monkeypatch.delenv("PPMA_BACKEND", raising=False)

    def set_to(capability: tuple[int, int]):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)

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
def test_auto_never_picks_the_interpreter(interpreter, gpu, interpreting):
    """On the CPU, ``auto`` picks no Triton kernel, interpreted or not; on CUDA it picks Triton."""
    interpreter(interpreting)
    gpu((9, 0))
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
    from ppma.ops.polyline_linear_attention_impl.chunked import polyline_linear_attention_chunked
    from ppma.ops.polyline_linear_attention_impl.reference import polyline_linear_attention_reference
    from ppma.ops.selective_scan_impl.chunked import selective_scan_chunked
    from ppma.ops.selective_scan_impl.reference import selective_scan_reference

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


def test_gpus_older_than_sm80_run_the_torch_path(interpreter, gpu):
    """V100 / T4 class devices: Triton no longer targets them; ``auto`` runs the torch path and the
    report names the compute capability."""
    interpreter(False)
    gpu((7, 5))
    report = backend_report("cuda")
    triton_ops = [name for name, op in registered_ops().items() if op.kernel("triton") is not None]
    assert {"polyline_attention", "polyline_scan", "selective_scan"} <= set(triton_ops)
    for name in triton_ops:
        assert select_backend(name, "cuda") in ("torch", "cpu"), name
        assert report[name]["selected"] == select_backend(name, "cuda")
        assert report[name]["triton"] == ("Triton kernels need compute capability 8.0 or newer; "
                                          "cuda has 7.5 (sm_75)")
        assert "triton configurations" not in report[name]
    with pytest.raises(RuntimeError, match=r"unavailable: .*cuda:1 has 7.5 \(sm_75\)"):
        select_backend("polyline_attention", "cuda:1", "triton")
    gpu((8, 0))
    assert all(select_backend(name, "cuda") == "triton" for name in triton_ops)


ATTENTION_KERNELS = ("polyline_attention.vanilla", "polyline_attention.line")


def test_the_report_counts_the_configurations_pruned_for_the_device(interpreter, gpu):
    pytest.importorskip("triton", reason="triton is not installed")
    from ppma.kernels.common import tuning

    interpreter(False)
    rows = [row for name, row in tuning.resource_table().items()
            if name.split(" | ")[0].rsplit(".", 1)[0] in ATTENTION_KERNELS]
    assert rows, "no resource table: run tools/kernel_resources.py"
    for arch in tuning.ARCHS:
        gpu(divmod(arch, 10))
        pruned = sum(not tuning.fits(row, arch) for row in rows)
        note = backend_report("cuda")["polyline_attention"].get("triton configurations")
        if pruned:
            assert note == (f"{pruned} of {len(rows)} kernel configurations need more than sm_{arch}'s "
                            f"{tuning.SHARED_MEMORY_LIMIT[arch]:,} bytes of shared memory: pruned, never tried")
        else:
            assert note is None
    gpu((12, 0))
    note = backend_report("cuda")["polyline_attention"]["triton configurations"]
    assert note.startswith("sm_120 is not in the resource table")


def test_a_variant_nothing_fits_sends_auto_to_the_torch_path(interpreter, gpu, resource_table):
    pytest.importorskip("triton", reason="triton is not installed")
    from ppma.kernels.common import tuning

    interpreter(False)
    gpu((8, 6))
    variant = next(name.rsplit(" | ", 1)[0] for name in tuning.resource_table()  # the first 3-D fp32 one
                   if name.startswith("polyline_attention.vanilla._fwd_kernel | fp32 3d "))
    huge = {f"sm_{a}": {"shared": 10**6, "registers": 0, "spills": 0} for a in tuning.ARCHS}
    resource_table({name: huge if name.startswith(variant + " | ") else row
                    for name, row in tuning.resource_table().items()})
    assert select_backend("polyline_attention", "cuda") == "torch"
    assert backend_report("cuda")["polyline_attention"]["triton"] == (
        f"no launch configuration of {variant} fits the shared memory of sm_86")
    assert select_backend("selective_scan", "cuda") == "triton"


def test_implementations_are_built_once_per_op_and_backend_until_cleared():
    op = get_op("selective_scan")
    first = implementation(op, "cpu")
    assert implementation(op, "cpu") is first and implementation(op, "torch") is not first
    clear_implementations()
    assert implementation(op, "cpu") is not first


def test_a_kernel_backward_is_laid_out_as_the_backward_fake_says(monkeypatch):
    """The kernel's gradients are compared with the fake's strides (computed on meta tensors) and
    copied into that layout, values unchanged, when they differ."""
    torch.manual_seed(0)
    x, la, lb = torch.randn(1, 2, 3, 5, 4), -torch.rand(1, 2, 3, 5), -torch.rand(1, 2, 3, 5)
    want = [torch.randn(4, 5, 3, 2, 1).permute(4, 3, 2, 1, 0), torch.randn(5, 3, 2, 1).permute(3, 2, 1, 0),
            torch.randn(1, 2, 3, 5)]
    backward = lambda grads, residuals, *args: [t.clone() for t in want]  # noqa: E731
    monkeypatch.setitem(registry._IMPLEMENTATIONS, ("polyline_scan", "triton"), Impl(None, backward))
    got = torch.ops.ppma.polyline_scan_backward([torch.randn_like(x)], [], x, la, lb, "both", None, "triton")
    for g, w in zip(got, want):
        assert torch.equal(g, w) and g.is_contiguous() and g.device == w.device


def test_the_backward_layouts_follow_each_calls_arguments(monkeypatch):
    """The fake's layouts are kept per layout of the arguments (the fake runs on meta tensors once
    per layout): a gradient laid out otherwise in a later call gets its own layout, not the cached
    one; polyline_scan's ``dx`` takes the incoming gradient's strides."""
    torch.manual_seed(0)
    x, la, lb = torch.randn(1, 2, 3, 5, 4), -torch.rand(1, 2, 3, 5), -torch.rand(1, 2, 3, 5)
    contiguous = torch.randn_like(x)
    permuted = torch.randn(4, 5, 3, 2, 1).permute(4, 3, 2, 1, 0)  # x's shape, channels outermost
    backward = lambda grads, residuals, *args: [grads[0].clone(memory_format=torch.contiguous_format), la.clone(),  # noqa: E731
                                                lb.clone()]
    monkeypatch.setitem(registry._IMPLEMENTATIONS, ("polyline_scan", "triton"), Impl(None, backward))
    for grad in (contiguous, permuted, contiguous, permuted):
        dx, _, _ = torch.ops.ppma.polyline_scan_backward([grad], [], x, la, lb, "both", None, "triton")
        assert dx.stride() == grad.stride() and torch.equal(dx, grad)
