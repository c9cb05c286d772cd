"""``torch.compile(fullgraph=True)`` of every family's ``test_*`` preset on the CPU, train and eval:
Dynamo traces each forward (and the train step's backward) in one graph, with no graph break.

The ``eager`` compiler backend keeps this fast: a graph break raises under ``fullgraph=True``
whatever the backend, and Inductor's code generation is not what is checked here."""
import os

import pytest
import timm
import torch

import ppma  # noqa: F401  (registers the presets)

# 1 to 2.5 minutes each on 2 busy cores: run with PPMA_TEST_ALL_EXPORTS=1 (as the slow exports).
SLOW = pytest.mark.skipif(os.environ.get("PPMA_TEST_ALL_EXPORTS") != "1",
                          reason="slow (minutes on 2 cores): PPMA_TEST_ALL_EXPORTS=1 runs it")
# Known bug: the compiled backward of test_ppma fails in every block kind (criss-cross and
# vanilla; torch and cpu backends) with "view size is not compatible with input tensor's size
# and stride"; the ops alone, on contiguous inputs, compile forward and backward.
PPMA_BACKWARD = pytest.mark.xfail(strict=True, raises=RuntimeError,
                                  reason="compiled backward of PPMA blocks: view of a non-viewable gradient")
PRESETS = [pytest.param("test_ppma", marks=[SLOW, PPMA_BACKWARD]), pytest.param("test_vmamba", marks=SLOW),
           pytest.param("test_vim", marks=SLOW), pytest.param("test_mila", marks=SLOW)]


@pytest.mark.parametrize("name", PRESETS)
def test_compile_fullgraph_train_and_eval(name):
    torch.manual_seed(0)
    model = timm.create_model(name)
    compiled = torch.compile(model, fullgraph=True, backend="eager", dynamic=False)
    x = torch.randn(2, 3, 40, 48)
    model.train()
    compiled(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
