"""tools/validate.py (:mod:`ppma.bench.validate`): top-k arithmetic, a run on a generated ImageFolder (fp32 and autocast), and
one-line errors for bad inputs."""
import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from torch import nn

import ppma  # noqa: F401  (registers the presets)

Image = pytest.importorskip("PIL.Image", reason="pillow is not installed")


@pytest.fixture(scope="module")
def validate():
    from ppma.bench import validate

    return validate


def image_folder(root: Path, classes: int, per_class: int = 2, size: int = 40) -> Path:
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size + 3, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.png")
    return root


def checkpoint(path: Path, name="test_ppma", **kwargs) -> Path:
    torch.save({"state_dict": timm.create_model(name, **kwargs).state_dict()}, path)
    return path


def run_error(validate, capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        validate.main(list(map(str, argv)))
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: " in message
    return message


class FixedLogits(nn.Module):
    """A "model" whose logits are its input, for known top-k answers."""

    num_classes = 6

    def forward(self, x):
        return x


def test_top_k_counts(validate):
    logits = torch.tensor([[0.0, 5, 4, 3, 2, 1],    # label 1: top-1
                           [5.0, 4, 3, 2, 1, 0],    # label 4: top-5 only
                           [5.0, 4, 3, 2, 1, 0]])   # label 5: neither
    loader = [(logits[:2], torch.tensor([1, 4])), (logits[2:], torch.tensor([5]))]
    metrics = validate.evaluate(FixedLogits(), loader, torch.device("cpu"), amp=False)
    assert metrics["top1"] == pytest.approx(100 / 3) and metrics["top5"] == pytest.approx(200 / 3)
    assert metrics["images"] == 3 and metrics["images_per_s"] > 0


def test_runs_on_an_image_folder(validate, tmp_path, capsys):
    data = image_folder(tmp_path / "val", classes=3)
    ckpt = checkpoint(tmp_path / "model.pth", num_classes=3)
    argv = ["--model", "test_ppma", "--checkpoint", str(ckpt), "--data", str(data), "--workers", "0",
            "--img-size", "32", "--crop-pct", "1.0", "--batch-size", "4"]
    metrics = validate.main(argv)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == {"model": "test_ppma", **metrics}
    assert metrics["images"] == 6 and set(metrics) == {"top1", "images", "images_per_s"}  # 3 classes: no top-5
    amp = validate.main(argv + ["--amp"])  # bfloat16 autocast on the CPU
    assert amp["images"] == 6 and 0.0 <= amp["top1"] <= 100.0


def test_missing_data_folder(validate, tmp_path, capsys):
    ckpt = checkpoint(tmp_path / "model.pth", num_classes=3)
    message = run_error(validate, capsys, "--model", "test_ppma", "--checkpoint", ckpt, "--data", tmp_path / "nothing")
    assert message.endswith(f"data folder not found: {tmp_path / 'nothing'}")


def test_class_count_mismatch(validate, tmp_path, capsys):
    data = image_folder(tmp_path / "val", classes=2, per_class=1)
    ckpt = checkpoint(tmp_path / "model.pth", num_classes=3)
    message = run_error(validate, capsys, "--model", "test_ppma", "--checkpoint", ckpt, "--data", data)
    assert "test_ppma has 3 outputs but" in message and "has 2 class folders" in message


def test_checkpoint_of_another_model(validate, tmp_path, capsys):
    data = image_folder(tmp_path / "val", classes=3, per_class=1)
    ckpt = checkpoint(tmp_path / "mila.pth", name="test_mila", num_classes=3)
    message = run_error(validate, capsys, "--model", "test_ppma", "--checkpoint", ckpt, "--data", data)
    assert f"{ckpt} does not fit 'test_ppma'" in message


def test_backbone_checkpoint(validate, tmp_path, capsys):
    data = image_folder(tmp_path / "val", classes=3, per_class=1)
    ckpt = checkpoint(tmp_path / "backbone.pth", with_head=False)
    message = run_error(validate, capsys, "--model", "test_ppma", "--checkpoint", ckpt, "--data", data)
    assert "holds no classifier" in message


def test_unknown_model(validate, tmp_path, capsys):
    data = image_folder(tmp_path / "val", classes=3, per_class=1)
    message = run_error(validate, capsys, "--model", "resnet_nope", "--pretrained", "--data", data)
    assert "unknown model 'resnet_nope'" in message and "ppma_tiny" in message
