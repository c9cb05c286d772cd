"""Official-layout checkpoints: conversion, strictness, timm loading, the converter tool."""
import argparse

import pytest
import timm
import torch

from ppma.deploy import convert_checkpoint
from ppma.models.family import create_from_checkpoint, family_of

checkpoint_filter_fn = family_of("ppma_tiny").checkpoint_filter_fn
checkpoint_model_kwargs = family_of("ppma_tiny").checkpoint_model_kwargs

# A micro PPMA in the official configuration language.
def micro(official_layout, **kw):
    return timm.create_model("ppma_tiny", **{**official_layout.OURS, **kw}).eval()


def test_official_layout_converts_and_loads_strictly(official_layout):
    official = official_layout.state_dict(**official_layout.CFG)
    model = micro(official_layout)
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
def test_mismatched_keys_raise_naming_them(edit, message, official_layout):
    official = official_layout.state_dict(**official_layout.CFG)
    if edit == "wrong":
        official["layers.0.blocks.0.retention.gate.weight"] = torch.zeros(1)
    elif edit == "missing":
        del official["layers.1.blocks.0.ffn.fc2.bias"]
    elif edit == "extra_block":
        official["layers.0.blocks.1.pos.conv.weight"] = torch.zeros(16, 1, 3, 3)
    else:
        official["layers.2.Relpos.angle"] = official["layers.2.Relpos.angle"] * 2
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        checkpoint_filter_fn({"model": official}, micro(official_layout))


@pytest.mark.parametrize("layout", ["model", "training"])
def test_timm_one_liner_loads_an_official_file(tmp_path, layout, official_layout):
    official = official_layout.state_dict(**official_layout.CFG)
    path = tmp_path / "best.pth"
    if layout == "model":
        torch.save({"model": official}, path)
    else:  # what the official training script writes: weights under 'models', plus its state
        torch.save({"models": official, "optimizer": {"state": {}, "param_groups": []}, "epoch": 299,
                    "args": argparse.Namespace(model="PPMAViT_T", lr=1e-3), "max_accuracy": 82.6}, path)
    model = timm.create_model("ppma_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **official_layout.OURS).eval()
    assert torch.equal(model.state_dict()["stages.0.blocks.0.mixer.q_proj.weight"],
                       official["layers.0.blocks.0.retention.q_proj.weight"])
    # features_only: head dropped, output norms fresh (as the official detection backbone loads it)
    feats = timm.create_model("ppma_tiny", pretrained=True, features_only=True,
                              pretrained_cfg_overlay=dict(file=str(path)), **official_layout.OURS).eval()
    assert torch.equal(feats.model.stem.conv1.weight, official["patch_embed.proj.0.weight"])
    assert torch.equal(feats.model.out_norms["2"].weight, torch.ones(64))
    x = torch.randn(1, 3, 64, 96)
    raw = model.forward_intermediates(x, intermediates_only=True)
    for i, (f, r) in enumerate(zip(feats(x), raw)):
        normed = torch.nn.functional.layer_norm(r.movedim(1, -1), (r.shape[1],)).movedim(-1, 1)
        torch.testing.assert_close(f, normed, msg=str(i))


def test_detector_checkpoint_with_outnorms_loads_into_features_model(official_layout):
    backbone = official_layout.state_dict(**official_layout.CFG, backbone=True)
    detector = {f"backbone.{k}": v for k, v in backbone.items()}
    checkpoint = {"state_dict": {**detector, "neck.lateral.weight": torch.zeros(1)}}
    feats = timm.create_model("ppma_tiny", features_only=True, **official_layout.OURS)
    feats.model.load_state_dict(checkpoint_filter_fn(checkpoint, feats.model), strict=True)
    assert torch.equal(feats.model.out_norms["3"].bias, backbone["outnorm3.bias"])


@pytest.mark.parametrize("layout", ["official", "official_backbone", "ours", "ours_features", "ours_no_classifier"])
def test_checkpoint_model_kwargs_build_the_model_the_keys_describe(layout, official_layout):
    if layout.startswith("official"):
        state = official_layout.state_dict(**official_layout.CFG, backbone=layout == "official_backbone")
    else:
        kwargs = {"ours": {}, "ours_features": dict(with_head=False, output_norms=(1, 3)),
                  "ours_no_classifier": dict(num_classes=0)}[layout]
        state = micro(official_layout, **kwargs).state_dict()
    expected = {"official": dict(num_classes=7), "official_backbone": dict(output_norms=[0, 1, 2, 3], with_head=False),
                "ours": dict(num_classes=7), "ours_features": dict(output_norms=[1, 3], with_head=False),
                "ours_no_classifier": dict(num_classes=0)}[layout]
    assert checkpoint_model_kwargs({"model": state}) == expected
    cfg = {k: v for k, v in official_layout.OURS.items() if k != "num_classes"}
    model = create_from_checkpoint("ppma_tiny", {"model": state}, **cfg)
    assert (model.head is None) == (layout in ("official_backbone", "ours_features"))
    assert sorted(model.out_norms) == [str(i) for i in expected.get("output_norms", [])]
    x = torch.randn(1, 3, 35, 47)
    assert all(torch.isfinite(f).all() for f in model.eval().forward_intermediates(x, intermediates_only=True))


def test_create_from_checkpoint_names_what_does_not_fit(official_layout):
    state = official_layout.state_dict(**official_layout.CFG)
    state["layers.1.blocks.0.pos.conv.weight"] = torch.zeros(1, 1, 3, 3)
    cfg = {k: v for k, v in official_layout.OURS.items() if k != "num_classes"}
    with pytest.raises(ValueError, match=r"size mismatch for stages\.1\.blocks\.0\.pos_conv\.weight"):
        create_from_checkpoint("ppma_tiny", state, **cfg)


def test_convert_tool_writes_loadable_safetensors(tmp_path, capsys, official_layout):
    cfg = dict(official_layout.CFG, depths=(2, 2, 8, 2), embed_dims=(64, 128, 256, 512), num_heads=(4, 4, 8, 16),
               mlp_ratios=(3, 3, 3, 3), layerscale=(False,) * 4, num_classes=1000)
    official = official_layout.state_dict(**cfg)
    src, dst = tmp_path / "best.pth", tmp_path / "ppma_tiny.safetensors"
    torch.save({"model": official}, src)
    assert convert_checkpoint.main([str(src), str(dst), "--model", "ppma_tiny"]) == 0
    assert "14,335,272 parameters" in capsys.readouterr().out
    model = timm.create_model("ppma_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(dst)))
    assert torch.equal(model.head.fc.weight, official["head.weight"])
    del official["layers.3.blocks.1.ffn.fc1.weight"]
    torch.save({"model": official}, src)
    assert convert_checkpoint.main([str(src), str(dst), "--model", "ppma_tiny"]) == 1
    assert "stages.3.blocks.1.mlp.fc1.weight" in capsys.readouterr().err
    for args, message in ((["--model", "resnet18"], "not a model of this package"),
                          (["--model", "ppma_nope"], "unknown model 'ppma_nope'"),
                          ([], "one of the arguments --model --config is required"),
                          (["--model", "ppma_tiny", "--config", "x.py"], "not allowed with argument")):
        with pytest.raises(SystemExit):
            convert_checkpoint.main([str(src), str(dst), *args])
        assert message in capsys.readouterr().err


def test_convert_tool_takes_any_preset(tmp_path, capsys):
    source = timm.create_model("test_ppma", num_classes=5)
    torch.save({"model": source.state_dict()}, tmp_path / "w.pth")
    assert convert_checkpoint.main([str(tmp_path / "w.pth"), str(tmp_path / "w.safetensors"), "--model", "test_ppma"]) == 0
    from safetensors.torch import load_file

    written = load_file(str(tmp_path / "w.safetensors"))
    assert written.keys() == source.state_dict().keys()
    for key, value in source.state_dict().items():
        assert torch.equal(written[key], value), f"seed {torch.initial_seed()}: {key}"
