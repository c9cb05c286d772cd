"""Blocks, FFN, depthwise conv, stems, downsampler and heads against their formulas."""
import pytest
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from torch import nn

from ppma.layers import (
    ConvDownsample,
    ConvFFN,
    ConvStem,
    GridDepthwiseConv,
    MixerBlock,
    PatchStem,
    ProjectionHead,
    SequenceBlock,
    TokenPoolHead,
)


def test_depthwise_conv_is_per_frame_and_channels_last():
    torch.manual_seed(0)
    conv = GridDepthwiseConv(6, 3)
    x = torch.randn(2, 3, 5, 7, 6)
    y = conv(x)
    for t in range(3):
        frame = F.conv2d(x[:, t].permute(0, 3, 1, 2), conv.weight, conv.bias, padding=1, groups=6)
        torch.testing.assert_close(y[:, t], frame.permute(0, 2, 3, 1), msg=f"seed 0, frame {t}")
    scripted = torch.jit.script(conv)
    assert torch.equal(scripted(x), y) and torch.equal(scripted(x[:, 0]), conv(x[:, 0])), "seed 0"


def _values_and_gradients(module, formula, x):
    """``module(x)`` and ``formula(x)`` (the plain arithmetic), values and the gradients of ``x``
    and every parameter under one random output gradient."""
    x = x.clone().requires_grad_()
    params = (x, *module.parameters())
    out, expected = module(x), formula(x)
    g = torch.randn_like(out)
    got = (out, *torch.autograd.grad((out * g).sum(), params))
    return got, (expected, *torch.autograd.grad((expected * g).sum(), params))


@pytest.mark.parametrize("shape", [(1, 7, 9, 4), (2, 2, 5, 3, 4)])
def test_ffn_formula_values_and_gradients(shape):
    torch.manual_seed(0)
    ffn = ConvFFN(4, 10)

    def formula(x):
        h = F.gelu(ffn.fc1(x))
        return ffn.fc2(h + ffn.dwconv(h))

    for got, want in zip(*_values_and_gradients(ffn, formula, torch.randn(shape))):
        torch.testing.assert_close(got, want, msg="seed 0")


@pytest.mark.parametrize("layerscale", [False, True])
def test_block_formula_values_and_gradients(layerscale):
    torch.manual_seed(0)
    mixer = nn.Linear(8, 8)
    block = MixerBlock(8, mixer, mlp_ratio=2.0, layerscale=layerscale, layerscale_init=0.5).eval()
    assert block.mlp.fc1.out_features == 16
    if layerscale:
        assert torch.equal(block.ls1.gamma, torch.full((8,), 0.5))

    def formula(x):
        x1 = x + block.pos_conv(x)
        x2 = x1 + block.ls1(mixer(block.norm1(x1)))
        return x2 + block.ls2(block.mlp(block.norm2(x2)))

    x = torch.randn(1, 7, 9, 8)
    for got, want in zip(*_values_and_gradients(block, formula, x)):
        torch.testing.assert_close(got, want, msg="seed 0")
    before = x.clone()
    block(x)
    assert torch.equal(x, before), "the block changed its input"


def test_stem_downsample_head_shapes():
    stem, down = ConvStem(3, 8), ConvDownsample(8, 16)
    x = stem(torch.randn(2, 3, 37, 50))
    assert x.shape == (2, 10, 13, 8)  # ceil(37/4), ceil(50/4), channels-last
    assert down(x).shape == (2, 5, 7, 16)
    head = ProjectionHead(16, 5, hidden_dim=12).eval()
    y = torch.randn(2, 5, 7, 16)
    assert head(y).shape == (2, 5) and head(y, pre_logits=True).shape == (2, 12)
    expected = F.silu(head.norm(head.fc1(y).flatten(1, 2).transpose(1, 2))).mean(-1)
    torch.testing.assert_close(head(y, pre_logits=True), expected)
    head.reset(0)
    assert head(y).shape == (2, 12)


def test_projection_head_without_pooling():
    torch.manual_seed(0)
    head = ProjectionHead(16, 5, hidden_dim=12).eval()
    y = torch.randn(1, 5, 7, 16)
    pooled = head(y, pre_logits=True)
    head.reset(5, global_pool="")
    maps = head(y, pre_logits=True)
    assert maps.shape == (1, 12, 5, 7)
    torch.testing.assert_close(maps.mean((2, 3)), pooled, msg="seed 0")
    logits = head(y)
    torch.testing.assert_close(logits, torch.einsum("bchw,kc->bkhw", maps, head.fc.weight) + head.fc.bias[:, None, None],
                               msg="seed 0")
    with pytest.raises(ValueError, match="global_pool"):
        ProjectionHead(16, 5, global_pool="max")


def test_sequence_block_formula():
    torch.manual_seed(0)
    mixer = nn.Linear(8, 8)
    block = SequenceBlock(dim=8, mixer=mixer, mlp_ratio=2.0, layerscale=True, layerscale_init=0.5).eval()
    x = torch.randn(2, 7, 8)
    x1 = x + 0.5 * mixer(block.norm1(x))
    torch.testing.assert_close(block(x), x1 + 0.5 * block.mlp(block.norm2(x1)), msg="seed 0")
    assert block.mlp.fc1.out_features == 16


def test_patch_stem_tokens_and_position_embedding():
    torch.manual_seed(0)
    stem = PatchStem(3, 8, patch_size=4, img_size=16)
    assert stem.pos_embed.shape == (1, 1 + 16, 8)
    x = torch.randn(2, 3, 21, 13)  # 5 x 3 patches, remainder rows/columns dropped as by the conv
    tokens = stem(x)
    patches = stem.proj(x).flatten(2).transpose(1, 2)
    pos = resample_abs_pos_embed(stem.pos_embed, (5, 3), num_prefix_tokens=1)
    expected = torch.cat([stem.cls_token.expand(2, -1, -1), patches], 1) + pos
    torch.testing.assert_close(tokens, expected, msg="seed 0")
    bare = PatchStem(3, 8, patch_size=4, class_token=False, pos_embed=False)
    assert bare(x).shape == (2, 15, 8) and bare.cls_token is None and bare.pos_embed is None


def test_token_pool_head():
    torch.manual_seed(0)
    x = torch.randn(2, 1 + 6, 8)
    head = TokenPoolHead(8, 3, num_prefix_tokens=1, global_pool="token")
    torch.testing.assert_close(head(x), head.fc(x[:, 0]), msg="seed 0")
    head.reset(0, "avg")
    torch.testing.assert_close(head(x), x[:, 1:].mean(1), msg="seed 0")
    head.reset(3, "")
    assert head(x).shape == (2, 7, 3)
