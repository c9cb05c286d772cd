"""``ppma.ops.polyline_attention`` against dense formulas, and the custom op against its reference."""
from functools import partial

import pytest
import torch

from ppma.ops import polyline_attention, polyline_attention_reference, polyline_mask

CASES = [("vanilla", "official"), ("vanilla", "paper"), ("criss_cross", "official"), ("criss_cross", "paper")]
GRIDS = [(7, 9), (1, 5), (2, 3, 4)]


def make_inputs(grid, dtype=torch.float64, batch=1, heads=2, d=4, dv=3):
    """q, k, v as the layer lays them out (heads moved out of a channels-last tensor) and decays."""
    q, k = (torch.randn(batch, *grid, heads, d, dtype=dtype).movedim(-2, 1) for _ in range(2))
    v = torch.randn(batch, *grid, heads, dv, dtype=dtype).movedim(-2, 1)
    decays = [-torch.rand(batch, heads, *grid) * 2 for _ in range(len(grid))]
    log_gamma = decays[0] if len(grid) == 3 else None
    return q, k, v, decays[-1], decays[-2], log_gamma


def dense_line_attention(logits, log_decay, axis, grid, form):
    """``(B, heads, N, N)`` weights of the 1-D attention along grid ``axis`` (zero off the line)."""
    coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in grid], indexing="ij"), -1).reshape(-1, len(grid))
    others = [a for a in range(len(grid)) if a != axis]
    same_line = (coords[:, None, others] == coords[None, :, others]).all(-1)
    g = torch.cumsum(-log_decay.double(), dim=2 + axis).flatten(2)
    log_m = -(g[..., :, None] - g[..., None, :]).abs()
    if form == "official":
        return torch.softmax((logits + log_m).masked_fill(~same_line, float("-inf")), -1)
    return torch.softmax(logits.masked_fill(~same_line, float("-inf")), -1) * log_m.exp()


def dense_formula(q, k, v, log_alpha, log_beta, log_gamma, kind, form):
    """The formulas of docs/models.md with every weight matrix ``(B, heads, N, N)`` materialized."""
    grid = q.shape[2:-1]
    logits = q.flatten(2, -2) @ k.flatten(2, -2).transpose(-1, -2)
    if kind == "vanilla":
        v2h = polyline_mask(log_alpha, log_beta, "v2h", log_gamma)
        if form == "official":
            weights = 0.5 * (torch.softmax(logits + v2h.log(), -1) + torch.softmax(logits + v2h.mT.log(), -1))
        else:
            weights = torch.softmax(logits, -1) * (v2h + v2h.mT)
    else:
        decays = ([log_gamma] if log_gamma is not None else []) + [log_beta, log_alpha]
        a = [dense_line_attention(logits, d, axis, grid, form) for axis, d in enumerate(decays)]
        chain, reverse = a[-1], a[0]  # A_W A_H (A_T) and A_(T) A_H A_W
        for m in a[-2::-1]:
            chain = chain @ m
        for m in a[1:]:
            reverse = reverse @ m
        weights = 0.5 * (chain + reverse)
    return (weights @ v.flatten(2, -2)).unflatten(2, grid)


@pytest.mark.parametrize("kind,form", CASES)
@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_matches_the_dense_formulas(kind, form, grid):
    inputs = make_inputs(grid)
    got = polyline_attention(*inputs, kind=kind, form=form)
    assert got.shape == inputs[2].shape and got.dtype == torch.float64
    torch.testing.assert_close(got, dense_formula(*inputs, kind, form), msg=f"seed {torch.initial_seed()}")


@pytest.mark.parametrize("kind,form", CASES)
@pytest.mark.parametrize("grid", [(7, 9), (2, 3, 4)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_custom_op_is_bit_identical_to_autograd_through_the_reference(kind, form, grid, dtype):
    """The op (forward: the reference; backward: ``torch.func.vjp`` of it) changes no bit of the
    outputs or of any gradient, their strides included."""
    inputs = make_inputs(grid, dtype)
    grad = torch.randn(inputs[2].shape, dtype=dtype)
    results = []
    for fn in (partial(polyline_attention, backend="torch"), polyline_attention_reference):
        leaves = [t if t is None else t.detach().clone().requires_grad_() for t in inputs]
        out = fn(*leaves, kind=kind, form=form)
        grads = torch.autograd.grad(out, [t for t in leaves if t is not None], grad)
        results.append((out, *grads))
    for name, got, want in zip(["out", "dq", "dk", "dv", "dlog_alpha", "dlog_beta", "dlog_gamma"], *results):
        assert torch.equal(got, want), f"{name} differs (seed {torch.initial_seed()})"
        assert got.stride() == want.stride(), f"{name}: strides {got.stride()} != {want.stride()}"


def test_autocast_matches_the_reference_bit_for_bit():
    inputs = make_inputs((5, 6), torch.float32)
    for kind, form in CASES:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = polyline_attention(*inputs, kind=kind, form=form)
            want = polyline_attention_reference(*inputs, kind=kind, form=form)
        assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want), (kind, form)


def test_bad_inputs_name_the_argument():
    q, k, v, la, lb, _ = make_inputs((3, 4), torch.float32)
    with pytest.raises(ValueError, match="kind must be one of"):
        polyline_attention(q, k, v, la, lb, kind="linear")
    with pytest.raises(ValueError, match="form must be one of"):
        polyline_attention(q, k, v, la, lb, form="mul")
    with pytest.raises(ValueError, match=r"k has shape"):
        polyline_attention(q, k[..., :3], v, la, lb)
    with pytest.raises(ValueError, match=r"v must have shape \(B, heads, H, W, C\)"):
        polyline_attention(q, k, v[0], la, lb)
    with pytest.raises(ValueError, match="q has grid"):
        polyline_attention(q, k, v, la[..., :3], lb[..., :3])
    with pytest.raises(ValueError, match="v has grid"):
        polyline_attention(q, k, v[:, :, :2], la, lb)
    with pytest.raises(ValueError, match="log_beta must be <= 0"):
        polyline_attention(q, k, v, la, -lb)
    with pytest.raises(ValueError, match="q must be a floating-point"):
        polyline_attention(q.long(), k, v, la, lb)
