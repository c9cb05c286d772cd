"""``torch.compile(fullgraph=True)`` of every family's ``test_*`` preset on the CPU, train and eval:
Dynamo traces each forward in one graph, with no graph break, and AOTAutograd traces and runs its
backward graph (the custom ops' backward included).

The ``aot_eager`` compiler backend keeps this fast (seconds a preset): a graph break raises under
``fullgraph=True`` whatever the backend; Inductor's code generation is checked by the slow test."""
import copy

import pytest
import timm
import torch

import ppma  # noqa: F401  (registers the presets)
from ppma.models.family import families

PRESETS = [f.test_preset for f in families()]


@pytest.mark.parametrize("name", PRESETS)
def test_compile_fullgraph_train_and_eval(name):
    # the presets share code objects (the skeletons' forward): each test starts from an empty
    # Dynamo cache, so that the families compiled before it do not count towards its recompile limit
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = timm.create_model(name)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=False)
    x = torch.randn(2, 3, 40, 48)
    model.train()
    compiled(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_inductor_trains_every_family(name):
    """Inductor's code generation in a training step (minutes a preset on 2 CPU cores): no graph
    break under ``fullgraph=True``, outputs and every gradient equal to eager."""
    torch.manual_seed(0)
    model = timm.create_model(name, drop_path_rate=0.0).train()
    eager = copy.deepcopy(model)
    x = torch.randn(2, 3, 40, 48)
    got = torch.compile(model, fullgraph=True, dynamic=False)(x)
    got.sum().backward()
    want = eager(x)
    want.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    scale = max(p.grad.abs().max().item() for p in eager.parameters())
    for (key, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4 * scale, msg=key)
