"""PPMA's official checkpoint layouts, written from the release's module names (random values):
the classification/backbone state dict, our backbone keys under the official names, and the
official Mask R-CNN / UPerNet heads. The model and OpenMMLab tests get them as the
``official_layout`` fixture, which their conftest.py files load from this file."""
from types import SimpleNamespace

import pytest
import torch

# A micro PPMA config whose official-layout checkpoint the conversion tests write.
CFG = dict(embed_dims=(16, 32, 64, 128), depths=(1, 2, 1, 1), num_heads=(1, 2, 4, 8), mlp_ratios=(3, 4, 3, 3),
           layerscale=(False, False, True, True), num_classes=7)


def official_state_dict(embed_dims, depths, num_heads, mlp_ratios, layerscale, num_classes, backbone=False):
    """Names and shapes of the official PPMAViT state dict (github.com/zhongchenzhao/PPMA), random values.

    ``backbone=True``: the official detection/segmentation backbone (``outnorm{i}``, no head).
    """
    shapes = {}

    def conv(name, cout, cin, k):
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (cout, cin, k, k), (cout,)

    def bn(name, c):
        for leaf in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{name}.{leaf}"] = (c,)
        shapes[f"{name}.num_batches_tracked"] = ()

    def linear(name, cout, cin, bias=True):
        shapes[f"{name}.weight"] = (cout, cin)
        if bias:
            shapes[f"{name}.bias"] = (cout,)

    d0 = embed_dims[0]
    for idx, (cout, cin) in zip((0, 3, 6, 9), ((d0 // 2, 3), (d0 // 2, d0 // 2), (d0, d0 // 2), (d0, d0))):
        conv(f"patch_embed.proj.{idx}", cout, cin, 3)
        bn(f"patch_embed.proj.{idx + 1}", cout)
    for i, (d, depth, heads, ratio) in enumerate(zip(embed_dims, depths, num_heads, mlp_ratios)):
        shapes[f"layers.{i}.Relpos.angle"] = (d // heads,)
        for j in range(depth):
            b, hidden = f"layers.{i}.blocks.{j}", int(ratio * d)
            if layerscale[i]:
                shapes[f"{b}.gamma_1"] = shapes[f"{b}.gamma_2"] = (1, 1, 1, d)
            for ln in ("retention_layer_norm", "final_layer_norm"):
                shapes[f"{b}.{ln}.weight"] = shapes[f"{b}.{ln}.bias"] = (d,)
            for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
                linear(f"{b}.retention.{p}", d, d)
            shapes[f"{b}.retention.lepe.conv.weight"], shapes[f"{b}.retention.lepe.conv.bias"] = (d, 1, 5, 5), (d,)
            shapes[f"{b}.retention.path_embed.dt_bias"] = shapes[f"{b}.retention.path_embed.A_log"] = (heads,)
            linear(f"{b}.retention.path_embed.dt_linear", 2, d // heads, bias=False)
            linear(f"{b}.ffn.fc1", hidden, d)
            linear(f"{b}.ffn.fc2", d, hidden)
            shapes[f"{b}.ffn.dwconv.conv.weight"], shapes[f"{b}.ffn.dwconv.conv.bias"] = (hidden, 1, 3, 3), (hidden,)
            shapes[f"{b}.pos.conv.weight"], shapes[f"{b}.pos.conv.bias"] = (d, 1, 3, 3), (d,)
        if i + 1 < len(embed_dims):
            conv(f"layers.{i}.downsample.reduction", embed_dims[i + 1], d, 3)
            bn(f"layers.{i}.downsample.norm", embed_dims[i + 1])
        if backbone:
            shapes[f"outnorm{i}.weight"] = shapes[f"outnorm{i}.bias"] = (d,)
    if not backbone:
        linear("proj", 1024, embed_dims[-1])
        bn("norm", 1024)
        linear("head", num_classes, 1024)
    state = {}
    for name, shape in shapes.items():
        if name.endswith("num_batches_tracked"):
            state[name] = torch.tensor(3)
        elif name.endswith("Relpos.angle"):
            state[name] = (1.0 / 10000 ** torch.linspace(0, 1, shape[0] // 2)).repeat_interleave(2)
        elif name.endswith(("running_var", "A_log")):
            state[name] = torch.rand(shape) + 0.5
        else:
            state[name] = torch.randn(shape)
    return state


# Our backbone key -> the official one (the inverse of the conversion, written from the official
# module names: patch_embed.proj = Sequential(conv, BN, GELU, ...), layers.i.blocks.j.retention...).
_OFFICIAL_STEM = {"conv1": 0, "norm1": 1, "conv2": 3, "norm2": 4, "conv3": 6, "norm3": 7, "conv4": 9, "norm4": 10}
_OFFICIAL_BLOCK = [
    ("norm1.", "retention_layer_norm."), ("norm2.", "final_layer_norm."), ("pos_conv.", "pos.conv."),
    ("mixer.lepe.", "retention.lepe.conv."), ("mixer.decay.proj.", "retention.path_embed.dt_linear."),
    ("mixer.decay.", "retention.path_embed."), ("mixer.", "retention."), ("mlp.dwconv.", "ffn.dwconv.conv."),
    ("mlp.", "ffn."), ("ls1.gamma", "gamma_1"), ("ls2.gamma", "gamma_2"),
]


def official_backbone_key(key: str) -> str:
    """The official PPMA name of one of our backbone keys (``stem.conv1.weight`` -> ``patch_embed.proj.0.weight``)."""
    part = key.split(".")
    if part[0] == "stem":
        return f"patch_embed.proj.{_OFFICIAL_STEM[part[1]]}.{part[2]}"
    if part[0] == "out_norms":
        return f"outnorm{part[1]}.{part[2]}"
    if part[2] == "downsample":
        return f"layers.{int(part[1]) - 1}.downsample.{'reduction' if part[3] == 'conv' else 'norm'}.{part[4]}"
    rest = ".".join(part[4:])
    new = next(theirs + rest[len(ours):] for ours, theirs in _OFFICIAL_BLOCK if rest.startswith(ours))
    return f"layers.{part[1]}.blocks.{part[3]}.{new}"


def to_official_backbone(ours: dict, manifest: dict) -> dict:
    """Our backbone state dict under the official names, checked against the official ``manifest``.

    Every manifest key gets a tensor (the RoPE ``Relpos.angle`` buffers, which we recompute,
    keep the manifest's) of the manifest's shape; layer scales become ``(1, 1, 1, C)``.
    """
    official = {official_backbone_key(k): v for k, v in ours.items()}
    official = {k: v.reshape(manifest[k].shape) if k.endswith(("gamma_1", "gamma_2")) else v for k, v in official.items()}
    official.update({k: v for k, v in manifest.items() if k.endswith("Relpos.angle")})
    assert official.keys() == manifest.keys(), sorted(official.keys() ^ manifest.keys())
    for k, v in manifest.items():
        assert official[k].shape == v.shape, (k, official[k].shape, v.shape)
    return official


def _conv_module(shapes, name, cout, cin, k, norm):
    """mmcv ConvModule: ``conv`` (no bias with a norm) and ``bn``."""
    shapes[f"{name}.conv.weight"] = (cout, cin, k, k)
    if norm:
        for leaf in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{name}.bn.{leaf}"] = (cout,)
        shapes[f"{name}.bn.num_batches_tracked"] = ()
    else:
        shapes[f"{name}.conv.bias"] = (cout,)


def official_mask_rcnn_heads(in_channels, width, fc_width, num_classes, mask_convs):
    """Names and shapes of the neck and heads of an official Mask R-CNN checkpoint (mmdet 2.28:
    FPN, RPNHead, StandardRoIHead with Shared2FCBBoxHead (7x7 RoIs) and FCNMaskHead)."""
    shapes = {}
    for i, c in enumerate(in_channels):
        _conv_module(shapes, f"neck.lateral_convs.{i}", width, c, 1, norm=False)
        _conv_module(shapes, f"neck.fpn_convs.{i}", width, width, 3, norm=False)
    for name, cout, k in (("rpn_conv", width, 3), ("rpn_cls", 3, 1), ("rpn_reg", 12, 1)):  # 3 anchors
        shapes[f"rpn_head.{name}.weight"], shapes[f"rpn_head.{name}.bias"] = (cout, width, k, k), (cout,)
    for name, cout, cin in (("shared_fcs.0", fc_width, width * 49), ("shared_fcs.1", fc_width, fc_width),
                            ("fc_cls", num_classes + 1, fc_width), ("fc_reg", 4 * num_classes, fc_width)):
        shapes[f"roi_head.bbox_head.{name}.weight"], shapes[f"roi_head.bbox_head.{name}.bias"] = (cout, cin), (cout,)
    for j in range(mask_convs):
        _conv_module(shapes, f"roi_head.mask_head.convs.{j}", width, width, 3, norm=False)
    shapes["roi_head.mask_head.upsample.weight"] = (width, width, 2, 2)  # ConvTranspose2d: (in, out, k, k)
    shapes["roi_head.mask_head.upsample.bias"] = (width,)
    shapes["roi_head.mask_head.conv_logits.weight"] = (num_classes, width, 1, 1)
    shapes["roi_head.mask_head.conv_logits.bias"] = (num_classes,)
    return shapes


def official_upernet_heads(in_channels, channels, aux_in, aux_channels, num_classes):
    """Names and shapes of the heads of an official UPerNet checkpoint (mmseg 0.30: UPerHead with
    pool scales (1, 2, 3, 6), FCNHead auxiliary head with one conv, BN norms)."""
    shapes = {}
    for i in range(4):
        _conv_module(shapes, f"decode_head.psp_modules.{i}.1", channels, in_channels[-1], 1, norm=True)
    _conv_module(shapes, "decode_head.bottleneck", channels, in_channels[-1] + 4 * channels, 3, norm=True)
    for i, c in enumerate(in_channels[:-1]):
        _conv_module(shapes, f"decode_head.lateral_convs.{i}", channels, c, 1, norm=True)
        _conv_module(shapes, f"decode_head.fpn_convs.{i}", channels, channels, 3, norm=True)
    _conv_module(shapes, "decode_head.fpn_bottleneck", channels, len(in_channels) * channels, 3, norm=True)
    _conv_module(shapes, "auxiliary_head.convs.0", aux_channels, aux_in, 3, norm=True)
    for head, c in (("decode_head", channels), ("auxiliary_head", aux_channels)):
        shapes[f"{head}.conv_seg.weight"], shapes[f"{head}.conv_seg.bias"] = (num_classes, c, 1, 1), (num_classes,)
    return shapes


@pytest.fixture
def official_layout():
    """``state_dict(**cfg)`` writes random weights under the official PPMA module names; ``CFG``
    is a micro config for it and ``OURS`` the same config as ``timm.create_model`` kwargs.
    ``to_official_backbone`` renames our backbone keys to the official ones, and
    ``mask_rcnn_heads`` / ``upernet_heads`` give the official dense-prediction heads' names and shapes."""
    return SimpleNamespace(CFG=CFG, OURS=dict(CFG, drop_path_rate=0.0), state_dict=official_state_dict,
                           to_official_backbone=to_official_backbone, mask_rcnn_heads=official_mask_rcnn_heads,
                           upernet_heads=official_upernet_heads)

