"""HierarchicalBackbone with a mixer that is not PPMA's: the skeleton is generic."""
from functools import partial

import pytest
import torch
from torch import nn

from ppma.layers import GRID_2D, SEQUENCE
from ppma.models import HierarchicalBackbone


class ChannelMixer(nn.Module):
    """A stand-in token mixer: any module mapping (B, *grid, C) -> (B, *grid, C)."""

    def __init__(self, dim, layout=GRID_2D):
        super().__init__()
        self.token_layout = layout
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc(x)


def tiny(layout="2d", **kwargs):
    kwargs = dict(dict(embed_dims=(8, 16, 24, 32), depths=(1, 2, 1, 1)), **kwargs)
    return HierarchicalBackbone([partial(ChannelMixer, layout=layout)] * 4, token_layout=layout, **kwargs)


@pytest.mark.parametrize("layout,shape", [("2d", (2, 3, 40, 72)), ("3d", (1, 3, 2, 33, 64))])
def test_custom_mixer_backbone(layout, shape):
    torch.manual_seed(0)
    model = tiny(layout, num_classes=4, output_norms=(0, 3)).eval()
    x = torch.randn(shape)
    assert model(x).shape == (shape[0], 4)
    _, feats = model.forward_intermediates(x)
    assert [f.shape[1] for f in feats] == [8, 16, 24, 32]
    assert feats[0].shape[2:] == (*shape[2:-2], -(-shape[-2] // 4), -(-shape[-1] // 4))
    # stage 0 output is normed (zero mean over channels), stage 1 is raw
    assert feats[0].mean(1).abs().max() < 1e-5 and feats[1].mean(1).abs().max() > 1e-3, "seed 0"
    nhwc = model.forward_intermediates(x, indices=1, output_fmt="NHWC", intermediates_only=True)
    assert len(nhwc) == 1 and nhwc[0].shape[-1] == 32


def test_prune_and_per_stage_checks():
    model = tiny(depths=(1, 1, 1, 1), output_norms=True)
    assert model.prune_intermediate_layers((0, 1)) == [0, 1]
    assert len(model.stages) == 2 and model.head is None and sorted(model.out_norms) == ["0", "1"]
    with pytest.raises(RuntimeError, match="no classification head"):
        model.reset_classifier(3)
    with pytest.raises(ValueError, match="depths"):
        tiny(depths=(1, 1, 1))
    with pytest.raises(ValueError, match="block_kwargs"):
        tiny(block_kwargs=(dict(layerscale=True),))


def test_blocks_get_keyword_arguments_per_stage():
    model = tiny(block_kwargs=[dict(layerscale=s >= 2, layerscale_init=0.5) for s in range(4)])
    assert [type(stage.blocks[0].ls1).__name__ for stage in model.stages] == ["Identity"] * 2 + ["LayerScale"] * 2
    assert torch.equal(model.stages[3].blocks[0].ls1.gamma, torch.full((32,), 0.5))


def test_mixer_must_declare_the_backbone_layout():
    with pytest.raises(ValueError, match="'sequence' tokens .* feeds '2d' tokens"):
        HierarchicalBackbone([partial(ChannelMixer, layout=SEQUENCE)] * 4, embed_dims=(8, 16, 24, 32))
    with pytest.raises(ValueError, match="works on '2d' tokens .* feeds '3d'"):
        HierarchicalBackbone([ChannelMixer] * 4, embed_dims=(8, 16, 24, 32), token_layout="3d")
    with pytest.raises(ValueError, match="Linear must declare token_layout"):
        HierarchicalBackbone([lambda dim: nn.Linear(dim, dim)] * 4, embed_dims=(8, 16, 24, 32))


def test_frozen_modules():
    model = tiny(output_norms=(1, 2))
    assert model.frozen_modules(-1) == []
    assert model.frozen_modules(0) == [model.stem]
    frozen = model.frozen_modules(2)
    assert frozen == [model.stem, model.stages[0], model.stages[1], model.out_norms["1"]]
    assert model.frozen_modules(4)[-3:] == [model.stages[2], model.out_norms["2"], model.stages[3]]
    with pytest.raises(ValueError, match="frozen_stages must be in -1..4"):
        model.frozen_modules(5)


@pytest.mark.parametrize("layout,shape", [("2d", (1, 3, 36, 44)), ("3d", (1, 3, 2, 33, 40))])
def test_global_pool_off_gives_unpooled_maps(layout, shape):
    torch.manual_seed(0)
    model = tiny(layout, num_classes=5).eval()
    x = torch.randn(shape)
    pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    model.reset_classifier(0, "")
    maps = model(x)
    assert maps.shape == (1, model.head_hidden_size, *shape[2:-2], 2, 2)
    torch.testing.assert_close(maps.flatten(2).mean(-1), pooled, msg="seed 0")
    unpooled = tiny(layout, num_classes=0, global_pool="")
    assert unpooled.eval()(x).shape == maps.shape
    with pytest.raises(ValueError, match="global_pool"):
        model.reset_classifier(0, "max")


def test_fx_trace_matches_eager():
    from torchvision.models.feature_extraction import create_feature_extractor  # plain torch.fx tracing

    torch.manual_seed(0)
    model = tiny(output_norms=(1, 3)).eval()
    x = torch.randn(1, 3, 40, 56)
    fx = create_feature_extractor(model, ["stages.1", "head.fc"])
    out = fx(x)
    assert torch.equal(out["head.fc"], model(x)), "seed 0"
    with pytest.raises(ValueError, match="4 channels"):
        fx(torch.randn(1, 4, 40, 56))  # the input check survives tracing
