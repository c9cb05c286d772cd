"""Official-layout checkpoints: conversion, strictness, timm loading, the converter tool."""
import argparse
import importlib.util
from pathlib import Path

import pytest
import timm
import torch

import ppma  # noqa: F401
from ppma.models.ppma import checkpoint_filter_fn

# A micro PPMA in the official configuration language.
CFG = dict(embed_dims=(16, 32, 64, 128), depths=(1, 2, 1, 1), num_heads=(1, 2, 4, 8), mlp_ratios=(3, 4, 3, 3),
           layerscale=(False, False, True, True), num_classes=7)
OURS = dict(CFG, drop_path_rate=0.0)


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


def micro(**kw):
    return timm.create_model("ppma_tiny", **OURS, **kw).eval()


def test_official_layout_converts_and_loads_strictly():
    official = official_state_dict(**CFG)
    model = micro()
    converted = checkpoint_filter_fn({"model": official}, model)
    model.load_state_dict(converted, strict=True)
    own = model.state_dict()
    pairs = {
        "stem.conv1.weight": "patch_embed.proj.0.weight",
        "stem.norm4.running_var": "patch_embed.proj.10.running_var",
        "stages.1.downsample.conv.weight": "layers.0.downsample.reduction.weight",
        "stages.3.downsample.norm.num_batches_tracked": "layers.2.downsample.norm.num_batches_tracked",
        "stages.1.blocks.1.mixer.decay.proj.weight": "layers.1.blocks.1.retention.path_embed.dt_linear.weight",
        "stages.1.blocks.1.mixer.decay.A_log": "layers.1.blocks.1.retention.path_embed.A_log",
        "stages.0.blocks.0.mixer.lepe.weight": "layers.0.blocks.0.retention.lepe.conv.weight",
        "stages.2.blocks.0.mlp.dwconv.bias": "layers.2.blocks.0.ffn.dwconv.conv.bias",
        "stages.2.blocks.0.pos_conv.weight": "layers.2.blocks.0.pos.conv.weight",
        "stages.3.blocks.0.norm1.weight": "layers.3.blocks.0.retention_layer_norm.weight",
        "head.fc1.weight": "proj.weight",
        "head.norm.running_mean": "norm.running_mean",
        "head.fc.bias": "head.bias",
    }
    for ours, theirs in pairs.items():
        assert torch.equal(own[ours], official[theirs]), ours
    assert torch.equal(own["stages.2.blocks.0.ls1.gamma"], official["layers.2.blocks.0.gamma_1"].flatten())
    non_persistent = sum(k.endswith("Relpos.angle") for k in official)
    assert len(own) == len(official) - non_persistent


@pytest.mark.parametrize("edit,message", [
    ("wrong", "layers.0.blocks.0.retention.gate.weight"),
    ("missing", "stages.1.blocks.0.mlp.fc2.bias"),
    ("extra_block", "layers.0.blocks.1.pos.conv.weight"),
    ("angle", "layers.2.Relpos.angle"),
])
def test_mismatched_keys_raise_naming_them(edit, message):
    official = official_state_dict(**CFG)
    if edit == "wrong":
        official["layers.0.blocks.0.retention.gate.weight"] = torch.zeros(1)
    elif edit == "missing":
        del official["layers.1.blocks.0.ffn.fc2.bias"]
    elif edit == "extra_block":
        official["layers.0.blocks.1.pos.conv.weight"] = torch.zeros(16, 1, 3, 3)
    else:
        official["layers.2.Relpos.angle"] = official["layers.2.Relpos.angle"] * 2
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        checkpoint_filter_fn({"model": official}, micro())


@pytest.mark.parametrize("layout", ["model", "training"])
def test_timm_one_liner_loads_an_official_file(tmp_path, layout):
    official = official_state_dict(**CFG)
    path = tmp_path / "best.pth"
    if layout == "model":
        torch.save({"model": official}, path)
    else:  # what the official training script writes: weights under 'models', plus its state
        torch.save({"models": official, "optimizer": {"state": {}, "param_groups": []}, "epoch": 299,
                    "args": argparse.Namespace(model="PPMAViT_T", lr=1e-3), "max_accuracy": 82.6}, path)
    model = timm.create_model("ppma_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **OURS).eval()
    assert torch.equal(model.state_dict()["stages.0.blocks.0.mixer.q_proj.weight"],
                       official["layers.0.blocks.0.retention.q_proj.weight"])
    # features_only: head dropped, output norms fresh (as the official detection backbone loads it)
    feats = timm.create_model("ppma_tiny", pretrained=True, features_only=True,
                              pretrained_cfg_overlay=dict(file=str(path)), **OURS).eval()
    assert torch.equal(feats.model.stem.conv1.weight, official["patch_embed.proj.0.weight"])
    assert torch.equal(feats.model.out_norms["2"].weight, torch.ones(64))
    x = torch.randn(1, 3, 64, 96)
    raw = model.forward_intermediates(x, intermediates_only=True)
    for i, (f, r) in enumerate(zip(feats(x), raw)):
        normed = torch.nn.functional.layer_norm(r.movedim(1, -1), (r.shape[1],)).movedim(-1, 1)
        torch.testing.assert_close(f, normed, msg=str(i))


def test_detector_checkpoint_with_outnorms_loads_into_features_model():
    backbone = official_state_dict(**CFG, backbone=True)
    detector = {f"backbone.{k}": v for k, v in backbone.items()}
    checkpoint = {"state_dict": {**detector, "neck.lateral.weight": torch.zeros(1)}}
    feats = timm.create_model("ppma_tiny", features_only=True, **OURS)
    feats.model.load_state_dict(checkpoint_filter_fn(checkpoint, feats.model), strict=True)
    assert torch.equal(feats.model.out_norms["3"].bias, backbone["outnorm3.bias"])


def load_tool():
    path = Path(__file__).resolve().parents[2] / "tools" / "convert_checkpoint.py"
    spec = importlib.util.spec_from_file_location("convert_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_convert_tool_writes_loadable_safetensors(tmp_path, capsys):
    tool = load_tool()
    cfg = dict(CFG, depths=(2, 2, 8, 2), embed_dims=(64, 128, 256, 512), num_heads=(4, 4, 8, 16),
               mlp_ratios=(3, 3, 3, 3), layerscale=(False,) * 4, num_classes=1000)
    official = official_state_dict(**cfg)
    src, dst = tmp_path / "best.pth", tmp_path / "ppma_tiny.safetensors"
    torch.save({"model": official}, src)
    assert tool.main([str(src), str(dst), "--model", "ppma_tiny"]) == 0
    assert "14,335,272 parameters" in capsys.readouterr().out
    model = timm.create_model("ppma_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(dst)))
    assert torch.equal(model.head.fc.weight, official["head.weight"])
    del official["layers.3.blocks.1.ffn.fc1.weight"]
    torch.save({"model": official}, src)
    assert tool.main([str(src), str(dst), "--model", "ppma_tiny"]) == 1
    assert "stages.3.blocks.1.mlp.fc1.weight" in capsys.readouterr().err
