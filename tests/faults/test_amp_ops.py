"""Every op that scans or exponentiates computes in fp32 inside, whatever its inputs' dtype: fp16
and bf16 inputs (under autocast or not) with adversarial values, where an fp16 state, step size
or cumulative decay would overflow or lose the decays: step sizes beyond fp16's range, decays
near 0 and near 1, states summed over long lines. Each path on the CPU (the reference, the
``torch`` and ``cpu`` backends) gives finite outputs and gradients, within the output dtype's
rounding of an fp32 computation on the same (rounded) inputs."""
import contextlib
import functools

import pytest
import torch

from ppma.ops import cross_selective_scan, polyline_attention, polyline_linear_attention, polyline_scan, selective_scan
from ppma.ops.cross_scan_impl.reference import cross_selective_scan_reference
from ppma.ops.polyline_attention_impl.reference import polyline_attention_reference
from ppma.ops.polyline_linear_attention_impl.reference import polyline_linear_attention_reference
from ppma.ops.polyline_scan_impl.reference import polyline_scan_reference
from ppma.ops.selective_scan_impl.reference import selective_scan_reference

LOW = {"fp16": torch.float16, "bf16": torch.bfloat16}
# relative to the output's largest value; bf16: the attention weights multiply v in bf16, as in
# the released code (3.7e-2 on the vanilla kind here)
TOLERANCE = {"fp16": 1e-2, "bf16": 5e-2}
FP16_MAX = torch.finfo(torch.float16).max


def near_0_and_1(shape) -> torch.Tensor:
    """fp32 log-decays along the last axis: runs of 15 near 1 (-1e-6, one of them -0.3) cut by one
    near 0 (-3e4, within fp16's range)."""
    values = torch.full((16,), -1e-6)
    values[7], values[15] = -0.3, -3e4
    return values[torch.arange(shape[-1]) % 16].expand(shape).contiguous()


def selective_scan_case(low):
    dim, n_state, length = 6, 4, 67
    delta_bias = torch.tensor([7e4, 7e4, -20.0, -20.0, 1.0, 1.0])  # dt beyond fp16's max, ~0, ~1
    A = -torch.tensor([1e-5, 1e-6, 1e3, 1e-7, 3e3, 0.5])[:, None].expand(dim, n_state).contiguous()
    args = dict(u=torch.randn(1, dim, length).mul(1e-3).to(low), delta=torch.randn(1, dim, length).to(low), A=A,
                B=torch.randn(1, n_state, length).to(low), C=torch.randn(1, n_state, length).to(low),
                D=torch.randn(dim), z=torch.randn(1, dim, length).to(low), delta_bias=delta_bias)
    run = lambda backend, **a: selective_scan(**a, delta_softplus=True, backend=backend)  # noqa: E731
    return args, run, lambda **a: selective_scan_reference(**a, delta_softplus=True)[0]


def cross_selective_scan_case(low):
    dim, n_state, rank, h, w = 4, 3, 2, 7, 9
    bias = torch.tensor([7e4, -20.0, 1.0, 7e4]).repeat(4, 1)
    A = -torch.tensor([1e-5, 1e3, 1e-7, 0.5]).repeat(4)[:, None].expand(4 * dim, n_state).contiguous()
    args = dict(x=torch.randn(1, h, w, dim).mul(1e-3).to(low), x_proj_weight=torch.randn(4, rank + 2 * n_state, dim),
                dt_projs_weight=torch.randn(4, dim, rank), dt_projs_bias=bias, A=A, D=torch.randn(4 * dim))
    return args, lambda backend, **a: cross_selective_scan(**a, backend=backend), cross_selective_scan_reference


def grid_case(low, h=33, w=35, dv=4, scale=1.0):
    """q, k >= 0 and v on an ``h x w`` grid in ``low``, fp32 decays near 0 and 1."""
    shape = (1, 2, h, w)
    return dict(q=torch.rand(*shape, 3).mul(scale).to(low), k=torch.rand(*shape, 3).mul(scale).to(low),
                v=torch.randn(*shape, dv).mul(scale).to(low), log_alpha=near_0_and_1(shape),
                log_beta=near_0_and_1((1, 2, w, h)).transpose(-1, -2).contiguous())


def linear_attention_case(low):
    # k (x) v (~200 a token) summed over the ~500 tokens decays near 1 join outgrows fp16 (> 65504);
    # the output, a weighted mean of v, does not
    args = grid_case(low, scale=12.0)
    args["v"] = args["v"].add(36.0).to(low)
    return args, lambda backend, **a: polyline_linear_attention(**a, backend=backend), \
        polyline_linear_attention_reference


def attention_case(kind):
    def case(low):
        args = grid_case(low, h=9, w=7, scale=3.0)
        return (args, lambda backend, **a: polyline_attention(**a, kind=kind, backend=backend),
                lambda **a: polyline_attention_reference(**a, kind=kind))
    return case


def scan_case(low):
    args = grid_case(low)
    args = dict(x=args["v"].mul(1e-2), log_alpha=args["log_alpha"], log_beta=args["log_beta"])
    return args, lambda backend, **a: polyline_scan(**a, backend=backend), polyline_scan_reference


# op: (its case, its CPU backends, the output gradient's scale: a step size of 7e4 scales u's
# gradient as much, which must stay within fp16 to be compared)
CASES = {
    "selective_scan": (selective_scan_case, ("torch", "cpu"), 1e-3),
    "cross_selective_scan": (cross_selective_scan_case, ("torch", "cpu"), 1e-3),
    "polyline_linear_attention": (linear_attention_case, ("torch", "cpu"), 1.0),
    "polyline_attention_vanilla": (attention_case("vanilla"), ("torch", "cpu"), 1.0),
    "polyline_attention_criss_cross": (attention_case("criss_cross"), ("torch", "cpu"), 1.0),
    "polyline_scan": (scan_case, ("torch",), 1.0),
}
# cross_selective_scan takes a low-precision map with the model's fp32 weights under autocast only
PATHS = [(op, path, autocast) for op, (_, backends, _) in CASES.items() for path in ("reference", *backends)
         for autocast in (False, True) if autocast or op != "cross_selective_scan"]


def run_with_grads(fn, args: dict, grad: torch.Tensor, context) -> tuple[torch.Tensor, dict]:
    """``fn(**args)`` under ``context`` and the gradients of ``(out * grad).sum()`` by argument."""
    leaves = {k: v.detach().requires_grad_() for k, v in args.items()}
    with context:
        out = fn(**leaves)
    out.float().mul(grad).sum().backward()
    return out, {k: v.grad for k, v in leaves.items()}


def comparable(t: torch.Tensor) -> bool:
    """Whether ``t`` is finite and its largest value lies where fp16 holds 3 digits and headroom."""
    return bool(torch.isfinite(t).all()) and 1e-3 <= t.abs().max() <= FP16_MAX / 4


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("op,path,autocast", PATHS)
def test_low_precision_inputs_compute_in_fp32(op, path, autocast, dtype):
    make, _, grad_scale = CASES[op]
    args, run, reference = make(LOW[dtype])
    fp32 = {k: v.float() for k, v in args.items()}
    expected = reference(**fp32).float()
    grad = torch.randn(expected.shape) * grad_scale
    expected, expected_grads = run_with_grads(reference, fp32, grad, contextlib.nullcontext())
    low = [expected_grads[k] for k, v in args.items() if v.dtype == LOW[dtype]]
    assert comparable(expected) and any(map(comparable, low)), "the case must fit fp16"
    context = torch.autocast("cpu", dtype=LOW[dtype]) if autocast else contextlib.nullcontext()
    fn = reference if path == "reference" else functools.partial(run, path)
    out, grads = run_with_grads(fn, args, grad, context)
    assert torch.isfinite(out).all(), f"{op} {path}: {(~torch.isfinite(out)).sum()} non-finite outputs"
    assert relative_error(out, expected) < TOLERANCE[dtype], f"{op} {path}: {relative_error(out, expected):.3g}"
    for name, got in grads.items():
        assert torch.isfinite(got).all(), f"{op} {path}: the gradient of {name} is not finite"
        if comparable(expected_grads[name]):  # not one an fp16 matmul of autocast underflows
            error = relative_error(got, expected_grads[name])
            assert error < 2 * TOLERANCE[dtype], f"{op} {path}: the gradient of {name} is {error:.3g} off"
