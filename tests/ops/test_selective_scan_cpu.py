"""The selective scan's CPU kernel against the sequential reference: values, last states and
gradients, odd lengths, batch 1, one chunk and several; the shared pieces (softplus, the scan in
two directions)."""
import pytest
import torch
import torch.nn.functional as F

from ppma.ops import _inplace_scan, select_backend, selective_scan
from ppma.ops._scratch import release_scratch
from ppma.ops.registry import get_op
from ppma.ops.selective_scan_impl import cpu
from ppma.ops.selective_scan_impl.reference import random_inputs, selective_scan_reference

# (batch, dim, N, L, G, optional inputs): VMamba v2 (four routes, N = 1), Vim (two directions,
# N = 16, gate z), plain Mamba without options.
CASES = {
    "vmamba": (2, 12, 1, 37, 4, dict(D=True, delta_bias=True, delta_softplus=True)),
    "vim": (1, 6, 16, 23, 2, dict(D=True, z=True, delta_bias=True, delta_softplus=True)),
    "plain": (1, 5, 3, 7, 1, {}),
    "one_step": (1, 4, 2, 1, 1, dict(D=True, z=True)),
}


def relative(got, want):
    return ((got - want).abs().max() / want.abs().max().clamp(min=1e-12)).item()


def test_auto_picks_cpu_on_cpu():
    assert select_backend("selective_scan", "cpu", "auto") == "cpu"
    assert "CPU" in get_op("selective_scan").kernel("cpu").unavailable(torch.device("meta"))


@pytest.mark.parametrize("chunk", [None, 1, 5], ids=lambda c: f"chunk={c}")
@pytest.mark.parametrize("case", CASES)
def test_values_and_last_state_match_the_reference(case, chunk):
    batch, dim, n_state, length, groups, options = CASES[case]
    torch.manual_seed(0)
    inputs = random_inputs(batch, dim, n_state, length, groups, **options)
    y, last = cpu.selective_scan_cpu(**inputs, delta_softplus=options.get("delta_softplus", False), chunk=chunk)
    want_y, want_last = selective_scan_reference(**inputs, delta_softplus=options.get("delta_softplus", False))
    assert y.shape == want_y.shape and y.is_contiguous() and last.shape == want_last.shape
    assert relative(y, want_y) < 1e-5 and relative(last, want_last) < 1e-5


def test_default_chunks_short_steps(monkeypatch):
    """With few elements per step the default takes several chunks (the carry is used)."""
    monkeypatch.setattr(_inplace_scan, "STEP_ELEMENTS", 64)
    assert all(_inplace_scan.chunk_length(*args) == want for args, want in [((37, 8), 7), ((37, 64), 37), ((1, 1), 1)])
    torch.manual_seed(1)
    inputs = random_inputs(1, 8, 1, 37, 2, D=True, delta_bias=True, delta_softplus=True, a_max=6.0)
    y, last = cpu.selective_scan_cpu(**inputs, delta_softplus=True)
    want_y, want_last = selective_scan_reference(**inputs, delta_softplus=True)
    assert relative(y, want_y) < 1e-5 and relative(last, want_last) < 1e-5


@pytest.mark.parametrize("case", ["vmamba", "vim"])
def test_gradients_through_the_op_match_the_reference(case):
    batch, dim, n_state, length, groups, options = CASES[case]
    torch.manual_seed(2)
    inputs = random_inputs(batch, dim, n_state, length, groups, **options)
    softplus = options["delta_softplus"]
    names = [k for k, v in inputs.items() if v is not None]
    results = []
    for run in ("cpu", "reference"):
        leaves = {k: v.clone().requires_grad_() if v is not None else None for k, v in inputs.items()}
        if run == "cpu":
            y, last = selective_scan(**leaves, delta_softplus=softplus, return_last_state=True, backend="cpu")
        else:
            y, last = selective_scan_reference(**leaves, delta_softplus=softplus)
        torch.manual_seed(3)
        ((y * torch.randn_like(y)).sum() + (last * torch.randn_like(last)).sum()).backward()
        results.append([y, last] + [leaves[k].grad for k in names])
    for got, want in zip(*results):
        assert relative(got, want) < 1e-5


def test_bfloat16_inputs_give_out_dtype():
    torch.manual_seed(4)
    inputs = random_inputs(1, 8, 2, 9, 2, dtype=torch.bfloat16, D=True, delta_bias=True)
    y, _ = cpu.selective_scan_cpu(**inputs, out_dtype=torch.float32)
    want, _ = selective_scan_reference(**inputs, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and relative(y, want) < 1e-5


def test_scratch_reused_across_modes_and_sizes():
    """Scratch made under inference mode serves a later differentiable call, and a smaller call
    after a larger one (stale data beyond its size) gives the reference's values."""
    release_scratch()
    torch.manual_seed(5)
    large, small = (random_inputs(2, 8, 2, n, 2, D=True, delta_bias=True, delta_softplus=True) for n in (40, 13))
    with torch.inference_mode():
        selective_scan(**large, delta_softplus=True, backend="cpu")
    leaves = {k: v.clone().requires_grad_() if v is not None else None for k, v in small.items()}
    y = selective_scan(**leaves, delta_softplus=True, backend="cpu")
    y.sum().backward()
    want, _ = selective_scan_reference(**small, delta_softplus=True)
    assert relative(y.detach(), want) < 1e-5 and leaves["u"].grad is not None


def test_softplus_matches_torch_across_the_range():
    """Within 2 ulp of fp64 where F.softplus is a normal number, within the smallest normal
    number of it in its underflow, equal infinities; a non-contiguous tensor."""
    x = torch.cat([torch.linspace(-110, 110, 20001), torch.randn(10000) * 6 - 4,
                   torch.tensor([0.0, 20.0, 19.999, 20.001, -87.0, -104.0, 1e30, -1e30, float("inf"), float("-inf")])])
    got, want = _inplace_scan.softplus_(x.repeat(2, 1).t())[:, 0], F.softplus(x)
    normal = (want > torch.finfo(torch.float32).tiny) & want.isfinite()
    exact = F.softplus(x[normal].double())
    assert ((got[normal].double() - exact).abs() / exact).max() < 2.5e-7
    torch.testing.assert_close(got[~normal], want[~normal], rtol=0, atol=torch.finfo(torch.float32).tiny)


@pytest.mark.parametrize("n_chunks,length", [(1, 7), (3, 5), (4, 1)])
def test_scan_runs_the_second_direction_backwards(n_chunks, length):
    """``scan_`` on two directions against a loop per direction, one chunk and several."""
    step = (2, 3)
    decay = torch.rand(2, n_chunks, length, *step)
    inputs = torch.randn(2, n_chunks, length, *step)
    states = torch.empty(1 + (n_chunks > 1), *inputs.shape)
    states[0] = inputs
    _inplace_scan.scan_(states, decay)
    for direction, order in ((0, range(n_chunks * length)), (1, reversed(range(n_chunks * length)))):
        x, a = inputs[direction].flatten(0, 1), decay[direction].flatten(0, 1)
        h, want = torch.zeros(step), torch.empty_like(x)
        for t in order:
            h = a[t] * h + x[t]
            want[t] = h
        assert torch.allclose(states[0, direction].flatten(0, 1), want, rtol=1e-5, atol=1e-6)
