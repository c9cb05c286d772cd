"""``torch.jit.trace`` (the tracer of the TorchScript ONNX exporter, which mmdeploy drives) sees
each registered op's export form: the trace holds no ``ppma::`` op and gives eager's outputs."""
import pytest
import timm
import torch

import ppma  # noqa: F401  (registers the presets)

PRESETS = ["test_ppma", "test_vmamba", "test_vim"]  # the families that call registered ops


@pytest.mark.parametrize("name", PRESETS)
def test_traced_model_has_plain_aten_ops_and_the_same_outputs(name):
    model = timm.create_model(name, features_only=True).eval()
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        traced = torch.jit.trace(model, x, check_trace=False)
        expected = model(x)
        got = traced(x)
    assert "ppma::" not in str(traced.inlined_graph)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)

