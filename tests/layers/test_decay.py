import math

import pytest
import torch
import torch.nn.functional as F

from ppma.layers import DecayGenerator


@pytest.mark.parametrize("layout,shape", [("2d", (2, 3, 5, 16)), ("3d", (1, 2, 3, 4, 16))])
def test_shapes_dtype_and_formula(layout, shape):
    gen = DecayGenerator(16, 4, token_layout=layout)
    x = torch.randn(shape)
    decays = gen(x)
    assert len(decays) == (3 if layout == "3d" else 2)
    heads = x.unflatten(-1, (4, 4))  # (B, *grid, heads, d)
    for axis, log_decay in enumerate(decays):
        assert log_decay.dtype == torch.float32
        assert log_decay.shape == (shape[0], 4, *shape[1:-1])
        assert (log_decay <= 0).all()
        t = heads @ gen.proj.weight[axis]  # (B, *grid, heads)
        expected = -F.softplus(t + gen.dt_bias) * gen.A_log.exp()
        torch.testing.assert_close(log_decay, expected.movedim(-1, 1))


def test_mamba2_initialisation_and_no_weight_decay():
    gen = DecayGenerator(64, 32)
    A = gen.A_log.exp()
    assert ((A >= 1.0) & (A <= 1.1 + 1e-6)).all()
    dt = F.softplus(gen.dt_bias)
    assert ((dt >= 1e-3 - 1e-7) & (dt <= 1e-1 + 1e-7)).all()
    assert dt.min() < dt.max()  # log-uniform draws, not a constant
    assert gen.dt_bias._no_weight_decay and gen.A_log._no_weight_decay
    assert gen.proj.bias is None


def test_shared_decay_ablation():
    gen = DecayGenerator(12, 3, token_layout="3d", shared=True)
    assert gen.proj.weight.shape == (1, 4)
    la, lb, lg = gen(torch.randn(2, 2, 3, 5, 12))
    assert torch.equal(la, lb) and torch.equal(lb, lg)


def test_autocast_keeps_fp32_decays():
    gen = DecayGenerator(16, 2)
    x = torch.randn(1, 3, 4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        la, lb = gen(x)
        t = gen.proj(x.unflatten(-1, (2, 8))).float()  # the bf16 projection, then fp32
    assert la.dtype == lb.dtype == torch.float32 and torch.isfinite(la).all()
    assert la.is_contiguous() and lb.is_contiguous()  # each axis laid out whole (the kernels read it so)
    expected = (-F.softplus(t + gen.dt_bias[:, None]) * gen.A_log.exp()[:, None]).movedim(-2, 1).unbind(-1)
    torch.testing.assert_close((la, lb), expected, rtol=1e-6, atol=1e-7)


def test_bad_arguments():
    with pytest.raises(ValueError, match="divisible"):
        DecayGenerator(10, 3)
    with pytest.raises(ValueError, match="token_layout"):
        DecayGenerator(8, 2, token_layout="1d")
    with pytest.raises(ValueError, match="A_init_range"):
        DecayGenerator(8, 2, A_init_range=(0.0, 1.0))


def test_gradients_reach_every_parameter():
    gen = DecayGenerator(8, 2, token_layout="3d").double()
    sum(d.sum() for d in gen(torch.randn(1, 2, 3, 3, 8, dtype=torch.float64))).backward()
    for name, p in gen.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert math.isfinite(gen.A_log.grad.sum().item())


@pytest.mark.parametrize("layout,shape", [("2d", (1, 7, 9, 12)), ("3d", (2, 2, 3, 5, 12))])
def test_values_and_gradients_against_the_formula(layout, shape):
    torch.manual_seed(0)
    gen = DecayGenerator(12, 3, token_layout=layout).double()
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    decays = gen(x)
    t = gen.proj(x.unflatten(-1, (3, 4)))  # (B, *grid, heads, n)
    expected = (-F.softplus(t + gen.dt_bias[:, None]) * gen.A_log.exp()[:, None]).movedim(-2, 1).unbind(-1)
    g = [torch.randn_like(d) for d in decays]
    params = (x, *gen.parameters())
    got = torch.autograd.grad(sum((d * gd).sum() for d, gd in zip(decays, g)), params)
    want = torch.autograd.grad(sum((e * gd).sum() for e, gd in zip(expected, g)), params)
    for d, e in zip(decays, expected):
        assert d.is_contiguous()
        torch.testing.assert_close(d, e, msg="seed 0")
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, msg="seed 0")


@pytest.mark.parametrize("layout,shape", [("2d", (2, 7, 9, 12)), ("3d", (1, 2, 3, 4, 12))])
def test_a_hooked_projection_is_called_with_the_same_result(layout, shape, monkeypatch):
    """The generator's one op (``ppma.ops.polyline_decays``; the projection's forward does not
    run) against the projection called as a module, which a hook on it makes the generator take:
    values and every gradient."""
    torch.manual_seed(0)
    gen, x = DecayGenerator(12, 3, token_layout=layout).double(), torch.randn(shape, dtype=torch.float64, requires_grad=True)

    def run():
        decays = torch.stack(gen(x))
        return decays, torch.autograd.grad(decays.square().sum(), [x, *gen.parameters()])

    forwards, linear_forward = [], torch.nn.Linear.forward
    monkeypatch.setattr(torch.nn.Linear, "forward", lambda self, t: forwards.append(self) or linear_forward(self, t))
    fused = run()
    assert forwards == []
    calls = []
    handle = gen.proj.register_forward_hook(lambda *_: calls.append(1))
    called = run()
    handle.remove()
    assert calls == [1]
    torch.testing.assert_close(fused, called, rtol=1e-12, atol=1e-12)
