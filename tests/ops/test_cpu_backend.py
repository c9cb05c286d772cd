"""The CPU backend against the plain reference: values and gradients, random odd grids."""
import math

import pytest
import torch

from ppma.ops import polyline_attention, polyline_attention_reference, select_backend
from ppma.ops.polyline_attention_impl import cpu
from ppma.ops.registry import get_op

CASES = [("vanilla", "official"), ("vanilla", "paper"), ("criss_cross", "official"), ("criss_cross", "paper")]
GRIDS = [(7, 9), (9, 7), (1, 5), (3, 5, 4)]


def make_inputs(grid, dtype, batch=1, heads=2, d=8, dv=5, seed=0):
    """q, k, v laid out as the layer does (heads moved out of channels-last) and decays, all
    requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, *grid, heads, d, generator=gen, dtype=dtype).movedim(-2, 1) for _ in range(2))
    v = torch.randn(batch, *grid, heads, dv, generator=gen, dtype=dtype).movedim(-2, 1)
    decays = [-2 * torch.rand(batch, heads, *grid, generator=gen, dtype=dtype) for _ in grid]
    tensors = [t.requires_grad_() for t in (q, k, v, *decays)]
    log_gamma = tensors[3] if len(grid) == 3 else None
    return (*tensors[:3], tensors[-1], tensors[-2], log_gamma)


def present(inputs):
    return [t for t in inputs if t is not None]


def test_auto_picks_cpu_on_cpu():
    assert select_backend("polyline_attention", "cpu", "auto") == "cpu"
    unavailable = get_op("polyline_attention").kernel("cpu").unavailable
    assert unavailable(torch.device("cpu")) is None and "CPU" in unavailable(torch.device("meta"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("kind,form", CASES)
@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_values_and_gradients_match_the_reference(grid, kind, form, dtype):
    inputs = make_inputs(grid, dtype, batch=2 if grid == (9, 7) else 1)
    want = polyline_attention_reference(*inputs, kind, form)
    got = polyline_attention(*inputs, kind=kind, form=form, backend="cpu")
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(got, want, **tol)
    grad = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, present(inputs), grad),
                               torch.autograd.grad(want, present(inputs), grad), **tol)


@pytest.mark.parametrize("form", ["official", "paper"])
@pytest.mark.parametrize("grid", [(7, 9), (3, 5, 4)], ids=str)
@pytest.mark.parametrize("rows", [1, 3, "3 frames"], ids=["one_row", "three_rows", "three_pairs"])
def test_vanilla_blocks_match_one_block(grid, form, rows):
    """Blocks of one query row of one (batch, head) pair, of three rows of one pair (the last
    block holds fewer) and of whole frames of three of the four pairs (the last block holds one)
    give the values and gradients of a single block."""
    inputs = make_inputs(grid, torch.float64, batch=2, seed=1)
    args = (*inputs, form)
    grad = torch.randn_like(inputs[2])
    frames, height, width = (1, *grid) if len(grid) == 2 else grid
    row = width * math.prod(grid)  # weights of one query row
    block_elements, count = {1: (1, 4 * frames * height),
                             3: (3 * row, 4 * frames * math.ceil(height / 3)),
                             "3 frames": (3 * height * row, 2 * frames)}[rows]
    q = cpu._pairs_first(*inputs[:3], inputs[5])[0]
    assert len(cpu._blocks(*q.shape[:4], block_elements)) == count
    with torch.no_grad():
        small, whole = ((cpu._vanilla_forward(*args, block_elements=elements),
                         cpu._vanilla_backward(grad, *args, block_elements=elements))
                        for elements in (block_elements, 1 << 30))
    torch.testing.assert_close(small, whole)
    want = polyline_attention_reference(*inputs, "vanilla", form)
    torch.testing.assert_close(small[0], want)
    torch.testing.assert_close(list(small[1]), list(torch.autograd.grad(want, present(inputs), grad)))


@pytest.mark.parametrize("kind,form", CASES)
def test_autocast_multiplies_in_bfloat16_as_the_reference(kind, form):
    inputs = make_inputs((5, 6), torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = polyline_attention(*inputs, kind=kind, form=form, backend="cpu")
        want = polyline_attention_reference(*inputs, kind=kind, form=form)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)
    grad = torch.randn_like(want)
    got_grads = torch.autograd.grad(got, present(inputs), grad)
    assert [g.dtype for g in got_grads] == [torch.float32] * 5
    torch.testing.assert_close(got_grads, torch.autograd.grad(want, present(inputs), grad), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("form", ["official", "paper"])
@pytest.mark.parametrize("grid", [(7, 9), (3, 5, 4)], ids=str)
@pytest.mark.parametrize("block_elements", [1, 100], ids=["one_line", "some_lines"])
def test_criss_cross_in_chunks_of_lines_matches_the_reference(grid, form, block_elements):
    inputs = [t if t is None else t.detach() for t in make_inputs(grid, torch.float64, batch=2, seed=2)]
    got = cpu._criss_cross_forward(*inputs, form, block_elements=block_elements, whole=0)
    torch.testing.assert_close(got, polyline_attention_reference(*inputs, "criss_cross", form))


@pytest.mark.parametrize("form", ["official", "paper"])
@pytest.mark.parametrize("grid", [(7, 9), (3, 5, 4)], ids=str)
@pytest.mark.parametrize("pairs", [1, 3], ids=["one_pair", "three_pairs"])
def test_criss_cross_in_chunks_of_pairs_matches_the_reference(grid, form, pairs):
    """Chunks of one and of three of the four (batch, head) pairs (the last chunk holds one)."""
    inputs = [t if t is None else t.detach() for t in make_inputs(grid, torch.float64, batch=2, seed=3)]
    got = cpu._criss_cross_forward(*inputs, form, chunk_elements=pairs * math.prod(grid) * sum(grid))
    torch.testing.assert_close(got, polyline_attention_reference(*inputs, "criss_cross", form))


@pytest.mark.parametrize("kind,form", CASES)
def test_vanishing_decays_cut_the_mask_as_in_the_reference(kind, form):
    """Decays of zero (log-decay -inf) and below e^-1e4 (the criss-cross kind counts those as
    -1e4): the mask is cut there, as in the reference."""
    q, k, v, log_alpha, log_beta, _ = [t if t is None else t.detach() for t in make_inputs((7, 9), torch.float32)]
    log_alpha[..., 3] = -math.inf
    log_beta[..., 2, :] = -1e5
    got = polyline_attention(q, k, v, log_alpha, log_beta, kind=kind, form=form, backend="cpu")
    torch.testing.assert_close(got, polyline_attention_reference(q, k, v, log_alpha, log_beta, None, kind, form),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("whole_line", [1, 64], ids=["blocks", "whole_lines"])
@pytest.mark.parametrize("grid", [(37, 5), (3, 18, 2)], ids=str)
def test_linear_blocked_scan_in_blocks_and_whole_lines_matches_the_reference(grid, whole_line, monkeypatch):
    """The linear kind's CPU scan: lines cut in 16-token blocks (carry across) and whole lines."""
    from ppma.ops.polyline_linear_attention_impl import (
        blocked_scan,
        polyline_linear_attention_chunked,
        polyline_linear_attention_reference,
    )

    monkeypatch.setattr(blocked_scan, "WHOLE_LINE", whole_line)
    q, k, v, *decays = make_inputs(grid, torch.float64)
    q, k = (t.detach().abs().requires_grad_() for t in (q, k))  # non-negative features
    inputs = (q, k, v, *decays)
    grad = torch.randn(v.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got, want = [[fn(*inputs), *torch.autograd.grad(fn(*inputs), present(inputs), grad)]
                 for fn in (polyline_linear_attention_chunked, polyline_linear_attention_reference)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
