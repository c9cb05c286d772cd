"""``selective_scan`` on the torch backend (the chunked PyTorch scan) against the sequential
reference: values, last state and every gradient; input checks; FLOP formula; custom-op wiring."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from ppma.ops import registered_ops, selective_scan
from ppma.ops.selective_scan_impl import selective_scan_chunked, selective_scan_reference
from ppma.ops.selective_scan_impl.reference import random_inputs

NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
ALL = dict(D=True, z=True, delta_bias=True, delta_softplus=True)


def run(fn, inputs, delta_softplus, grad_y, grad_last, **kwargs):
    """``[y, last_state, grad of each tensor input]`` of ``fn`` for the given upstream gradients."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items() if v is not None}
    args = {k: leaves.get(k) for k in NAMES}
    y, last = fn(**args, delta_softplus=delta_softplus, **kwargs)
    grads = torch.autograd.grad((y.float() * grad_y).sum() + (last * grad_last).sum(), list(leaves.values()))
    return [y, last, *grads]


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Max abs error over the max abs value of ``expected``."""
    scale = expected.double().abs().max().clamp_min(1e-30)
    return ((actual.double() - expected.double()).abs().max() / scale).item()


CASES = [  # (batch, dim, N, L, G, options)
    (1, 4, 3, 1, 1, ALL),
    (2, 6, 4, 37, 1, {}),
    (2, 12, 3, 29, 4, ALL),
    (1, 8, 1, 50, 4, dict(D=True, delta_softplus=True)),
    (3, 10, 5, 64, 2, dict(z=True, delta_bias=True)),
]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 1e-2)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("batch,dim,n_state,length,groups,options", CASES)
def test_torch_backend_matches_reference(batch, dim, n_state, length, groups, options, dtype, tol):
    seed = torch.initial_seed()
    inputs = random_inputs(batch, dim, n_state, length, groups, dtype, **options)
    softplus = options.get("delta_softplus", False)
    grad_y, grad_last = torch.randn(batch, dim, length), torch.randn(batch, dim, n_state)
    expected = run(selective_scan_reference, inputs, softplus, grad_y, grad_last)
    actual = run(selective_scan, inputs, softplus, grad_y, grad_last, return_last_state=True, backend="torch")
    names = ["y", "last_state", *[k for k in NAMES if inputs[k] is not None]]
    for name, a, e in zip(names, actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape, f"seed {seed}: {name} {a.dtype}{tuple(a.shape)}"
        assert rel_err(a, e) <= tol, f"seed {seed}: {name} relative error {rel_err(a, e):.3g} > {tol}"


def test_chunk_size_does_not_change_the_result():
    seed = torch.initial_seed()
    inputs = random_inputs(2, 6, 3, 23, 2, **ALL)
    expected, _ = selective_scan_reference(**inputs)
    for chunk in (1, 4, 23, 64):
        y, _ = selective_scan_chunked(**inputs, chunk=chunk)
        assert rel_err(y, expected) <= 1e-5, f"seed {seed}: chunk {chunk}: {rel_err(y, expected):.3g}"


def test_without_last_state_returns_y_only():
    inputs = random_inputs(1, 4, 2, 9, 1)
    y = selective_scan(**inputs, backend="torch")
    assert isinstance(y, torch.Tensor) and y.shape == (1, 4, 9)
    assert torch.equal(y, selective_scan(**inputs, return_last_state=True, backend="torch")[0])


def test_large_decay_stays_finite():
    """``dt * |A|`` up to 50 over L = 4096: no overflow, no NaN, forward and backward."""
    seed = torch.initial_seed()
    inputs = random_inputs(1, 4, 2, 4096, 1, D=True)
    inputs["A"] = torch.tensor([[-50.0, -1e-3], [-25.0, -50.0], [-1.0, -10.0], [-50.0, -50.0]])
    inputs["delta"] = torch.rand(1, 4, 4096) * 0.5 + 0.5
    expected, last_expected = selective_scan_reference(**inputs)
    y, last, *grads = run(selective_scan, inputs, False, torch.randn(1, 4, 4096), torch.randn(1, 4, 2),
                          return_last_state=True, backend="torch")
    assert all(torch.isfinite(t).all() for t in [y, last, *grads]), f"seed {seed}: non-finite values"
    assert rel_err(y, expected) <= 1e-5 and rel_err(last, last_expected) <= 1e-5, f"seed {seed}"


def test_fp16_inputs_with_fp32_output_do_not_overflow():
    """Outputs beyond fp16's range (65504): finite in fp32, inf where the output is fp16."""
    seed = torch.initial_seed()
    inputs = random_inputs(1, 4, 8, 16, 1, torch.float16)
    inputs["u"] = torch.full((1, 4, 16), 200.0, dtype=torch.float16)
    inputs["B"] = inputs["C"] = torch.full((1, 8, 16), 30.0, dtype=torch.float16)
    inputs["delta"] = torch.ones(1, 4, 16, dtype=torch.float16)
    expected, _ = selective_scan_reference(**inputs, out_dtype=torch.float32)
    assert expected.abs().max() > 65504, f"seed {seed}: the case does not overflow fp16"
    y = selective_scan(**inputs, out_dtype=torch.float32, backend="torch")
    assert y.dtype == torch.float32 and torch.isfinite(y).all(), f"seed {seed}"
    assert rel_err(y, expected) <= 1e-5, f"seed {seed}: {rel_err(y, expected):.3g}"
    assert torch.isinf(selective_scan(**inputs, backend="torch")).any(), f"seed {seed}: fp16 output"


def _bad(**changes):
    inputs = random_inputs(2, 6, 3, 5, 1, D=True, z=True, delta_bias=True)
    inputs.update(changes)
    return inputs


@pytest.mark.parametrize("inputs,match", [
    (_bad(u=torch.randn(2, 6)), "u must be a"),
    (_bad(delta=torch.randn(2, 6, 4)), "delta must have shape"),
    (_bad(A=-torch.rand(5, 3)), "A must have shape"),
    (_bad(A=torch.rand(6, 3)), "A must be <= 0"),
    (_bad(B=torch.randn(2, 4, 5)), "B must have shape"),
    (_bad(C=torch.randn(2, 1, 3, 5)), "C must have shape"),
    (_bad(B=torch.randn(2, 4, 3, 5), C=torch.randn(2, 4, 3, 5)), "multiple of the number of B/C groups"),
    (_bad(D=torch.randn(5)), "D must have shape"),
    (_bad(z=torch.randn(2, 6, 4)), "z must have shape"),
    (_bad(delta_bias=torch.randn(6, 1)), "delta_bias must have shape"),
    (_bad(u=torch.zeros(2, 6, 5, dtype=torch.long)), "u must be a floating-point"),
])
def test_bad_inputs_are_named(inputs, match):
    with pytest.raises(ValueError, match=match):
        selective_scan(**inputs, backend="torch")


def test_flops_hand_count():
    """batch 2, dim 6, N 4, L 5: 9 * 2*6*4*5 = 2160 for the scan, 2*6*5 = 60 each for D and z."""
    flops = registered_ops()["selective_scan"].flops
    shapes = dict(u=(2, 6, 5), delta=(2, 6, 5), A=(6, 4), B=(2, 2, 4, 5), C=(2, 2, 4, 5))
    assert flops(*shapes.values(), (6,), (2, 6, 5), (6,), True, torch.float32) == dict(scan=2160, D=60, z=60)
    assert flops(*shapes.values(), None, None, None, False, torch.float32) == dict(scan=2160)


@pytest.mark.parametrize("keep_residuals", [False, True])
def test_custom_op_passes_opcheck(keep_residuals):
    """The op returns ``(y, last_state)`` side by side, unpacked."""
    inputs = random_inputs(1, 4, 2, 6, 2, **ALL)
    args = [inputs[k].requires_grad_() for k in NAMES]
    op = registered_ops()["selective_scan"].custom_op
    torch.library.opcheck(op, (*args, True, torch.float32, "torch", keep_residuals))
    y, last = op(*args, True, torch.float32, "torch", keep_residuals)
    assert (y.shape, y.dtype, last.shape, last.dtype) == ((1, 4, 6), torch.float32, (1, 4, 2), torch.float32)


@pytest.mark.parametrize("return_last_state", [False, True])
def test_compile_sees_one_node_and_matches_eager(return_last_state):
    seed = torch.initial_seed()
    inputs = random_inputs(1, 4, 2, 7, 2, D=True, delta_bias=True, delta_softplus=True)
    tensors = [inputs[k].requires_grad_() for k in NAMES if inputs[k] is not None]

    def run(u, delta, A, B, C, D, delta_bias):
        out = selective_scan(u, delta, A, B, C, D, delta_bias=delta_bias, delta_softplus=True,
                             return_last_state=return_last_state, backend="torch")
        return out[0] * 2 + out[1].sum(-1, keepdim=True) if return_last_state else out * 2

    torch._dynamo.reset()  # a fresh compile: no shapes made dynamic by an earlier test
    counter = CompileCounterWithBackend("aot_eager")
    got = torch.compile(run, backend=counter, fullgraph=True)(*tensors)
    want = run(*tensors)
    grads_got = torch.autograd.grad(got.square().sum(), tensors)
    grads_want = torch.autograd.grad(want.square().sum(), tensors)
    for g, w in zip((got, *grads_got), (want, *grads_want)):
        torch.testing.assert_close(g, w, msg=f"seed {seed}")
    assert counter.frame_count == 1
    targets = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert [t for t in targets if t.startswith("ppma.")] == ["ppma.selective_scan.default"], targets
