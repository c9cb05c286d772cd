"""``ppma.ops.polyline_linear_attention``: the chunked paths against the reference (values and
every gradient), and its peak memory against the reference's."""
import pytest
import torch

from ppma.kernels.common.runtime import triton_unavailable_reason
from ppma.ops import polyline_linear_attention, polyline_mask
from ppma.ops.polyline_linear_attention_impl import (
    chunked,
    polyline_linear_attention_chunked,
    polyline_linear_attention_reference,
)

# Odd grids, H != W: lines of at most blocked_scan.WHOLE_LINE = 64 tokens are one scan block;
# (67, 3) has lines of several blocks of blocked_scan.BLOCK = 16 tokens (with a carry between them).
GRIDS = [(7, 9), (1, 9), (37, 5), (67, 3), (2, 3, 4), (3, 18, 2)]


def make_inputs(grid, dtype=torch.float32, batch=1, heads=2, d=4, dv=3):
    """Positive features q, k, values v and fp32 decays ``(log_alpha, log_beta, log_gamma)``."""
    q, k = (torch.rand(batch, heads, *grid, d, dtype=dtype) + 0.1 for _ in range(2))
    v = torch.randn(batch, heads, *grid, dv, dtype=dtype)
    decays = [-torch.rand(batch, heads, *grid) * 2 for _ in grid]
    return q, k, v, decays[-1], decays[-2], decays[0] if len(grid) == 3 else None


def values_and_grads(fn, inputs, grad):
    inputs = [t.detach().requires_grad_() if t is not None else None for t in inputs]
    out = fn(*inputs)
    present = [t for t in inputs if t is not None]
    return [out, *torch.autograd.grad(out, present, grad)]


def test_reference_is_the_dense_formula():
    q, k, v, la, lb, _ = make_inputs((3, 4), torch.float64)
    weights = (q.flatten(2, 3) @ k.flatten(2, 3).mT) * polyline_mask(la, lb, "both")  # (B, heads, N, N)
    want = (weights @ v.flatten(2, 3)) / (weights.sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(polyline_linear_attention_reference(q, k, v, la, lb), want.unflatten(2, (3, 4)))


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize("budget", [1, 2**22], ids=["chunk1", "whole"])
def test_chunked_matches_reference(grid, budget):
    inputs = make_inputs(grid, batch=2 if budget == 1 else 1)
    grad = torch.randn_like(inputs[2])
    got = values_and_grads(lambda *t: polyline_linear_attention_chunked(*t, budget=budget), inputs, grad)
    want = values_and_grads(polyline_linear_attention_reference, inputs, grad)
    for name, g, w in zip(["out", "q", "k", "v", "log_alpha", "log_beta", "log_gamma"], got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * w.abs().max().item(), msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("grid", [(7, 9), (2, 3, 4)], ids=str)
def test_fp16_inputs_against_fp32_reference(grid):
    inputs = make_inputs(grid, dtype=torch.float16)
    grad = torch.randn_like(inputs[2])
    got = values_and_grads(polyline_linear_attention, inputs, grad)
    upcast = [t.float() if t is not None and t.dtype == torch.float16 else t for t in inputs]
    want = values_and_grads(polyline_linear_attention_reference, upcast, grad.float())
    assert got[0].dtype == torch.float16 and got[1].dtype == torch.float16
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w, rtol=1e-2, atol=1e-2 * w.abs().max().item())


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_op_backends_and_opcheck(backend):
    if backend == "triton" and triton_unavailable_reason("cpu") is not None:
        pytest.skip("Triton cannot run here: set TRITON_INTERPRET=1 (CI does) or use a GPU")
    inputs = make_inputs((5, 7), torch.float64)
    grad = torch.randn_like(inputs[2])
    got = values_and_grads(lambda *t: polyline_linear_attention(*t, backend=backend), inputs, grad)
    want = values_and_grads(polyline_linear_attention_reference, inputs, grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7 * w.abs().max().item())
    torch.library.opcheck(torch.ops.ppma.polyline_linear_attention.default, (*inputs, 1e-6, backend, True))


def largest_saved_tensor(fn, inputs) -> int:
    """Elements of the largest tensor autograd saves during ``fn``'s forward and backward
    (including the graphs built inside a backward): a deterministic stand-in for peak memory."""
    present = [t for t in inputs if t is not None]
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.autograd.grad(fn(*inputs).square().sum(), present)
    return max(sizes)


def test_memory_is_far_below_the_reference():
    """Forward + backward at a 40 x 24 grid (d = dv = 16): the reference keeps every token's
    ``d * dv + d`` state channels for the backward, the chunked path one chunk of them (and its
    scan factors, ``T + 2`` per token and line)."""
    inputs = [t.requires_grad_() if t is not None else None for t in make_inputs((40, 24), heads=1, d=16, dv=16)]
    reference = largest_saved_tensor(polyline_linear_attention_reference, inputs)
    in_chunks = largest_saved_tensor(lambda *t: polyline_linear_attention_chunked(*t, budget=2**15), inputs)
    assert reference >= 40 * 24 * (16 * 16 + 16)
    # one chunk of 2 features x 17 channels, its lines padded to whole scan blocks (40 -> 48)
    assert in_chunks <= 2 * 2**15 and 5 * in_chunks < reference, (in_chunks, reference)


def test_input_errors_name_the_problem():
    q, k, v, la, lb, _ = make_inputs((3, 4))
    with pytest.raises(ValueError, match="k has shape"):
        polyline_linear_attention(q, k[..., :2], v, la, lb)
    with pytest.raises(ValueError, match="v has grid"):
        polyline_linear_attention(q, k, v[:, :, :2], la, lb)
    with pytest.raises(ValueError, match="eps must be > 0"):
        polyline_linear_attention(q, k, v, la, lb, eps=0.0)
    with pytest.raises(ValueError, match="log_alpha must be <= 0"):
        polyline_linear_attention(q, k, v, -la, lb)


def test_chunk_budget_by_device():
    """CPU chunks stay near the caches; a GPU's are 8x larger, so that the host's ops per chunk
    do not set the pace: PPMA-linear-T's stage 1 at batch 64 (256 rows of 56 x 56 tokens, d = 16)
    is 64 chunks on the CPU's budget and 7 on a GPU's."""
    assert chunked.chunk_elements(torch.device("cpu")) == chunked.CHUNK_ELEMENTS == 2**22
    assert chunked.chunk_elements(torch.device("cuda")) == chunked.GPU_CHUNK_ELEMENTS == 2**25
    plans = [chunked._chunks(256, 56 * 56, 16, 17, chunked.chunk_elements(torch.device(d))) for d in ("cpu", "cuda")]
    assert [len(p) for p in plans] == [64, 7]
    assert all(rows.stop - rows.start <= 256 and len(features) == 1 for p in plans for rows, features in p)
