"""``cross_scan`` / ``cross_merge``: the four routes on a hand-written map, adjointness, gradients
(each op's gradient is the other), input checks, 0 FLOPs, custom-op wiring."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from ppma.ops import cross_merge, cross_scan, registered_ops
from ppma.ops.cross_scan_impl import cross_merge_reference, cross_scan_reference


def test_routes_on_a_2x3_map():
    x = torch.arange(6.0).view(1, 1, 2, 3)  # [[0, 1, 2], [3, 4, 5]]
    expected = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 3, 1, 4, 2, 5], [5, 4, 3, 2, 1, 0], [5, 2, 4, 1, 3, 0.0]])
    assert torch.equal(cross_scan(x), expected.view(1, 4, 1, 6))
    assert torch.equal(cross_scan_reference(x), expected.view(1, 4, 1, 6))


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 7, 9), (1, 2, 9, 7), (3, 1, 1, 5)])
def test_merge_is_the_adjoint_of_scan(shape):
    seed = torch.initial_seed()
    batch, channels, height, width = shape
    x = torch.randn(shape, dtype=torch.float64)
    y = torch.randn(batch, 4, channels, height * width, dtype=torch.float64)
    lhs = (cross_scan(x) * y).sum()
    rhs = (x * cross_merge(y.view(batch, 4, channels, height, width))).sum()
    assert torch.allclose(lhs, rhs, rtol=1e-12, atol=1e-12), f"seed {seed}: {lhs.item()} != {rhs.item()}"


def test_gradients_are_the_adjoints():
    seed = torch.initial_seed()
    x = torch.randn(2, 3, 7, 9, requires_grad=True)
    y = torch.randn(2, 4, 3, 7, 9, requires_grad=True)
    gy = torch.randn(2, 4, 3, 63)
    gx = torch.randn(2, 3, 7, 9)
    (dx,) = torch.autograd.grad(cross_scan(x), x, gy)
    (dy,) = torch.autograd.grad(cross_merge(y), y, gx)
    assert torch.allclose(dx, cross_merge_reference(gy.view(2, 4, 3, 7, 9)), atol=1e-6), f"seed {seed}"
    assert torch.allclose(dy.flatten(3), cross_scan_reference(gx)), f"seed {seed}"


@pytest.mark.parametrize("fn,arg,match", [
    (cross_scan, torch.randn(2, 3, 4), r"x must be a \(B, C, H, W\)"),
    (cross_merge, torch.randn(2, 4, 3, 12), r"y must be a \(B, 4, C, H, W\)"),
    (cross_merge, torch.randn(2, 2, 3, 3, 4), r"y must be a \(B, 4, C, H, W\)"),
])
def test_bad_inputs_are_named(fn, arg, match):
    with pytest.raises(ValueError, match=match):
        fn(arg)


def test_data_movement_costs_no_flops():
    ops = registered_ops()
    assert sum(ops["cross_scan"].flops((2, 3, 7, 9)).values()) == 0
    assert sum(ops["cross_merge"].flops((2, 4, 3, 7, 9)).values()) == 0


def test_custom_ops_pass_opcheck():
    ops = registered_ops()
    torch.library.opcheck(ops["cross_scan"].custom_op, (torch.randn(2, 3, 5, 7, requires_grad=True), "torch", True))
    torch.library.opcheck(ops["cross_merge"].custom_op, (torch.randn(2, 4, 3, 5, 7, requires_grad=True), "torch", True))


def test_compile_sees_one_node_each_and_matches_eager():
    seed = torch.initial_seed()
    x = torch.randn(2, 3, 5, 7, requires_grad=True)

    def run(x):
        return cross_merge(cross_scan(x).square().view(2, 4, 3, 5, 7), backend="torch")

    torch._dynamo.reset()  # a fresh compile: no shapes made dynamic by an earlier test
    counter = CompileCounterWithBackend("aot_eager")
    got = torch.compile(run, backend=counter, fullgraph=True)(x)
    want = run(x)
    (grad_got,), (grad_want,) = torch.autograd.grad(got.sum(), x), torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(got, want, msg=f"seed {seed}")
    torch.testing.assert_close(grad_got, grad_want, msg=f"seed {seed}")
    targets = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert [t for t in targets if t.startswith("ppma.")] == ["ppma.cross_scan.default", "ppma.cross_merge.default"]
