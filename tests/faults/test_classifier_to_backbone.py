"""A classifier checkpoint deploys as a ``features_only`` backbone, strictly, its head keys named
as dropped: through ``create_from_checkpoint(..., features_only=True)``, timm's one-line loader
and ``tools/export.py --features --checkpoint``, for every family's test preset, and for an
official-layout PPMA checkpoint."""
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from official_ppma import CFG, official_state_dict

from ppma.models.checkpoint import DENSE_ONLY, read_checkpoint
from ppma.models.family import create_from_checkpoint, families

ROOT = Path(__file__).resolve().parents[2]
PRESETS = [family.test_preset for family in families()]


def classifier_checkpoint(name: str, path: Path, **kwargs) -> dict:
    """A trained-looking classifier of preset ``name`` (every tensor moved off its initialisation)
    saved to ``path`` as training scripts do (``{'model': state_dict}``); returns its state dict."""
    classifier = timm.create_model(name, **kwargs)
    with torch.no_grad():
        for tensor in classifier.state_dict().values():
            if tensor.is_floating_point():
                tensor.mul_(1 + 0.1 * torch.rand_like(tensor)).add_(0.01 * torch.randn_like(tensor))
    state = classifier.state_dict()
    torch.save({"model": state, "epoch": 3}, path)
    return state


#: backbone tensors a features model resamples from the classifier's (Vim's dense adapter drops
#: the class token's position)
RESAMPLED = {"stem.pos_embed"}


def assert_backbone_of(features: torch.nn.Module, classifier_state: dict) -> None:
    """Every tensor of ``features`` (timm's wrapper) is the classifier's, but the dense-only ones."""
    own = features.model.state_dict()
    taken = {k: v for k, v in own.items() if not k.startswith(DENSE_ONLY) and k not in RESAMPLED}
    assert len(taken) > len(own) // 2, "the backbone has no weights"
    for key, value in taken.items():
        assert torch.equal(value, classifier_state[key]), key


def dropped_head_keys(records) -> str:
    found = [r.getMessage() for r in records if "dropped the checkpoint's head keys" in r.getMessage()]
    assert len(found) == 1, [r.getMessage() for r in records]
    return found[0]


@pytest.mark.parametrize("name", PRESETS)
def test_create_from_checkpoint_features_only(name, tmp_path, caplog):
    state = classifier_checkpoint(name, tmp_path / "c.pth", num_classes=3)
    with caplog.at_level(logging.INFO, logger="ppma.models.checkpoint"):
        features = create_from_checkpoint(name, read_checkpoint(tmp_path / "c.pth"), features_only=True).eval()
    assert_backbone_of(features, state)
    message = dropped_head_keys(caplog.records)
    head = [k for k in state if k.startswith("head.")]
    assert head and all(k in message for k in head), message
    maps = features(torch.randn(1, 3, 64, 96))
    assert len(maps) == 4 and all(torch.isfinite(m).all() for m in maps)


@pytest.mark.parametrize("name", PRESETS)
def test_timm_one_line_loader_features_only(name, tmp_path, caplog):
    state = classifier_checkpoint(name, tmp_path / "c.pth")
    with caplog.at_level(logging.INFO, logger="ppma.models.checkpoint"):
        features = timm.create_model(name, features_only=True, pretrained=True,
                                     pretrained_cfg_overlay=dict(file=str(tmp_path / "c.pth")))
    assert_backbone_of(features, state)
    assert "head." in dropped_head_keys(caplog.records)
    assert "state_dict" not in features.pretrained_cfg and "state_dict" not in features.model.pretrained_cfg
    assert features.pretrained_cfg["file"] == str(tmp_path / "c.pth")


def test_a_checkpoint_of_another_preset_still_fails_naming_keys(tmp_path):
    classifier_checkpoint("test_vmamba", tmp_path / "c.pth")
    with pytest.raises(ValueError, match="stem"):
        create_from_checkpoint("test_ppma", read_checkpoint(tmp_path / "c.pth"), features_only=True)


def test_official_layout_classifier_into_features(tmp_path, caplog):
    official = official_state_dict(**CFG)
    ours = {k: v for k, v in CFG.items() if k != "num_classes"}
    classifier = create_from_checkpoint("ppma_tiny", {"model": official}, **ours, drop_path_rate=0.0)
    with caplog.at_level(logging.INFO, logger="ppma.models.checkpoint"):
        features = create_from_checkpoint("ppma_tiny", {"model": official}, **ours, features_only=True)
    assert_backbone_of(features, classifier.state_dict())
    message = dropped_head_keys(caplog.records)
    assert all(k in message for k in ("proj.weight", "norm.running_mean", "head.weight")), message
    path = tmp_path / "best.pth"
    torch.save({"model": official}, path)
    one_line = timm.create_model("ppma_tiny", **ours, features_only=True, pretrained=True,
                                 pretrained_cfg_overlay=dict(file=str(path)))
    assert_backbone_of(one_line, classifier.state_dict())


@pytest.mark.slow
def test_export_tool_features_from_a_classifier_checkpoint(tmp_path):
    state = classifier_checkpoint("test_ppma", tmp_path / "c.pth")
    out = tmp_path / "test_ppma_features.pt2"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "export.py"), "--model", "test_ppma", "--features",
                           "--checkpoint", str(tmp_path / "c.pth"), "--format", "pt2", "--output", str(out),
                           "--img-size", "64", "64"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    program = torch.export.load(out)
    features = timm.create_model("test_ppma", features_only=True).eval()
    features.model.load_state_dict({**features.model.state_dict(),
                                     **{k: v for k, v in state.items() if not k.startswith("head.")}})
    x = torch.randn(2, 3, 64, 64)
    for exported, eager in zip(program.module()(x), features(x)):
        torch.testing.assert_close(exported, eager, rtol=1e-4, atol=1e-5)
