"""demo/image_demo.py and tools/visualize_*.py: outputs on success, exit 2 with a clear message on bad input."""
import argparse
import logging
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib", reason="the demo and tools draw with matplotlib (the 'vis' extra)")
pytest.importorskip("tqdm", reason="the tools show a progress bar with tqdm (the 'vis' extra)")
from PIL import Image  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "demo" / "image_demo.py"


def run(script: Path, *args: str, monkeypatch) -> int:
    """Run a CLI script in this process; returns its exit status."""
    monkeypatch.setattr(sys, "argv", [str(script), *map(str, args)])
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        return stop.code or 0
    return 0


@pytest.fixture
def small_image(tmp_path):
    (tmp_path / "images").mkdir()
    path = tmp_path / "images" / "img.png"
    Image.fromarray(np.random.default_rng().integers(0, 256, size=(40, 56, 3), dtype=np.uint8)).save(path)
    return path


def test_shipped_sample_image_loads():
    from ppma.vis.loading import load_image

    assert load_image(ROOT / "demo" / "astronaut.jpg").shape == (512, 512, 3)


def test_demo_writes_the_figure_and_the_gif(small_image, tmp_path, monkeypatch, caplog):
    out, gif = tmp_path / "fig.png", tmp_path / "q.gif"
    args = ["--size", "64", "--query", "50,5", "--out", out, "--gif", gif, "--gif-grid", "1", "2", "--dpi", "50"]
    assert run(DEMO, small_image, *args, monkeypatch=monkeypatch) == 0
    assert "RANDOM" in caplog.text
    assert Image.open(out).size == (6 * 100, 4 * 100)  # four layers (last of each stage), six panels
    with Image.open(gif) as frames:
        assert frames.n_frames == 2
        assert frames.size == (4 * 60, 60)


def test_demo_with_the_3d_model_draws_one_row_per_frame(small_image, tmp_path, monkeypatch):
    args = ["--model", "ppma_tiny_3d", "--frames", "2", "--size", "32", "--layer", "0", "--dpi", "50"]
    args += ["--out", tmp_path / "f.png"]
    assert run(DEMO, small_image, *args, monkeypatch=monkeypatch) == 0
    assert Image.open(tmp_path / "f.png").size == (7 * 100, 2 * 100)  # gamma adds a panel; a row per frame


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.png"], "image not found"),
        (["{img}", "--model", "resnet_but_not_ppma"], "unknown model"),
        (["{img}", "--query", "56,3"], "outside the image"),
        (["{img}", "--query", "3"], "query must be 'x,y'"),
        (["{img}", "--checkpoint", "{bad_key}"], "does not fit"),
        (["{img}", "--checkpoint", "nothing.pth"], "checkpoint not found"),
    ],
)
def test_demo_fails_clearly_on_bad_input(args, message, small_image, tmp_path, monkeypatch, capsys):
    # Official layout (with the 'args' Namespace the official files hold) and a key PPMA does not have.
    official = {"model": {"layers.0.blocks.0.not_a_module.weight": torch.zeros(3)}, "args": argparse.Namespace(lr=1e-3)}
    torch.save(official, tmp_path / "bad_key.pth")
    names = dict(img=small_image, bad_key=tmp_path / "bad_key.pth")
    args = [a.format(**names) for a in args] + ["--size", "32", "--out", tmp_path / "fig.png"]
    assert run(DEMO, *args, monkeypatch=monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not (tmp_path / "fig.png").exists()


@pytest.fixture
def folder(small_image):
    """A folder with two images of different sizes."""
    Image.fromarray(np.zeros((30, 30, 3), dtype=np.uint8)).save(small_image.parent / "second.jpg")
    return small_image.parent


COMMON = ["--size", "32", "48", "--layer", "0", "-1", "--dpi", "25"]


def test_visualize_decay_on_a_folder(folder, tmp_path, monkeypatch):
    args = [*COMMON, "--heads", "0", "3", "--out-dir", tmp_path / "d"]
    assert run(ROOT / "tools" / "visualize_decay.py", folder, *args, monkeypatch=monkeypatch) == 0
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["img_decay.png", "second_decay.png"]
    assert Image.open(tmp_path / "d" / "img_decay.png").size == (2 * 2 * 50, 2 * 50)  # 2 decays x 2 heads
    assert run(ROOT / "tools" / "visualize_attention.py", folder, "--query", "1.5,0", monkeypatch=monkeypatch) == 2


def test_demo_and_attention_tool_with_a_classification_checkpoint(folder, tmp_path, monkeypatch, capsys):
    import timm
    from safetensors.torch import save_file

    import ppma  # noqa: F401

    save_file(timm.create_model("ppma_tiny").state_dict(), tmp_path / "cls.safetensors")
    args = ["--size", "32", "--checkpoint", tmp_path / "cls.safetensors", "--out", tmp_path / "fig.png"]
    assert run(DEMO, folder / "img.png", *args, monkeypatch=monkeypatch) == 0
    assert "top-5 ImageNet classes" in capsys.readouterr().out
    args = [*COMMON, "--checkpoint", tmp_path / "cls.safetensors", "--gif", "--gif-grid", "2", "1"]
    args += ["--out-dir", tmp_path / "a"]
    assert run(ROOT / "tools" / "visualize_attention.py", folder, *args, monkeypatch=monkeypatch) == 0
    for kind in ("attention.png", "mask.png", "query.gif"):
        assert sorted(p.name for p in (tmp_path / "a").glob(f"*_{kind}")) == [f"img_{kind}", f"second_{kind}"]


def test_segmentor_checkpoint_gives_its_backbone(folder, tmp_path, monkeypatch, caplog):
    pytest.importorskip("ppma.mm", reason="reading OpenMMLab checkpoints needs the mm extra")
    import timm

    caplog.set_level(logging.INFO, logger="ppma.vis")

    model = timm.create_model("ppma_tiny", with_head=False, output_norms=(0, 1, 2, 3))
    backbone = {f"backbone.model.{k}": v for k, v in model.state_dict().items()}  # our mm adapter's layout
    head = {"decode_head.conv_seg.weight": torch.zeros(2, 4, 1, 1)}
    checkpoint = {"state_dict": {**backbone, **head}, "meta": {"iter": 1}}
    torch.save(checkpoint, tmp_path / "seg.pth")
    args = [*COMMON, "--checkpoint", tmp_path / "seg.pth", "--out-dir", tmp_path / "d"]
    assert run(ROOT / "tools" / "visualize_decay.py", folder, *args, monkeypatch=monkeypatch) == 0
    assert "as a backbone" in caplog.text
    assert len(list((tmp_path / "d").glob("*_decay.png"))) == 2


def test_load_model_builds_what_the_checkpoint_has_and_names_what_does_not_fit(tmp_path):
    import timm

    from ppma.vis.loading import load_model

    backbone = timm.create_model("test_ppma", with_head=False, output_norms=(1, 2)).state_dict()
    torch.save({"model": backbone}, tmp_path / "backbone.pth")
    model, has_classifier = load_model("test_ppma", tmp_path / "backbone.pth")
    assert not has_classifier and model.head is None and sorted(model.out_norms) == ["1", "2"]
    assert torch.equal(model.state_dict()["out_norms.2.weight"], backbone["out_norms.2.weight"])
    classifier = timm.create_model("test_ppma").state_dict()
    classifier["stages.0.blocks.0.mixer.gate.weight"] = torch.zeros(2)
    torch.save({"model": classifier}, tmp_path / "bad.pth")
    with pytest.raises(ValueError, match=r"bad\.pth does not fit test_ppma: .*stages\.0\.blocks\.0\.mixer\.gate\.weight"):
        load_model("test_ppma", tmp_path / "bad.pth")
