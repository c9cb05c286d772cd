"""HierarchicalBackbone with a mixer that is not PPMA's: the skeleton is generic."""
import pytest
import torch
from torch import nn

from ppma.models import HierarchicalBackbone


class ChannelMixer(nn.Module):
    """A stand-in token mixer: any module mapping (B, *grid, C) -> (B, *grid, C)."""

    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc(x)


@pytest.mark.parametrize("grid,shape", [("2d", (2, 3, 40, 72)), ("3d", (1, 3, 2, 33, 64))])
def test_custom_mixer_backbone(grid, shape):
    model = HierarchicalBackbone([ChannelMixer] * 4, embed_dims=(8, 16, 24, 32), depths=(1, 2, 1, 1),
                                 num_classes=4, grid=grid, output_norms=(0, 3)).eval()
    x = torch.randn(shape)
    assert model(x).shape == (shape[0], 4)
    _, feats = model.forward_intermediates(x)
    assert [f.shape[1] for f in feats] == [8, 16, 24, 32]
    assert feats[0].shape[2:] == (*shape[2:-2], -(-shape[-2] // 4), -(-shape[-1] // 4))
    # stage 0 output is normed (zero mean over channels), stage 1 is raw
    assert feats[0].mean(1).abs().max() < 1e-5 and feats[1].mean(1).abs().max() > 1e-3
    nhwc = model.forward_intermediates(x, indices=1, output_fmt="NHWC", intermediates_only=True)
    assert len(nhwc) == 1 and nhwc[0].shape[-1] == 32


def test_prune_and_per_stage_checks():
    model = HierarchicalBackbone([ChannelMixer] * 4, embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), output_norms=True)
    assert model.prune_intermediate_layers((0, 1)) == [0, 1]
    assert len(model.stages) == 2 and model.head is None and sorted(model.out_norms) == ["0", "1"]
    with pytest.raises(RuntimeError, match="no classification head"):
        model.reset_classifier(3)
    with pytest.raises(ValueError, match="depths"):
        HierarchicalBackbone([ChannelMixer] * 4, embed_dims=(8, 16, 24, 32), depths=(1, 1, 1))
    with pytest.raises(ValueError, match="layerscale"):
        HierarchicalBackbone([ChannelMixer] * 4, embed_dims=(8, 16, 24, 32), depths=(1,) * 4, layerscale=(True,))
