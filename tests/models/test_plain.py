"""PlainBackbone with a tiny sequence mixer defined here (no family uses it yet; Vim will)."""
import pytest
import torch
from torch import nn

from ppma.layers import GRID_2D, SEQUENCE
from ppma.models import PlainBackbone


class MeanTokenMixer(nn.Module):
    """``fc(x) + mean over tokens``: mixes across the whole sequence, class token included."""

    token_layout = SEQUENCE

    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.bias = nn.Parameter(torch.zeros(dim))
        self.bias._no_weight_decay = True

    def forward(self, x):
        return self.fc(x) + x.mean(1, keepdim=True) + self.bias


def tiny(**kwargs):
    kwargs = dict(dict(embed_dim=16, depth=4, patch_size=8, img_size=32, num_classes=5), **kwargs)
    return PlainBackbone(MeanTokenMixer, **kwargs)


@pytest.mark.parametrize("class_token,pool", [(True, "token"), (False, "avg"), (True, "avg")])
def test_forward_shapes_at_odd_sizes(class_token, pool):
    torch.manual_seed(0)
    model = tiny(class_token=class_token, global_pool=pool).eval()
    x = torch.randn(2, 3, 40, 59)  # 5 x 7 patches, not the 4 x 4 the position embedding is learned for
    feats = model.forward_features(x)
    assert feats.shape == (2, int(class_token) + 35, 16)
    assert model(x).shape == (2, 5) and model.forward_head(feats, pre_logits=True).shape == (2, model.head_hidden_size)
    expected = feats[:, 0] if pool == "token" else feats[:, int(class_token):].mean(1)
    torch.testing.assert_close(model.forward_head(feats, pre_logits=True), expected, msg="seed 0")


def test_intermediates_are_the_tapped_blocks():
    torch.manual_seed(0)
    model = tiny(taps=(1, -1)).eval()
    assert [f["module"] for f in model.feature_info] == ["blocks.1", "blocks.3"]
    x = torch.randn(1, 3, 24, 40)
    final, inter = model.forward_intermediates(x)
    tokens = model.stem(x)
    for i, block in enumerate(model.blocks):
        tokens = block(tokens)
        if i == 1:
            after_1 = tokens
    torch.testing.assert_close(final, model.forward_features(x), msg="seed 0")
    torch.testing.assert_close(inter[0], after_1[:, 1:].reshape(1, 3, 5, 16).permute(0, 3, 1, 2), msg="seed 0")
    assert inter[1].shape == (1, 16, 3, 5)
    normed = model.forward_intermediates(x, indices=1, norm=True, output_fmt="NHWC", intermediates_only=True)
    torch.testing.assert_close(normed[0], model.norm(tokens)[:, 1:].reshape(1, 3, 5, 16), msg="seed 0")
    assert model.prune_intermediate_layers((0,)) == [0]
    assert len(model.blocks) == 2 and model.head is None


def test_timm_api():
    torch.manual_seed(0)
    model = tiny()
    assert model.no_weight_decay() == {f"blocks.{i}.mixer.bias" for i in range(4)}
    assert model.frozen_modules(-1) == [] and model.frozen_modules(2) == [model.stem, model.blocks[0], model.blocks[1]]
    with pytest.raises(ValueError, match="frozen_stages"):
        model.frozen_modules(5)
    assert model.group_matcher()["stem"] == r"^stem"
    x = torch.randn(2, 3, 16, 24)
    model(x).sum().backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, reference[n], msg=f"seed 0: {n}")
    model.reset_classifier(0, "")
    assert model.eval()(x).shape == (2, 1 + 6, 16)


def test_fx_trace_matches_eager():
    from timm.models import create_feature_extractor  # timm's FX leaf modules and wrapped functions

    torch.manual_seed(0)
    model = tiny().eval()
    x = torch.randn(1, 3, 40, 24)
    out = create_feature_extractor(model, ["head.fc"])(x)["head.fc"]
    assert torch.equal(out, model(x)), "seed 0"


def test_bad_configs_and_inputs_raise():
    with pytest.raises(ValueError, match="class_token"):
        tiny(class_token=False)
    with pytest.raises(ValueError, match="works on '2d' tokens"):
        PlainBackbone(lambda dim: type("GridMixer", (nn.Identity,), {"token_layout": GRID_2D})(), depth=1)
    with pytest.raises(ValueError, match="too small"):
        tiny()(torch.randn(1, 3, 7, 32))
    with pytest.raises(ValueError, match="rank-5"):
        tiny()(torch.randn(1, 3, 2, 32, 32))


def test_middle_class_token_overlapping_patches_and_norm_layer():
    torch.manual_seed(0)
    model = tiny(class_token_position="middle", patch_stride=4, norm_layer=nn.RMSNorm, taps=(-1,)).eval()
    assert isinstance(model.norm, nn.RMSNorm) and model.stem.pos_embed.shape == (1, 1 + 7 * 7, 16)
    assert model.feature_info[0]["reduction"] == 4
    x = torch.randn(1, 3, 40, 59)  # 9 x 13 overlapping patches; the class token at 117 // 2 = 58
    stream = model.stem(x)
    for block in model.blocks:
        stream = block(stream)
    final, (inter,) = model.forward_intermediates(x)
    torch.testing.assert_close(final[:, 0], model.norm(stream)[:, 58], msg="seed 0")  # class token first
    torch.testing.assert_close(final[:, 1:], model.norm(torch.cat([stream[:, :58], stream[:, 59:]], 1)), msg="seed 0")
    torch.testing.assert_close(inter, torch.cat([stream[:, :58], stream[:, 59:]], 1).reshape(1, 9, 13, 16)
                               .permute(0, 3, 1, 2), msg="seed 0")
    torch.testing.assert_close(model(x), model.head.fc(final[:, 0]), msg="seed 0")
    with pytest.raises(ValueError, match="class_token_position"):
        tiny(class_token_position="last")
