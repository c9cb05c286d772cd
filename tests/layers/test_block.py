"""Block, FFN, depthwise conv, stem, downsampler and head against their formulas."""
import torch
import torch.nn.functional as F
from torch import nn

from ppma.layers import ConvDownsample, ConvFFN, ConvStem, GridDepthwiseConv, MixerBlock, ProjectionHead


def test_depthwise_conv_is_per_frame_and_channels_last():
    conv = GridDepthwiseConv(6, 3)
    x = torch.randn(2, 3, 5, 7, 6)
    y = conv(x)
    for t in range(3):
        frame = F.conv2d(x[:, t].permute(0, 3, 1, 2), conv.weight, conv.bias, padding=1, groups=6)
        torch.testing.assert_close(y[:, t], frame.permute(0, 2, 3, 1))


def test_ffn_formula():
    ffn = ConvFFN(4, 10)
    x = torch.randn(1, 3, 5, 4)
    h = F.gelu(ffn.fc1(x))
    torch.testing.assert_close(ffn(x), ffn.fc2(h + ffn.dwconv(h)))


def test_block_formula_with_layer_scale():
    mixer = nn.Linear(8, 8)
    block = MixerBlock(8, mixer, mlp_ratio=2.0, layerscale=True, layerscale_init=0.5).eval()
    assert block.mlp.fc1.out_features == 16 and torch.equal(block.ls1.gamma, torch.full((8,), 0.5))
    x = torch.randn(2, 3, 4, 8)
    x1 = x + block.pos_conv(x)
    x2 = x1 + 0.5 * mixer(block.norm1(x1))
    torch.testing.assert_close(block(x), x2 + 0.5 * block.mlp(block.norm2(x2)))


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
