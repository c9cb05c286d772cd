"""tools/make_shapes_dataset.py: seeded, the COCO and semantic labels describe the same shapes, and
the classification ImageFolder has a folder per shape and leaves the other images unchanged."""
import json
import subprocess
import sys

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image", reason="pillow is not installed")


def make(mm, out, *args):
    return subprocess.run([sys.executable, str(mm.tools / "make_shapes_dataset.py"), str(out), *args],
                          capture_output=True, text=True)


def test_seeded_and_consistent(mm, tmp_path):
    args = ("--num-train", "3", "--num-val", "2", "--size", "72", "--seed", "11",
            "--cls-train", "2", "--cls-val", "1", "--cls-size", "32")
    for name in ("a", "b"):
        assert make(mm, tmp_path / name, *args).returncode == 0
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) == 2 + 2 * 5 + 3 * (2 + 1)
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel

    for split, count in (("training", 3), ("validation", 2)):
        coco = json.loads((tmp_path / "a" / "annotations" / f"instances_{split}.json").read_text())
        assert len(coco["images"]) == count
        names = {c["id"]: c["name"] for c in coco["categories"]}
        assert sorted(names.values()) == ["circle", "square", "triangle"]
        for image in coco["images"]:
            semantic = np.asarray(Image.open(tmp_path / "a" / "annotations" / split /
                                             image["file_name"].replace(".jpg", ".png")))
            assert semantic.shape == (72, 72) and semantic.min() >= 1 and semantic.max() <= 4
            anns = [a for a in coco["annotations"] if a["image_id"] == image["id"]]
            assert anns
            for category, name in names.items():
                label = 2 + ["circle", "square", "triangle"].index(name)
                area = sum(a["area"] for a in anns if a["category_id"] == category)
                assert area == (semantic == label).sum()
            for a in anns:
                x, y, w, h = a["bbox"]
                assert 0 <= x and 0 <= y and x + w <= 72 and y + h <= 72 and a["area"] <= w * h


def test_classification_folder(mm, tmp_path):
    assert make(mm, tmp_path / "a", "--num-train", "1", "--num-val", "1", "--size", "32", "--seed", "2",
                "--cls-train", "3", "--cls-val", "2", "--cls-size", "40").returncode == 0
    for split, count in (("train", 3), ("val", 2)):
        root = tmp_path / "a" / "classification" / split
        assert sorted(p.name for p in root.iterdir()) == ["circle", "square", "triangle"]
        for folder in root.iterdir():
            images = sorted(folder.iterdir())
            assert [p.name for p in images] == [f"{i:05d}.jpg" for i in range(count)]
            assert all(Image.open(p).size == (40, 40) for p in images)
    # the detection/segmentation images come first from their own stream: other classification
    # options leave them byte for byte the same
    assert make(mm, tmp_path / "b", "--num-train", "1", "--num-val", "1", "--size", "32", "--seed", "2",
                "--cls-train", "1", "--cls-val", "1", "--cls-size", "32").returncode == 0
    for rel in ("images/training/00000.jpg", "annotations/training/00000.png", "annotations/instances_validation.json"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_bad_arguments(mm, tmp_path):
    result = make(mm, tmp_path / "x", "--num-train", "0")
    assert result.returncode == 2 and "--num-train must be >= 1" in result.stderr
    result = make(mm, tmp_path / "x", "--cls-size", "16")
    assert result.returncode == 2 and "--cls-size must be >= 32" in result.stderr
