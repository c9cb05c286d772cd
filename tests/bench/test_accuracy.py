"""ppma.kernels.common.accuracy: what the kernel benchmarks compare in the run they time."""
import pytest
import torch

from ppma.kernels.common.accuracy import fp32_copies, outcome, relative_error


def test_relative_error_is_the_worst_pair():
    want = [torch.tensor([1.0, -4.0]), torch.tensor([2.0])]
    assert relative_error([torch.tensor([1.0, -3.0]), torch.tensor([2.0])], want) == 0.25
    assert relative_error([torch.tensor([1.0, -4.0]), torch.tensor([1.5])], want) == 0.25
    with pytest.raises(ValueError, match="1 results against 2"):
        relative_error(want[:1], want)


def test_outcome_and_fp32_copies():
    """The output, then the gradients of the inputs that require grad (None skipped), for a bf16
    function and its fp32 copy."""
    x = torch.randn(3, 4).bfloat16().requires_grad_()
    w = torch.randn(4, 2).bfloat16()
    grad = torch.randn(3, 2)
    got = outcome(lambda a, b, _: a @ b, [x, w, None], grad, backward=True)
    copies = fp32_copies([x, w, None])
    assert [c.dtype for c in copies[:2]] == [torch.float32] * 2 and copies[2] is None
    assert copies[0].requires_grad and not copies[1].requires_grad and copies[0].is_leaf
    want = outcome(lambda a, b, _: a @ b, copies, grad, backward=True)
    assert [t.shape for t in got] == [(3, 2), (3, 4)] and [t.shape for t in want] == [(3, 2), (3, 4)]
    assert relative_error(want, [x.float() @ w.float(), grad @ w.float().T]) < 1e-6
    assert 0 < relative_error(got, want) < 2e-2
    assert len(outcome(lambda a, b, _: a @ b, [x, w, None], grad, backward=False)) == 1
