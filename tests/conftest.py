"""Fixtures shared by the test folders."""
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


@pytest.fixture
def official_layout():
    """``state_dict(**cfg)`` writes random weights under the official PPMA module names; ``CFG``
    is a micro config for it and ``OURS`` the same config as ``timm.create_model`` kwargs."""
    return SimpleNamespace(CFG=CFG, OURS=dict(CFG, drop_path_rate=0.0), state_dict=official_state_dict)
