"""The linear kind's CPU kernel against the reference: both of its forms (the scans of the state,
in whole lines and in blocks with carries and padding; the quadratic form of small grids), odd
2-D and 3-D grids, batch 1, heads > 1, fp32 and fp64, values and every gradient."""
import pytest
import torch

from ppma.ops import polyline_linear_attention, select_backend
from ppma.ops._scratch import _LOCAL, release_scratch
from ppma.ops.polyline_linear_attention_impl import chunked, cpu, polyline_linear_attention_reference
from ppma.ops.polyline_mask_impl.reference import polyline_mask_1d
from ppma.ops.registry import get_op

# (13, 11) and (3, 7, 5) have lines longer than the blocks of BLOCKS, (1, 5) a one-token axis
GRIDS = [(7, 9), (9, 7), (1, 5), (13, 11), (2, 3, 4), (3, 7, 5)]
BLOCKS = {"whole": (64, 32), "blocks": (4, 3)}  # (WHOLE_LINE, BLOCK)


def make_inputs(grid, dtype=torch.float32, batch=1, heads=2, d=4, dv=3):
    """Positive features q, k, values v and decays ``(log_alpha, log_beta, log_gamma)``."""
    q, k = (torch.rand(batch, heads, *grid, d, dtype=dtype) + 0.1 for _ in range(2))
    v = torch.randn(batch, heads, *grid, dv, dtype=dtype)
    decays = [-torch.rand(batch, heads, *grid, dtype=dtype) * 2 for _ in grid]
    return q, k, v, decays[-1], decays[-2], decays[0] if len(grid) == 3 else None


def relative(got, want):
    return ((got - want).abs().max() / want.abs().max()).item()


def test_auto_picks_cpu_on_cpu():
    assert select_backend("polyline_linear_attention", "cpu", "auto") == "cpu"
    assert "CPU" in get_op("polyline_linear_attention").kernel("cpu").unavailable(torch.device("meta"))


def test_decay_mask_is_the_1d_polyline_mask():
    log_decay = -torch.rand(3, 2, 9, dtype=torch.float64) * 3
    torch.testing.assert_close(cpu.decay_mask(log_decay.exp()), polyline_mask_1d(log_decay))


@pytest.mark.parametrize("budget", [1, cpu.CHUNK_ELEMENTS], ids=["chunk1", "default"])
@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_scans_match_the_reference(grid, dtype, blocks, budget, monkeypatch):
    """``budget=1``: one key feature of one ``(batch, head)`` a chunk (batch 2, so rows vary)."""
    monkeypatch.setattr(cpu, "WHOLE_LINE", BLOCKS[blocks][0])
    monkeypatch.setattr(cpu, "BLOCK", BLOCKS[blocks][1])
    inputs = make_inputs(grid, dtype, batch=2 if budget == 1 else 1)
    got = cpu.linear_attention_cpu(*inputs, budget=budget, quadratic=False)
    assert got.dtype == dtype and got.shape == inputs[2].shape
    assert relative(got, polyline_linear_attention_reference(*inputs)) < (1e-5 if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("budget", [1, cpu.CHUNK_ELEMENTS], ids=["row_chunks", "default"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_quadratic_form_matches_the_reference(grid, dtype, budget):
    inputs = make_inputs(grid, dtype, batch=2)
    got = cpu.linear_attention_cpu(*inputs, budget=budget, quadratic=True)
    assert relative(got, polyline_linear_attention_reference(*inputs)) < (1e-5 if dtype == torch.float32 else 1e-12)


def test_the_cheaper_form_is_chosen():
    """Stage 1 of PPMA-T at 224 (56 x 56, d = 16) scans; its later stages (28 x 28 and smaller,
    d = 32) take the quadratic form."""
    assert not cpu.quadratic_is_cheaper((56, 56), 16, 17)
    assert all(cpu.quadratic_is_cheaper((n, n), 32, 33) for n in (28, 14, 7))


def test_buffers_hold_one_chunk_of_the_state():
    """The whole grid's ``d x dv`` state never exists: every scratch buffer of the scans holds at
    most ``budget`` elements (here 2 of the 4 key features of one row)."""
    inputs = make_inputs((13, 11), heads=3)
    budget = 2 * 13 * 11 * 4
    release_scratch()
    cpu.linear_attention_cpu(*inputs, budget=budget, quadratic=False)
    assert max(b.numel() for b in _LOCAL.buffers.values()) <= budget
    release_scratch()


@pytest.mark.parametrize("grid", [(7, 9), (13, 11), (2, 3, 4)], ids=str)
def test_op_values_and_gradients_match_the_reference(grid, monkeypatch):
    """Through the custom op (``backend='cpu'``); its backward is the chunked path's from the
    forward's numerator: the chunked forward never runs."""
    monkeypatch.setattr(cpu, "WHOLE_LINE", 8)
    calls = []
    forward = chunked._forward
    monkeypatch.setattr(chunked, "_forward", lambda *a: calls.append(1) or forward(*a))
    inputs = [t.requires_grad_() if t is not None else None for t in make_inputs(grid)]
    present = [t for t in inputs if t is not None]
    grad = torch.randn_like(inputs[2])
    got = polyline_linear_attention(*inputs, backend="cpu")
    got_grads = torch.autograd.grad(got, present, grad)
    assert not calls, "the chunked forward ran"
    want = polyline_linear_attention_reference(*inputs)
    for g, w in zip([got, *got_grads], [want, *torch.autograd.grad(want, present, grad)]):
        assert relative(g, w) < 1e-5


@pytest.mark.parametrize("grid, whole_line", [((5, 7), 16), ((13, 11), 8)], ids=["whole", "padded blocks"])
def test_opcheck(grid, whole_line, monkeypatch):
    """Also where the scans pad the lines to whole blocks (13 x 11 in blocks of 8): the numerator
    the forward keeps is laid out as its fake says."""
    monkeypatch.setattr(cpu, "WHOLE_LINE", whole_line)
    inputs = make_inputs(grid, torch.float64)
    torch.library.opcheck(torch.ops.ppma.polyline_linear_attention.default, (*inputs, 1e-6, "cpu", True))


def test_bfloat16_inputs_give_bfloat16():
    inputs = make_inputs((5, 6), torch.bfloat16)
    got = cpu.linear_attention_cpu(*inputs)
    want = polyline_linear_attention_reference(*[t.float() if t is not None else None for t in inputs])
    assert got.dtype == torch.bfloat16 and relative(got.float(), want) < 1e-2
