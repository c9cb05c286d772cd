"""Triton ``selective_scan`` against the sequential reference: values, last state, every gradient.

CI runs these on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``), whose scan runs
one Python call per element, so shapes stay small; small ``tile`` sizes put several time tiles
(and a partial last one) in short sequences. ``test_selective_scan_compiles.py`` compiles the
kernels for sm_80 and sm_90 without a GPU.
"""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
    pytest.skip(
        "Triton kernels need a CUDA device or TRITON_INTERPRET=1 (CPU interpreter)", allow_module_level=True
    )

from ppma.kernels.selective_scan import scan, selective_scan_bwd, selective_scan_fwd  # noqa: E402
from ppma.ops import selective_scan  # noqa: E402
from ppma.ops.selective_scan_impl import selective_scan_reference  # noqa: E402
from ppma.ops.selective_scan_impl.reference import random_inputs  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
ALL = dict(D=True, z=True, delta_bias=True, delta_softplus=True)
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Max abs error over the max abs value of ``expected``, at least 0.01: a gradient that is zero
    in exact arithmetic (``dA`` at ``L = 1``, where ``h_0 = 0``) comes out of a GPU at rounding level
    (7e-8 on an H100), since the backward takes ``exp(dt A) h_{t-1}`` as ``h_t - dt B u``."""
    scale = expected.double().abs().max().clamp_min(1e-2)
    return ((actual.double().cpu() - expected.double().cpu()).abs().max() / scale).item()


def reference(inputs, softplus, grad_y, grad_last):
    """``[y, last_state, grads of the tensor inputs]`` of the reference (on the CPU, fp32)."""
    leaves = {k: v.detach().cpu().requires_grad_() for k, v in inputs.items() if v is not None}
    y, last = selective_scan_reference(**{k: leaves.get(k) for k in NAMES}, delta_softplus=softplus)
    loss = (y.float() * grad_y.cpu()).sum() + (last * grad_last.cpu()).sum()
    return [y, last, *torch.autograd.grad(loss, list(leaves.values()))]


def check(actual, expected, inputs, seed):
    names = ["y", "last_state", *[k for k in NAMES if inputs[k] is not None]]
    tol = TOL[inputs["u"].dtype]
    for name, a, e in zip(names, actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape, f"seed {seed}: {name} {a.dtype}{tuple(a.shape)}"
        assert rel_err(a, e) <= tol, f"seed {seed}: {name} relative error {rel_err(a, e):.3g} > {tol}"


SHAPES = [  # (batch, dim, N, L, G, tile, options)
    (1, 4, 3, 1, 1, None, ALL),
    (2, 6, 4, 23, 1, 4, {}),
    (1, 12, 3, 17, 4, 4, ALL),
    (1, 8, 1, 13, 4, None, dict(D=True, delta_softplus=True)),
    (2, 5, 2, 11, 1, 2, dict(z=True, delta_bias=True)),
    (1, 18, 16, 9, 1, 4, ALL),  # N = 16 (Vim)
]
# Every shape in fp32; fp16 on two (the interpreter's time is the budget).
CASES = [(*shape, torch.float32) for shape in SHAPES] + [(*SHAPES[i], torch.float16) for i in (1, 2)]


def run_kernels(inputs, softplus, grad_y, grad_last, tile=None):
    """``[y, last_state, gradients of the present inputs]`` of the forward and backward kernels."""
    args = [inputs[k] for k in NAMES]
    y, last, states = selective_scan_fwd(*args, delta_softplus=softplus, tile=tile)
    grads = selective_scan_bwd(grad_y, grad_last, states, *args, delta_softplus=softplus, tile=tile)
    return [y, last, *[g for g in grads if g is not None]]


@pytest.mark.parametrize("batch,dim,n_state,length,groups,tile,options,dtype", CASES)
def test_kernels_match_reference(batch, dim, n_state, length, groups, tile, options, dtype):
    seed = torch.initial_seed()
    inputs = random_inputs(batch, dim, n_state, length, groups, dtype, DEVICE, **options)
    softplus = options.get("delta_softplus", False)
    grad_y = torch.randn(batch, dim, length, device=DEVICE).to(dtype)
    grad_last = torch.randn(batch, dim, n_state, device=DEVICE)
    actual = run_kernels(inputs, softplus, grad_y, grad_last, tile)
    check(actual, reference(inputs, softplus, grad_y.float(), grad_last), inputs, seed)


def test_gradients_over_several_slices_are_deterministic(monkeypatch):
    """Backward slices of 4 channels (3 per group here, the last one partial), several tiles: the
    gradients match the reference, and two runs are bitwise equal (the partial sums over
    channels, time and batch are added in a fixed order, no atomics)."""
    monkeypatch.setattr(scan, "SLICE_MULTIPLE", 4)
    assert scan.slice_length(1, 2, 10) == 4
    seed = torch.initial_seed()
    inputs = random_inputs(1, 20, 2, 9, 2, torch.float32, DEVICE, **ALL)
    grad_y, grad_last = torch.randn(1, 20, 9, device=DEVICE), torch.randn(1, 20, 2, device=DEVICE)
    first, second = (run_kernels(inputs, True, grad_y, grad_last, tile=4) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    check(first, reference(inputs, True, grad_y, grad_last), inputs, seed)


def test_a_56x56_route_in_default_tiles():
    """L = 3136 (one VMamba-T stage-1 route) in the default tiles (:func:`scan.tile_length`),
    forward and backward."""
    seed = torch.initial_seed()
    inputs = random_inputs(1, 2, 1, 3136, 1, torch.float32, DEVICE, **ALL)
    assert scan.tile_length(3136, 1) < 3136, "the default tiling has a single tile"
    grad_y, grad_last = torch.randn(1, 2, 3136, device=DEVICE), torch.randn(1, 2, 1, device=DEVICE)
    check(run_kernels(inputs, True, grad_y, grad_last), reference(inputs, True, grad_y, grad_last), inputs, seed)


def test_both_directions_as_vim_scans_them():
    """Vim's call (``ppma/layers/vim.py``): channels ``[forward | backward]``, B/C as two groups,
    the backward half fed the flipped sequence; each half equals its own scan."""
    seed = torch.initial_seed()
    forward = random_inputs(1, 6, 4, 11, 1, torch.float32, DEVICE, **ALL)
    backward = {k: v.flip(-1) if k in ("u", "delta", "z", "B", "C") else v
                for k, v in random_inputs(1, 6, 4, 11, 1, torch.float32, DEVICE, **ALL).items()}
    both = {k: torch.cat([forward[k], backward[k]], dim=1 if k in ("u", "delta", "z") else 0)
            for k in ("u", "delta", "z", "A", "D", "delta_bias")}
    both.update({k: torch.stack([forward[k], backward[k]], dim=1) for k in ("B", "C")})
    y = selective_scan(**both, delta_softplus=True, backend="triton")
    for half, inputs in ((y[:, :6], forward), (y[:, 6:], backward)):
        want = selective_scan_reference(**inputs, delta_softplus=True)[0]
        assert rel_err(half, want) <= 1e-5, f"seed {seed}: {rel_err(half, want):.3g}"


def test_op_dispatches_to_the_kernels():
    """The public op on the triton backend: both outputs and every gradient, through the registry;
    ``u`` and ``z`` are strided views (``(batch, L, dim)`` memory), as a layer may pass them."""
    seed = torch.initial_seed()
    inputs = random_inputs(1, 8, 2, 9, 2, torch.float32, DEVICE, **ALL)
    grad_y, grad_last = torch.randn(1, 8, 9, device=DEVICE), torch.randn(1, 8, 2, device=DEVICE)
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items()}
    views = {k: v.transpose(1, 2).contiguous().transpose(1, 2) if k in ("u", "z") else v for k, v in leaves.items()}
    assert not views["u"].is_contiguous()
    y, last = selective_scan(**views, delta_softplus=True, return_last_state=True, backend="triton")
    grads = torch.autograd.grad((y * grad_y).sum() + (last * grad_last).sum(), list(leaves.values()))
    check([y, last, *grads], reference(inputs, True, grad_y, grad_last), inputs, seed)


class LaunchCounter:
    """Stands in for a ``@triton.jit`` kernel and counts its launches (``kernel[grid](...)``)."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def test_backward_does_not_scan_again(monkeypatch):
    """The forward keeps its tile-start states as the op's residual: one forward launch per
    forward+backward, and ``y`` alone (no ``last_state``) still gets every gradient."""
    inputs = random_inputs(1, 4, 2, 11, 1, torch.float32, DEVICE, D=True)
    leaves = {k: None if v is None else v.detach().clone().requires_grad_() for k, v in inputs.items()}
    forward_kernel = LaunchCounter(scan._selective_scan_fwd_kernel)
    monkeypatch.setattr(scan, "_selective_scan_fwd_kernel", forward_kernel)
    y, last = selective_scan(**leaves, return_last_state=True, backend="triton")
    grads = torch.autograd.grad(y.square().sum(), [v for v in leaves.values() if v is not None])
    assert forward_kernel.launches == 1
    y_ref = selective_scan_reference(**inputs)[0]
    check([y, last, *grads], reference(inputs, False, 2 * y_ref, torch.zeros(1, 4, 2)), inputs, torch.initial_seed())


def test_large_decay_stays_finite():
    """``dt * |A|`` up to 50: no overflow, no NaN, forward and backward."""
    seed = torch.initial_seed()
    inputs = random_inputs(1, 4, 2, 97, 1, torch.float32, DEVICE, D=True)
    inputs["A"] = torch.tensor([[-50.0, -1e-3], [-25.0, -50.0], [-1.0, -10.0], [-50.0, -50.0]], device=DEVICE)
    inputs["delta"] = torch.rand(1, 4, 97, device=DEVICE) * 0.5 + 0.5
    grad_y, grad_last = torch.randn(1, 4, 97, device=DEVICE), torch.randn(1, 4, 2, device=DEVICE)
    actual = run_kernels(inputs, False, grad_y, grad_last, tile=16)
    assert all(torch.isfinite(t).all() for t in actual), f"seed {seed}: non-finite values"
    check(actual, reference(inputs, False, grad_y, grad_last), inputs, seed)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the fp16 output, on purpose
def test_fp16_inputs_with_fp32_output_do_not_overflow():
    """Outputs beyond fp16's range (65504): finite in fp32, inf where the output is fp16."""
    seed = torch.initial_seed()
    inputs = random_inputs(1, 4, 8, 6, 1, torch.float16, DEVICE)
    inputs["u"] = torch.full((1, 4, 6), 200.0, dtype=torch.float16, device=DEVICE)
    inputs["B"] = inputs["C"] = torch.full((1, 8, 6), 30.0, dtype=torch.float16, device=DEVICE)
    inputs["delta"] = torch.ones(1, 4, 6, dtype=torch.float16, device=DEVICE)
    args = [inputs[k] for k in NAMES]
    expected, _ = selective_scan_reference(*[a.cpu() if a is not None else None for a in args],
                                           out_dtype=torch.float32)
    assert expected.abs().max() > 65504, f"seed {seed}: the case does not overflow fp16"
    y, *_ = selective_scan_fwd(*args, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and torch.isfinite(y).all(), f"seed {seed}"
    assert rel_err(y, expected) <= 1e-5, f"seed {seed}: {rel_err(y, expected):.3g}"
    assert torch.isinf(selective_scan_fwd(*args)[0]).any(), f"seed {seed}: fp16 output"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 kernels are tested on a GPU only")
def test_bf16_matches_reference():
    seed = torch.initial_seed()
    inputs = random_inputs(2, 64, 16, 197, 1, torch.bfloat16, DEVICE, **ALL)
    grad_y = torch.randn(2, 64, 197, device=DEVICE).to(torch.bfloat16)
    grad_last = torch.randn(2, 64, 16, device=DEVICE)
    args = [inputs[k] for k in NAMES]
    y, last, states = selective_scan_fwd(*args, delta_softplus=True)
    grads = selective_scan_bwd(grad_y, grad_last, states, *args, delta_softplus=True)
    actual = [y, last, *[g for g in grads if g is not None]]
    check(actual, reference(inputs, True, grad_y.float(), grad_last), inputs, seed)
