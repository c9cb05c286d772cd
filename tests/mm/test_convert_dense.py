"""Whole official dense-prediction checkpoints (mmdet 2.28 Mask R-CNN, mmseg 0.30 UPerNet):
converted by tools/convert_checkpoint.py --config, they load strictly into the models of our
configs and give the same outputs; anything that does not fit is named."""
import json
import sys

import pytest
import torch

pytest.importorskip("mmdet", reason="mmdet is not installed (pip install 'ppma[mm]'); CI installs it")
pytest.importorskip("mmseg", reason="mmseg is not installed (pip install 'ppma[mm]'); CI installs it")
from mmengine.runner import load_checkpoint  # noqa: E402

from ppma.deploy import convert_checkpoint  # noqa: E402
from ppma.mm.analysis import build_model, dummy_batch  # noqa: E402
from ppma.mm.runtime import load_config, replace_sync_bn  # noqa: E402


def config_of(mm, task):
    path = mm.quick_det if task == "det" else mm.quick_seg
    cfg = load_config(str(path))
    replace_sync_bn(cfg.model)
    return path, cfg


def randomized(model):
    """Perturb every float tensor so that a swapped or skipped key changes the outputs."""
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if value.is_floating_point():
                value.add_(torch.rand_like(value) * 0.05 if key.endswith("running_var") else torch.randn_like(value) * 0.02)
    return model.eval()


def official_checkpoint(model, cfg, official_layout):
    """``model``'s weights as the release writes them: official backbone names, mmdet 2 / mmseg 0 heads."""
    bb = cfg.model.backbone
    manifest = official_layout.state_dict(bb.embed_dims, bb.depths, bb.num_heads, (3, 3, 3, 3), (False,) * 4,
                                          0, backbone=True)
    ours = model.state_dict()
    backbone = {k.removeprefix("backbone.model."): v for k, v in ours.items() if k.startswith("backbone.")}
    official = {f"backbone.{k}": v for k, v in official_layout.to_official_backbone(backbone, manifest).items()}
    if cfg.default_scope == "mmdet":
        roi = cfg.model.roi_head
        heads = official_layout.mask_rcnn_heads(cfg.model.neck.in_channels, cfg.model.neck.out_channels,
                                                roi.bbox_head.fc_out_channels, roi.bbox_head.num_classes,
                                                roi.mask_head.num_convs)
    else:
        heads = official_layout.upernet_heads(cfg.model.decode_head.in_channels, cfg.model.decode_head.channels,
                                              cfg.model.auxiliary_head.in_channels,
                                              cfg.model.auxiliary_head.channels, cfg.model.decode_head.num_classes)
    for key, shape in heads.items():  # the mmdet 2 / mmseg 0 names hold our heads' tensors
        assert key in ours and tuple(ours[key].shape) == shape, f"seed {torch.initial_seed()}: {key} {shape}"
        official[key] = ours[key]
    assert len(ours) == len(backbone) + len(heads), "the manifest leaves out a key of the model"
    return {"state_dict": official, "meta": {"CLASSES": ("circle", "square", "triangle"), "mmdet_version": "2.28.2"}}


def outputs(model, scope):
    torch.manual_seed(torch.initial_seed())
    inputs, samples = dummy_batch(scope, 1, 96, 128)
    with torch.no_grad():
        out = model(inputs, samples, mode="tensor")
    return [t for t in torch.utils._pytree.tree_leaves(out) if torch.is_tensor(t)]


@pytest.mark.parametrize("task", ["det", "seg"])
def test_whole_official_checkpoint_converts_and_gives_the_same_outputs(mm, task, tmp_path, official_layout):
    config, cfg = config_of(mm, task)
    released = randomized(build_model(cfg))
    torch.save(official_checkpoint(released, cfg, official_layout), tmp_path / "official.pth")
    assert convert_checkpoint.main([str(tmp_path / "official.pth"), str(tmp_path / "ours.pth"), "--config", str(config)]) == 0

    fresh = build_model(cfg)
    load_checkpoint(fresh, str(tmp_path / "ours.pth"), map_location="cpu", strict=True)
    for key, value in released.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), f"seed {torch.initial_seed()}: {key}"
    got, want = outputs(fresh, cfg.default_scope), outputs(released, cfg.default_scope)
    assert got and len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=0, atol=0, msg=f"seed {torch.initial_seed()}: output {i}")
    saved = torch.load(tmp_path / "ours.pth", weights_only=True)
    assert saved["meta"]["dataset_meta"] == {"classes": ("circle", "square", "triangle")}


@pytest.mark.parametrize("edit, message", [
    ("head_key", "roi_head.bbox_head.fc_gone.weight"),
    ("missing_head", "neck.fpn_convs.3.conv.bias"),
    ("missing_outnorm", "backbone.model.out_norms.2.weight"),
    ("backbone_key", "layers.1.blocks.0.retention.gate.weight"),
    ("shape", "rpn_head.rpn_cls.weight"),
])
def test_keys_that_do_not_fit_are_named(mm, edit, message, tmp_path, capsys, official_layout):
    config, cfg = config_of(mm, "det")
    checkpoint = official_checkpoint(build_model(cfg), cfg, official_layout)
    state = checkpoint["state_dict"]
    if edit == "head_key":
        state["roi_head.bbox_head.fc_gone.weight"] = torch.zeros(2)
    elif edit == "missing_head":
        del state["neck.fpn_convs.3.conv.bias"]
    elif edit == "missing_outnorm":
        del state["backbone.outnorm2.weight"], state["backbone.outnorm2.bias"]
    elif edit == "backbone_key":
        state["backbone.layers.1.blocks.0.retention.gate.weight"] = torch.zeros(2)
    else:
        state["rpn_head.rpn_cls.weight"] = torch.zeros(6, 64, 1, 1)
    torch.save(checkpoint, tmp_path / "official.pth")
    out = tmp_path / "ours.pth"
    assert convert_checkpoint.main([str(tmp_path / "official.pth"), str(out), "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert message in err, f"seed {torch.initial_seed()}: {err}"
    assert not out.exists()


def test_tools_test_evaluates_the_converted_detector(mm, shapes_root, tmp_path, official_layout):
    config, cfg = config_of(mm, "det")
    torch.save(official_checkpoint(randomized(build_model(cfg)), cfg, official_layout), tmp_path / "official.pth")
    assert convert_checkpoint.main([str(tmp_path / "official.pth"), str(tmp_path / "ours.pth"), "--config", str(config)]) == 0
    result = mm.run([sys.executable, mm.tools / "test.py", config, tmp_path / "ours.pth",
                     "--work-dir", tmp_path / "test"], shapes_root)
    assert result.returncode == 0, result.stdout[-6000:]
    assert "do not match exactly" not in result.stdout, result.stdout[-6000:]  # mmengine's key-mismatch warning
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0.0 <= metrics["coco/bbox_mAP"] <= 100.0, metrics
