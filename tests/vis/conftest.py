"""Shared pieces of the ppma.vis tests: micro models and a dense oracle of a layer's attention."""
import copy

import pytest
import torch

MICRO = dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))


@pytest.fixture(autouse=True)
def torch_backend(monkeypatch):
    """The Triton kernels are tested in tests/kernels; here their interpreter would only cost time."""
    monkeypatch.setenv("PPMA_BACKEND", "torch")


@pytest.fixture
def micro_model():
    """``micro_model(kinds, name='ppma_tiny')``: a tiny timm PPMA model in eval mode."""
    timm = pytest.importorskip("timm", reason="the vis tests build models through timm")
    import ppma  # noqa: F401  (registers the presets)

    def build(kinds=("criss_cross", "criss_cross", "vanilla", "vanilla"), name="ppma_tiny", **kwargs):
        return timm.create_model(name, **{**MICRO, **kwargs}, attn_kinds=tuple(kinds)).eval()

    return build


def dense_attention(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``(B, heads, N, N)`` matrix the PolylineAttention ``layer`` applies to its values for input ``x``.

    Found from the layer's own forward: LePE zeroed, ``out_proj`` the identity, and one-hot
    values (key ``m`` in channel ``c`` of every head) fed through a hook on ``v_proj``.
    """
    layer = copy.deepcopy(layer)
    with torch.no_grad():
        for p in layer.lepe.parameters():
            p.zero_()
        layer.out_proj.weight.copy_(torch.eye(layer.dim))
        layer.out_proj.bias.zero_()
    batch, grid = x.shape[0], x.shape[1:-1]
    n, heads, d = grid.numel(), layer.num_heads, layer.dim // layer.num_heads
    columns = []
    for first in range(0, n, d):
        width = min(d, n - first)
        v = torch.zeros(batch, n, heads, d)
        v[:, first : first + width, :, :width] = torch.eye(width)[:, None, :]
        handle = layer.v_proj.register_forward_hook(lambda *_, v=v: v.reshape(batch, *grid, -1))
        with torch.no_grad():
            out = layer(x)
        handle.remove()
        columns.append(out.reshape(batch, n, heads, d)[..., :width].transpose(1, 2))
    return torch.cat(columns, -1)


@pytest.fixture
def dense_oracle():
    return dense_attention
