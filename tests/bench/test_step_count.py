"""ppma.bench.step_count: the ops, copies and bytes of one training step, pinned per tiny preset.

A change that adds ops or copies to a training step moves these counts (they follow the layers,
not the input size); update the pins only for a change that means to, and say why in its commit.
"""
import pytest
import timm
import torch

import ppma  # noqa: F401  (registers the presets)
from ppma.bench.step_count import OpCounter, count_training_step

# preset -> (ops, ops with a kernel, copies, MiB copied), one step at 2x3x64x64, fp32, the
# training arrangement (ppma.layers.paths.GPU_PATHS), PPMA_BACKEND=auto (CPU kernels, one op each)
PINNED = {
    "ppma_tiny": (3942, 1298, 49, 2.64),
    "ppma_linear_tiny": (4194, 1466, 49, 2.64),
    "vmamba_tiny": (2207, 742, 1, 0.02),
    "vim_tiny": (7198, 3289, 144, 8.37),
    "mila_tiny": (5982, 2138, 117, 7.11),
}


def test_counter_sees_copies_views_and_kernels():
    x = torch.randn(3, 5)
    with OpCounter() as counter:
        x.t().clone()
        x.to(torch.float64)
        (x + 1).relu_()
    assert counter.by_op == {"aten::t": 1, "aten::clone": 1, "aten::_to_copy": 1, "aten::add": 1, "aten::relu_": 1}
    assert counter.kernel_ops == 4 and counter.copies == 2
    assert counter.copied_bytes == 15 * 4 + 15 * 8


@pytest.mark.parametrize("name", sorted(PINNED))
def test_training_step_counts_are_pinned(name, monkeypatch):
    monkeypatch.setenv("PPMA_BACKEND", "auto")
    torch.manual_seed(0)
    model = timm.create_model(name)
    count = count_training_step(model, torch.randn(2, 3, 64, 64))
    got = (count.ops, count.kernel_ops, count.copies, count.copied_bytes / 2**20)
    for what, pinned, value in zip(("ops", "kernel ops", "copies", "MiB copied"), PINNED[name], got):
        assert abs(value - pinned) <= 0.1 * pinned + 0.05, f"{name}: {what} {value} per step, pinned {pinned}"
    assert count.optimizer_tensors == sum(1 for p in model.parameters() if p.requires_grad)
    assert count.by_op["aten::_foreach_add_"] >= 1  # the optimizer's update is counted too


class TwoMaps(torch.nn.Module):
    """A features_only-like model: two maps of different sizes."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 4), torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.a(x), self.b(x)


@pytest.mark.parametrize("outputs", ["last", "all"])
def test_the_loss_takes_the_last_output_or_all_of_them(outputs):
    """``step_count`` counts with the last map's loss; the GPU throughput trains on every map's
    (:func:`ppma.bench.gpu.throughput.training_step`, the same step with ``outputs='all'``)."""
    from ppma.bench.gpu.throughput import training_step as throughput_step
    from ppma.bench.step_count import training_step

    torch.manual_seed(0)
    x, model = torch.randn(5, 3), TwoMaps()
    a, b = model(x)
    want = {"last": b.mean(), "all": torch.cat([a.flatten(), b.flatten()]).mean()}[outputs]
    grads = torch.autograd.grad(want, [model.a.weight, model.b.weight], allow_unused=True, materialize_grads=True)
    captured = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # keeps the weights; records the gradients
    optimizer.step = lambda: captured.extend(torch.zeros_like(p) if p.grad is None else p.grad.clone()
                                             for p in (model.a.weight, model.b.weight))
    training_step(model, x, optimizer, outputs=outputs)
    assert len(captured) == 2
    for got, expected in zip(captured, grads):
        torch.testing.assert_close(got, expected)
    if outputs == "all":  # the same loss under bf16 autocast: AdamW updates both maps' weights
        before = [model.a.weight.clone(), model.b.weight.clone()]
        throughput_step(model, x)()
        assert not any(torch.equal(w, p) for w, p in zip(before, (model.a.weight, model.b.weight)))
    with pytest.raises(ValueError, match="outputs='first'"):
        training_step(model, x, optimizer, outputs="first")
