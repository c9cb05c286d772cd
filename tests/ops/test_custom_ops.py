"""Every polyline op is one ``torch.library`` custom op: ``opcheck`` and ``torch.compile`` see one node."""
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from ppma.ops import (
    polyline_attention,
    polyline_decays,
    polyline_linear_attention,
    polyline_mask,
    polyline_scan,
    rotary_qk,
)


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


@pytest.mark.parametrize("index", range(6))
def test_compile_sees_one_node_and_matches_eager(index, monkeypatch):
    monkeypatch.setenv("PPMA_BACKEND", "torch")
    name, fn, args = calls((3, 5))[index]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]

    def run(*ts):
        it = iter(ts)
        full = [next(it) if isinstance(a, torch.Tensor) else a for a in args]
        return fn(*full[:-2], **dict(zip(("kind", "form"), full[-2:]))) if name == "polyline_attention" else fn(*full)

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
