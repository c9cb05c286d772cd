"""PolylineAttention against dense references written from the formulas (float64)."""
import pytest
import torch

from ppma.layers import PolylineAttention
from ppma.layers.polyline_attention import ATTENTION_KINDS as KINDS
from ppma.ops import polyline_mask


@pytest.fixture(autouse=True)
def torch_backend(monkeypatch):
    # The Triton scan is tested in tests/kernels; here the layer math is.
    monkeypatch.setenv("PPMA_BACKEND", "torch")


def capture(attn, x):
    """Run ``attn`` on ``x``; return its output and what the taps and the decay generator saw."""
    seen = {}
    hooks = [
        attn.q_tap.register_forward_hook(lambda m, i, o: seen.__setitem__("q", o)),
        attn.k_tap.register_forward_hook(lambda m, i, o: seen.__setitem__("k", o)),
        attn.decay.register_forward_hook(lambda m, i, o: seen.__setitem__("decays", o)),
    ]
    out = attn(x)
    for h in hooks:
        h.remove()
    return out, seen


def finish(attn, x, heads_out):
    """``heads_out`` ``(B, heads, N, d)`` -> the layer output (merge heads, + LePE, out_proj)."""
    grid = x.shape[1:-1]
    merged = heads_out.movedim(1, -2).flatten(-2).unflatten(1, grid)
    return attn.out_proj(merged + attn.lepe(attn.v_proj(x)))


def split_v(attn, x):
    return attn.v_proj(x).unflatten(-1, (attn.num_heads, -1)).movedim(-2, 1).flatten(2, -2)


def make(kind, layout="2d", form=None, dim=12, heads=3):
    return PolylineAttention(dim, heads, kind=kind, token_layout=layout, form=form).double()


def rand_x(grid_shape, dim=12, batch=2):
    return torch.randn(batch, *grid_shape, dim, dtype=torch.float64)


def test_vanilla_with_all_ones_mask_is_plain_attention():
    attn = make("vanilla")
    attn.decay.register_forward_hook(lambda m, i, o: tuple(torch.zeros_like(t) for t in o))
    x = rand_x((3, 5))
    out, seen = capture(attn, x)
    q, k = seen["q"].flatten(2, -2), seen["k"].flatten(2, -2)
    plain = torch.softmax(q @ k.transpose(-1, -2), -1) @ split_v(attn, x)
    torch.testing.assert_close(out, finish(attn, x, plain))


@pytest.mark.parametrize("layout,shape", [("2d", (3, 4)), ("2d", (1, 7)), ("3d", (2, 3, 2))])
def test_vanilla_official_and_paper_forms(layout, shape):
    x = rand_x(shape)
    for form in ("official", "paper"):
        attn = make("vanilla", layout, form)
        out, seen = capture(attn, x)
        logits = seen["q"].flatten(2, -2) @ seen["k"].flatten(2, -2).transpose(-1, -2)
        la, lb, *lg = seen["decays"]
        lg = lg[0] if lg else None
        v2h = polyline_mask(la, lb, "v2h", lg)
        if form == "official":
            attn_map = 0.5 * torch.softmax(logits + v2h.log(), -1) + 0.5 * torch.softmax(logits + v2h.mT.log(), -1)
        else:
            attn_map = torch.softmax(logits, -1) * (v2h + v2h.mT)
        torch.testing.assert_close(out, finish(attn, x, attn_map @ split_v(attn, x)))


def dense_axis_attention(logits, log_decay, axis, grid, form):
    """Dense ``(B, heads, N, N)`` matrix of the 1-D attention along ``axis`` of ``grid``."""
    coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in grid], indexing="ij"), -1).reshape(-1, len(grid))
    others = [a for a in range(len(grid)) if a != axis]
    same_line = (coords[:, None, others] == coords[None, :, others]).all(-1)
    g = torch.cumsum(-log_decay, dim=2 + axis).flatten(2)  # (B, heads, N)
    log_m = -(g[..., :, None] - g[..., None, :]).abs()
    if form == "official":
        return torch.softmax((logits + log_m).masked_fill(~same_line, float("-inf")), -1)
    return torch.softmax(logits.masked_fill(~same_line, float("-inf")), -1) * log_m.exp()


@pytest.mark.parametrize("form", ["official", "paper"])
@pytest.mark.parametrize("layout,shape", [("2d", (4, 5)), ("3d", (3, 2, 4))])
def test_criss_cross_equals_dense_line_attention(layout, shape, form):
    attn = make("criss_cross", layout, form)
    x = rand_x(shape)
    out, seen = capture(attn, x)
    logits = seen["q"].flatten(2, -2) @ seen["k"].flatten(2, -2).transpose(-1, -2)
    la, lb, *lg = seen["decays"]
    rank = len(shape)
    w = dense_axis_attention(logits, la, rank - 1, shape, form)
    h = dense_axis_attention(logits, lb, rank - 2, shape, form)
    if lg:
        t = dense_axis_attention(logits, lg[0], 0, shape, form)
        mix = 0.5 * (w @ h @ t + t @ h @ w)
    else:
        mix = 0.5 * (w @ h + h @ w)
    torch.testing.assert_close(out, finish(attn, x, mix @ split_v(attn, x)))


@pytest.mark.parametrize("layout,shape", [("2d", (3, 4)), ("2d", (7, 1)), ("3d", (2, 3, 3))])
def test_linear_equals_materialized_mask_linear_attention(layout, shape):
    attn = make("linear", layout)
    x = rand_x(shape)
    out, seen = capture(attn, x)
    fq, fk = attn.feature_map(seen["q"]).flatten(2, -2), attn.feature_map(seen["k"]).flatten(2, -2)
    la, lb, *lg = seen["decays"]
    weights = (fq @ fk.transpose(-1, -2)) * polyline_mask(la, lb, "both", lg[0] if lg else None)
    mix = weights / (weights.sum(-1, keepdim=True) + attn.eps)
    torch.testing.assert_close(out, finish(attn, x, mix @ split_v(attn, x)))


@pytest.mark.parametrize("kind", KINDS)
def test_3d_with_one_frame_equals_2d(kind):
    a2, a3 = make(kind, "2d"), make(kind, "3d")
    state = a2.state_dict()
    state["decay.proj.weight"] = torch.cat([state["decay.proj.weight"], torch.randn(1, 4, dtype=torch.float64)])
    a3.load_state_dict(state)
    x = rand_x((3, 5))
    torch.testing.assert_close(a3(x[:, None])[:, 0], a2(x))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout,shape", [("2d", (3, 5)), ("3d", (2, 3, 4))])
def test_tap_contract_and_decay_gradients(kind, layout, shape):
    attn = PolylineAttention(12, 3, kind=kind, token_layout=layout)
    x = torch.randn(2, *shape, 12)
    out, seen = capture(attn, x)
    assert out.shape == x.shape
    assert seen["q"].shape == seen["k"].shape == (2, 3, *shape, 4)
    assert len(seen["decays"]) == len(shape)
    for t in seen["decays"]:
        assert t.dtype == torch.float32 and t.shape == (2, 3, *shape)
    form = None if kind == "linear" else "official"
    assert (attn.kind, attn.token_layout, attn.form, attn.num_heads) == (kind, layout, form, 3)
    out.square().sum().backward()
    for name in ("dt_bias", "A_log", "proj.weight"):
        grad = attn.decay.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name


def gradients(attn, x):
    out = attn(x)
    return out, torch.autograd.grad(out.square().sum(), [x, *attn.parameters()])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout,shape", [("2d", (3, 5)), ("3d", (2, 3, 2))])
@pytest.mark.parametrize("hook", ["module", "global", "backward"])
def test_one_projection_gemm_equals_the_three_linears(kind, layout, shape, hook, monkeypatch):
    """``q, k, v`` from one GEMM of the stacked weights (the layer's own path: no projection's
    forward runs) against the three ``nn.Linear`` calls, which a hook on a projection or on every
    module makes it take: values and every gradient, float64."""
    torch.manual_seed(0)
    attn, x = make(kind, layout), rand_x(shape).requires_grad_()
    forwards, linear_forward = [], torch.nn.Linear.forward
    monkeypatch.setattr(torch.nn.Linear, "forward", lambda self, t: forwards.append(self) or linear_forward(self, t))
    fused = gradients(attn, x)
    assert forwards == [attn.out_proj], forwards
    calls = []
    register = {"module": attn.k_proj.register_forward_hook,
                "global": torch.nn.modules.module.register_module_forward_hook,
                "backward": attn.k_proj.register_full_backward_hook}[hook]
    handle = register(lambda module, *_: calls.append(module))
    modules = gradients(attn, x)
    handle.remove()
    assert attn.k_proj in calls
    torch.testing.assert_close(fused, modules, rtol=1e-12, atol=1e-12)
    gradients(attn, x)
    assert calls.count(attn.k_proj) == 1  # the hook removed, the stacked GEMM again


def test_a_projection_replaced_by_another_module_is_called():
    """A subclass of ``nn.Linear`` (an adapter, say) in place of ``v_proj`` runs its own forward."""

    class Doubled(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    torch.manual_seed(0)
    attn, x = make("vanilla"), rand_x((3, 4))
    doubled = Doubled(12, 12).double()
    doubled.load_state_dict(attn.v_proj.state_dict())
    with torch.no_grad():
        plain = attn(x)
        attn.v_proj.weight.mul_(2), attn.v_proj.bias.mul_(2)
        want = attn(x)
        attn.v_proj = doubled
        got = attn(x)
    assert not torch.allclose(plain, want)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_is_finite_and_close(kind, dtype):
    attn = PolylineAttention(16, 2, kind=kind)
    x = torch.randn(1, 5, 7, 16)
    with torch.autocast("cpu", dtype=dtype):
        low = attn(x)
    assert torch.isfinite(low).all()
    torch.testing.assert_close(low.float(), attn(x), rtol=5e-2, atol=5e-2)


def test_bad_arguments_and_inputs():
    with pytest.raises(ValueError, match="kind"):
        PolylineAttention(8, 2, kind="window")
    with pytest.raises(ValueError, match="form must be one of"):
        PolylineAttention(8, 2, form="mul")
    with pytest.raises(ValueError, match="form does not apply to the linear kind"):
        PolylineAttention(8, 2, kind="linear", form="official")
    with pytest.raises(ValueError, match="token_layout"):
        PolylineAttention(8, 2, token_layout="4d")
    attn = PolylineAttention(8, 2)
    with pytest.raises(ValueError, match=r"\(B, H, W, C\)"):
        attn(torch.randn(1, 3, 4, 6))
    with pytest.raises(ValueError, match=r"\(B, H, W, C\)"):
        attn(torch.randn(1, 2, 3, 4, 8))


@pytest.mark.parametrize("layout", ["2d", "3d"])
def test_linear_kind_through_the_triton_kernel_matches_torch(monkeypatch, layout):
    """The linear kind's scan (channels d*d + d, a permuted view) through the kernel, fwd and bwd."""
    pytest.importorskip("triton", reason="triton is not installed")
    from ppma.kernels.common.runtime import triton_unavailable_reason

    x_shape = (1, 5, 7, 8) if layout == "2d" else (1, 2, 3, 5, 8)
    x = torch.randn(x_shape)
    if triton_unavailable_reason(x.device) is not None:
        pytest.skip("Triton cannot run here: set TRITON_INTERPRET=1 (CI does) or use a GPU")
    attn = PolylineAttention(8, 2, kind="linear", token_layout=layout).double()
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("PPMA_BACKEND", backend)
        attn.zero_grad()
        inp = x.double().requires_grad_()
        out = attn(inp)
        out.square().sum().backward()
        results[backend] = (out, inp.grad, attn.decay.proj.weight.grad, attn.decay.A_log.grad)
    for got, want in zip(results["triton"], results["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


def test_elu_feature_map_values_and_gradients():
    import torch.nn.functional as F

    from ppma.layers.polyline_attention import elu_feature_map

    torch.manual_seed(0)
    x = torch.cat([torch.randn(2, 3, 7, 9, 4).flatten() * 4, torch.tensor([0.0, -0.0, -80.0, 80.0, 1e-8, -1e-8])])
    # elu(x) + 1 written out in fp64 (F.elu(x) + 1 rounds to 0 at x = -80, even in fp64)
    exact = torch.where(x > 0, x.double() + 1.0, x.double().exp())
    for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-12)):
        xd = x.to(dtype).requires_grad_()
        out, expected = elu_feature_map(xd), F.elu(xd) + 1.0
        torch.testing.assert_close(out.double(), exact, rtol=tol, atol=0, msg=f"seed 0, {dtype}")
        torch.testing.assert_close(out, expected, rtol=tol, atol=tol, msg=f"seed 0, {dtype}")
        assert (out > 0).all()
        g = torch.randn_like(out)
        got, want = (torch.autograd.grad((y * g).sum(), xd)[0] for y in (out, expected))
        torch.testing.assert_close(got, want, rtol=tol, atol=0, msg=f"seed 0, {dtype}")
    xd = x[x.abs() > 1e-3].double().requires_grad_()  # finite differences away from the kink at 0
    assert torch.autograd.gradcheck(elu_feature_map, (xd,)) and torch.autograd.gradgradcheck(elu_feature_map, (xd,))


def test_elu_feature_map_dispatches_few_ops():
    """Under autograd: four elementwise ops forward, two backward (autograd through ``maximum``
    and ``minimum`` took five and twelve)."""
    from ppma.bench.step_count import OpCounter
    from ppma.layers.polyline_attention import elu_feature_map

    x = torch.randn(2, 3, 5, 4, requires_grad=True)
    with OpCounter() as forward:
        y = elu_feature_map(x)
    grad = torch.ones_like(y)
    with OpCounter() as backward:
        torch.autograd.grad(y, x, grad)
    assert (forward.kernel_ops, backward.kernel_ops) == (4, 2), (forward.by_op, backward.by_op)


@pytest.mark.parametrize("kind", KINDS)
def test_input_gradients_gradcheck(kind):
    # the layer rotates its copies of q and k in place and adds into lepe's output: autograd through those
    torch.manual_seed(0)
    attn = make(kind, dim=8, heads=2)
    x = rand_x((3, 5), dim=8, batch=1).requires_grad_()
    assert torch.autograd.gradcheck(attn, (x,)), "seed 0"
