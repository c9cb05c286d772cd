"""``cross_selective_scan`` (VMamba's SS2D core): the reference against a per-route loop over
explicit position indices, the cpu kernel (one chunk and several, both directions) and the torch
backend against the reference on odd maps, values and gradients; the Triton kernel under the
interpreter; checks, FLOPs, custom-op wiring."""
from __future__ import annotations

import os

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from ppma.ops import registered_ops, select_backend
from ppma.ops.cross_scan_impl import cross_selective_scan, cross_selective_scan_reference
from ppma.ops.cross_scan_impl.cpu import cross_selective_scan_cpu
from ppma.ops.selective_scan_impl.reference import selective_scan_reference

NAMES = ("x", "x_proj_weight", "dt_projs_weight", "dt_projs_bias", "A", "D")
# (batch, H, W, dim, N, R): odd maps, H != W both ways, a single row, a single position; N = 1
# (VMamba v2), N > 1 (v0)
SHAPES = [(2, 7, 9, 6, 1, 2), (1, 9, 7, 5, 3, 1), (1, 1, 5, 4, 1, 3), (2, 1, 1, 3, 2, 1), (1, 4, 4, 8, 1, 2)]


def random_inputs(batch, height, width, dim, n_state, rank, dtype=torch.float32):
    """Arguments by name: ``x`` in ``dtype``, the parameters fp32."""
    return dict(
        x=torch.randn(batch, height, width, dim).to(dtype),
        x_proj_weight=torch.randn(4, rank + 2 * n_state, dim) / dim**0.5,
        dt_projs_weight=torch.randn(4, dim, rank) / rank**0.5, dt_projs_bias=torch.randn(4, dim) - 2,
        A=-torch.rand(4 * dim, n_state) * 2, D=torch.randn(4 * dim),
    )


def rel_err(actual, expected):
    return ((actual.double() - expected.double()).abs().max() / expected.double().abs().max().clamp_min(1e-30)).item()


def route_positions(height, width):
    """Route ``k``'s sequence as row-major position indices ``(4, L)``, written out."""
    rows = [i * width + j for i in range(height) for j in range(width)]
    cols = [i * width + j for j in range(width) for i in range(height)]
    return torch.tensor([rows, cols, rows[::-1], cols[::-1]])


@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_reference_is_the_scan_along_each_route(shape):
    seed = torch.initial_seed()
    batch, height, width, dim, n_state, rank = shape
    p = random_inputs(*shape)
    expected = torch.zeros(batch, height * width, dim)
    for k, index in enumerate(route_positions(height, width)):
        channels = slice(k * dim, (k + 1) * dim)
        u = p["x"].flatten(1, 2)[:, index]  # (batch, L, dim) in route order
        dt, B, C = (u @ p["x_proj_weight"][k].t()).split([rank, n_state, n_state], dim=-1)
        y, _ = selective_scan_reference(
            u.transpose(1, 2), (dt @ p["dt_projs_weight"][k].t()).transpose(1, 2), p["A"][channels],
            B.transpose(1, 2), C.transpose(1, 2), p["D"][channels], delta_bias=p["dt_projs_bias"][k],
            delta_softplus=True)
        expected.index_add_(1, index, y.transpose(1, 2))
    actual = cross_selective_scan_reference(**p)
    assert rel_err(actual, expected.view(batch, height, width, dim)) < 1e-6, f"seed {seed}"


@pytest.mark.parametrize("chunk", [None, 1, 3], ids=lambda c: f"chunk={c}")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpu_kernel_matches_reference(shape, chunk):
    seed = torch.initial_seed()
    inputs = random_inputs(*shape)
    actual = cross_selective_scan_cpu(**inputs, chunk=chunk)
    expected = cross_selective_scan_reference(**inputs)
    assert actual.dtype == torch.float32 and actual.is_contiguous() and actual.shape == expected.shape
    assert rel_err(actual, expected) < 1e-5, f"seed {seed}: {rel_err(actual, expected):.3g}"


def test_cpu_kernel_takes_bfloat16_maps():
    seed = torch.initial_seed()
    inputs = random_inputs(2, 5, 3, 4, 2, 2, dtype=torch.bfloat16)
    actual = cross_selective_scan_cpu(**inputs, chunk=2)
    expected = cross_selective_scan_reference(**{**inputs, "x": inputs["x"].float()})
    assert actual.dtype == torch.float32 and rel_err(actual, expected) < 1e-5, f"seed {seed}"


def gradients(backend, inputs):
    """``[y, grad of each input]`` through the op on ``backend`` (None: the reference)."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items()}
    if backend is None:
        y = cross_selective_scan_reference(**leaves)
    else:
        y = cross_selective_scan(**leaves, backend=backend)
    grad_y = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(y.device)
    return [y, *torch.autograd.grad((y * grad_y).sum(), list(leaves.values()))]


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[1]], ids=str)
def test_backends_match_reference_values_and_gradients(backend, shape):
    seed = torch.initial_seed()
    inputs = random_inputs(*shape)
    for name, a, e in zip(("y", *NAMES), gradients(backend, inputs), gradients(None, inputs)):
        assert a.shape == e.shape and rel_err(a, e) < 1e-5, f"seed {seed}: {name} {rel_err(a, e):.3g}"


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1",
                    reason="Triton kernels need a CUDA device or TRITON_INTERPRET=1 (CPU interpreter)")
def test_triton_kernel_matches_reference_values_and_gradients():
    seed = torch.initial_seed()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = {k: v.to(device) for k, v in random_inputs(1, 3, 5, 4, 2, 2).items()}
    for name, a, e in zip(("y", *NAMES), gradients("triton", inputs), gradients(None, inputs)):
        assert a.shape == e.shape and rel_err(a, e) < 1e-4, f"seed {seed}: {name} {rel_err(a, e):.3g}"


def test_auto_picks_cpu_on_cpu():
    assert select_backend("cross_selective_scan", "cpu", "auto") == "cpu"


@pytest.mark.parametrize("change,match", [
    (dict(x=torch.randn(2, 3, 4)), r"x must be a non-empty \(batch, H, W, dim\)"),
    (dict(x_proj_weight=torch.randn(4, 5, 4)), r"x_proj_weight must have shape \(4, R \+ 2N, dim\)"),
    (dict(dt_projs_weight=torch.randn(4, 3, 2)), r"dt_projs_weight must have shape \(4, dim, R\)"),
    (dict(dt_projs_bias=torch.randn(16)), r"dt_projs_bias must have shape \(4, dim\)"),
    (dict(A=torch.zeros(5, 1)), r"A must have shape \(4 dim, N\)"),
    (dict(A=torch.ones(16, 1)), r"A must be <= 0"),
    (dict(D=torch.randn(4)), r"D must have shape \(4 dim,\)"),
    (dict(D=torch.ones(16, dtype=torch.long)), r"D must be a floating-point tensor"),
])
def test_bad_inputs_are_named(change, match):
    inputs = {**random_inputs(2, 3, 4, 4, 1, 2), **change}
    with pytest.raises(ValueError, match=match):
        cross_selective_scan(**inputs)


def test_flops_count_the_projections_and_the_scan():
    op, scan = registered_ops()["cross_selective_scan"], registered_ops()["selective_scan"]
    batch, height, width, dim, n_state, rank = 2, 7, 9, 6, 3, 2
    shapes = [tuple(v.shape) for v in random_inputs(batch, height, width, dim, n_state, rank).values()]
    tokens, channels, length = batch * height * width, 4 * dim, height * width
    scan_terms = scan.flops((batch, channels, length), None, (channels, n_state), None, None, (channels,), None,
                            None, True, None)
    assert op.flops(*shapes) == {"x_proj": tokens * 4 * (rank + 2 * n_state) * dim,
                                 "dt_proj": tokens * 4 * rank * dim, **scan_terms}


def test_custom_op_passes_opcheck_and_compiles_to_one_node():
    seed = torch.initial_seed()
    args = tuple(v.requires_grad_() for v in random_inputs(1, 3, 5, 4, 1, 2).values())
    op = registered_ops()["cross_selective_scan"].custom_op
    torch.library.opcheck(op, (*args, "cpu", True))  # the torch backend's takes seconds

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    got = torch.compile(cross_selective_scan, backend=counter, fullgraph=True)(*args)
    torch.testing.assert_close(got, cross_selective_scan(*args), msg=f"seed {seed}")
    targets = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert [t for t in targets if t.startswith("ppma.")] == ["ppma.cross_selective_scan.default"]
