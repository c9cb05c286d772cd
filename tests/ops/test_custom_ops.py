"""Every op is one ``torch.library`` custom op: ``opcheck`` and ``torch.compile`` see one node."""
import os

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._python_dispatch import TorchDispatchMode

from ppma.ops import (
    depthwise_conv,
    polyline_attention,
    polyline_decays,
    polyline_linear_attention,
    polyline_mask,
    polyline_scan,
    registry,
    rotary_qk,
)
from ppma.ops.registry import get_op


def rotated(q, k, rotation, k_scale):
    """``rotary_qk``'s two outputs as one tensor."""
    return torch.stack(rotary_qk(q, k, rotation, k_scale))


def decays(grid, batch=1, heads=2):
    out = [(-torch.rand(batch, heads, *grid) * 2).requires_grad_() for _ in range(len(grid))]
    return out[-1], out[-2], (out[0] if len(grid) == 3 else None)


def channels(grid, c, batch=1, heads=2):
    return torch.randn(batch, heads, *grid, c, requires_grad=True)


def decay_parameters(grid, heads=2, d=3):
    """``polyline_decays``' tensors: tokens ``(1, *grid, heads * d)``, its weight, ``dt_bias``, ``A_log``."""
    return (torch.randn(1, *grid, heads * d, requires_grad=True), torch.randn(len(grid), d, requires_grad=True),
            torch.randn(heads, requires_grad=True), torch.randn(heads, requires_grad=True))


def calls(grid):
    """``(op name, public function, op arguments without backend)`` on the torch backend."""
    la, lb, lg = decays(grid)
    q, k, v = (channels(grid, 3) for _ in range(3))
    rotation = torch.randn(*grid, 2, 2, requires_grad=True)  # head dim 4: channels(grid, 4)
    return [
        ("polyline_decays", polyline_decays, decay_parameters(grid)),
        ("depthwise_conv", depthwise_conv, (torch.randn(2, *grid[-2:], 4, requires_grad=True),
                                            torch.randn(4, 1, 3, 3, requires_grad=True),
                                            torch.randn(4, requires_grad=True), True)),
        ("rotary_qk", rotated, (channels(grid, 4), channels(grid, 4), rotation, 0.5)),
        ("polyline_mask", polyline_mask, (la, lb, "h2v", lg)),
        ("polyline_scan", polyline_scan, (q, la, lb, "both", lg)),
        ("polyline_attention", polyline_attention, (q, k, v, la, lb, lg, "vanilla", "official")),
        ("polyline_attention", polyline_attention, (q, k, v, la, lb, lg, "criss_cross", "paper")),
    ]


@pytest.mark.parametrize("grid", [(3, 5), (2, 3, 2)], ids=str)
def test_opcheck(grid):
    for name, _, args in calls(grid):
        for keep_residuals in (False, True):
            torch.library.opcheck(getattr(torch.ops.ppma, name).default, (*args, "torch", keep_residuals))


class Recorded(TorchDispatchMode):
    """Records the ops it sees and changes nothing."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def call_in_full(name, fn, args):
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name == "polyline_attention":
        return fn(*args[:-2], kind=args[-2], form=args[-1]), tensors
    return fn(*args), tensors


def values_and_gradients(name, fn, args):
    out, tensors = call_in_full(name, fn, args)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    return out, torch.autograd.grad((out * weights).sum(), tensors, allow_unused=True)


@pytest.mark.parametrize("backend", ["torch", "auto", "triton"])
@pytest.mark.parametrize("grid", [(3, 5), (2, 3, 2)], ids=str)
def test_eager_form_equals_the_custom_op(backend, grid, monkeypatch):
    """A plain eager call runs the op's eager form (its autograd node says so), no dispatcher;
    with the eager form turned off the custom op runs. Same values, strides and gradients, bit
    for bit, on each backend."""
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels on CPU tensors need TRITON_INTERPRET=1")
    monkeypatch.setenv("PPMA_BACKEND", backend)
    torch.manual_seed(0)
    for name, fn, args in calls(grid):
        if backend == "triton" and get_op(name).kernel("triton") is None:
            continue
        out, grads = values_and_gradients(name, fn, args)
        assert fn is rotated or out.grad_fn.name() == f"ppma_{name}Backward", out.grad_fn.name()
        with monkeypatch.context() as patched:
            patched.setattr(registry, "plain_eager", lambda args: False)
            dispatched, dispatched_grads = values_and_gradients(name, fn, args)
        assert fn is rotated or not dispatched.grad_fn.name().startswith("ppma_"), dispatched.grad_fn.name()
        for got, want in zip((out, *grads), (dispatched, *dispatched_grads)):
            assert (got is None) == (want is None), name
            assert got is None or (torch.equal(got, want) and got.stride() == want.stride()), name


def test_dispatch_modes_see_the_custom_op():
    """Op counters and the FLOP counter are dispatch modes: under one the custom op runs."""
    q, k = channels((3, 5), 4), channels((3, 5), 4)
    with Recorded() as mode:
        rotary_qk(q, k, torch.randn(3, 5, 2, 2), 0.5)
    assert "ppma.rotary_qk.default" in mode.seen
    with Recorded() as mode, torch.no_grad():
        rotary_qk(q, k, torch.randn(3, 5, 2, 2), 0.5)
    assert "ppma.rotary_qk.default" in mode.seen


def test_eager_form_keeps_double_backward_as_the_custom_op(monkeypatch):
    """A graph of the gradients (``create_graph``): through the torch backend's backward (autograd
    through its form), second derivatives as the custom op gives them; a kernel's backward has no
    gradient of its own, and says so."""
    torch.manual_seed(0)
    q, k, v = (channels((3, 4), 5).double() for _ in range(3))
    la, lb = (-torch.rand(1, 2, 3, 4, dtype=torch.float64) for _ in range(2))

    def second(backend):
        out = polyline_attention(q, k, v, la, lb, kind="vanilla", backend=backend)
        (g,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
        return torch.autograd.grad(g.square().sum(), k)[0]

    got = second("torch")
    with monkeypatch.context() as patched:
        patched.setattr(registry, "plain_eager", lambda args: False)
        torch.testing.assert_close(got, second("torch"), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="polyline_attention_backward.*no autograd formula"):
        second("cpu")


@pytest.mark.parametrize("index", range(6))
def test_compile_sees_one_node_and_matches_eager(index, monkeypatch):
    monkeypatch.setenv("PPMA_BACKEND", "torch")
    name, fn, args = calls((3, 5))[index]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]

    def run(*ts):
        it = iter(ts)
        return call_in_full(name, fn, [next(it) if isinstance(a, torch.Tensor) else a for a in args])[0]

    torch._dynamo.reset()  # a fresh compile: no shapes made dynamic by an earlier test
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda *ts: run(*ts) * 2, backend=counter, fullgraph=True)
    got, want = compiled(*tensors), run(*tensors) * 2
    grads_got = torch.autograd.grad(got.square().sum(), tensors)
    grads_want = torch.autograd.grad(want.square().sum(), tensors)
    for g, w in zip((got, *grads_got), (want, *grads_want)):
        torch.testing.assert_close(g, w, msg=f"{name} (seed {torch.initial_seed()})")
    assert counter.frame_count == 1
    targets = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert [t for t in targets if t.startswith("ppma.")] == [f"ppma.{name}.default"], targets


@pytest.mark.parametrize("grid", [(3, 5), (2, 3, 2)], ids=str)
def test_meta_tensors_run_forward_and_backward(grid):
    """On meta tensors (shape inference without memory) every op runs through its custom op's fake
    implementations, forward and backward (meta has no autocast for them to ask about)."""
    la, lb, lg = (t if t is None else t.detach().to("meta").requires_grad_() for t in decays(grid))
    q, k, v = (channels(grid, 3).detach().to("meta").requires_grad_() for _ in range(3))
    runs = [(polyline_mask, (la, lb, "h2v", lg), {}), (polyline_scan, (q, la, lb, "both", lg), {}),
            (polyline_attention, (q, k, v, la, lb, lg), dict(kind="vanilla")),
            (polyline_attention, (q, k, v, la, lb, lg), dict(kind="criss_cross")),
            (polyline_linear_attention, (q, k, v, la, lb, lg), {}),
            (polyline_decays, tuple(t.detach().to("meta").requires_grad_() for t in decay_parameters(grid)), {}),
            (rotated, (*(channels(grid, 4).detach().to("meta").requires_grad_() for _ in range(2)),
                       torch.randn(*grid, 2, 2, device="meta", requires_grad=True), 0.5), {})]
    for fn, args, kwargs in runs:
        out = fn(*args, **kwargs)
        assert out.device.type == "meta", fn.__name__
        leaves = [a for a in args if isinstance(a, torch.Tensor)]
        grads = torch.autograd.grad(out.sum(), leaves, allow_unused=True)
        assert all(g is None or g.shape == a.shape for g, a in zip(grads, leaves)), fn.__name__
