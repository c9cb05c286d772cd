"""Every family's ``test_*`` preset, classifier and ``features_only`` backbone, exported by
:mod:`ppma.deploy.export` with batch, H and W dynamic: ONNX run in ONNX Runtime and ``.pt2`` loaded back,
at sizes and batch sizes other than the example's, against eager PyTorch."""
from pathlib import Path

import pytest
import torch

from ppma.deploy import export
from ppma.models.family import families, family_of
from ppma.models.plain import PlainBackbone

ROOT = Path(__file__).resolve().parents[2]
PRESETS = [f.test_preset for f in families()]
# Exports take 20 s to 2 min each on 2 cores, most of it in the ONNX exporter's graph optimizer:
# the tool's default (optimized) file is checked on test_ppma and the detector, the other families
# are exported without the optimizer (the same graph before its rewrites).
OPTIMIZED = {"test_ppma"}
# Example sizes with H != W and off the presets' default grids (see docs/deploy.md: Vim's
# position embedding at its own grid); checked at two other sizes and batch sizes, one odd.
EXAMPLE = (48, 40)
PLAIN_SIZES = [(1, 3, 48, 72), (3, 3, 64, 80)]  # plain models (Vim): multiples of their patch
DEFAULT_SIZES = [(1, 3, 97, 131), (3, 3, 64, 72)]


class ClassifierAndFeatures(torch.nn.Module):
    """Both forms of a preset in one module (one export covers both): ``[logits, *features]``."""

    def __init__(self, name):
        super().__init__()
        self.classifier = export.build_model(name)
        self.features = export.build_model(name, features=True)
        self.pretrained_cfg = self.classifier.pretrained_cfg

    def forward(self, x):
        return [self.classifier(x), *self.features(x)]


@pytest.mark.parametrize("name", PRESETS)
def test_onnx_runs_in_onnxruntime_at_other_sizes(name, tmp_path):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install .[export])")
    torch.manual_seed(0)
    model = ClassifierAndFeatures(name).eval()
    x = export.example_input(model, EXAMPLE)
    path = tmp_path / f"{name}.onnx"
    export.save(export.export_program(model, x), x, "onnx", path, export.DEFAULT_OPSET, optimize=name in OPTIMIZED)
    run = export.runner("onnx", path)
    plain = issubclass(family_of(name).model_class, PlainBackbone)
    for shape in PLAIN_SIZES if plain else DEFAULT_SIZES:
        assert export.max_relative_error(model, run, shape) < export.TOLERANCE, shape


def test_pt2_round_trip_at_other_sizes(tmp_path):
    model = export.build_model("test_ppma", features=True)
    x = export.example_input(model, EXAMPLE)
    path = tmp_path / "test_ppma.pt2"
    export.save(export.export_program(model, x), x, "pt2", path, export.DEFAULT_OPSET)
    run = export.runner("pt2", path)
    for shape in DEFAULT_SIZES:
        assert export.max_relative_error(model, run, shape) < export.TOLERANCE, shape


def test_detector_backbone_and_neck_run_in_onnxruntime(tmp_path):
    pytest.importorskip("mmdet", reason="mmdet is not installed (pip install 'ppma[mm]'); CI installs it")
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install .[export])")
    config = ROOT / "mm_configs" / "quickstart" / "mask_rcnn_ppma_micro_fpn_shapes.py"
    model = export.build_dense(str(config))
    x = export.example_input(model, (64, 80))
    path = tmp_path / "mask_rcnn_backbone_neck.onnx"
    export.save(export.export_program(model, x), x, "onnx", path, export.DEFAULT_OPSET)
    run = export.runner("onnx", path)
    assert len(run(x)) == 5  # the FPN's levels
    for shape in DEFAULT_SIZES:
        assert export.max_relative_error(model, run, shape) < export.TOLERANCE, shape


def test_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="not a model of this package"):
        export.build_model("resnet18")
    bad = tmp_path / "bad.pth"
    torch.save({"stem.conv1.weight": torch.zeros(1)}, bad)
    with pytest.raises(ValueError, match="does not fit test_mila"):
        export.build_model("test_mila", str(bad))
    model = export.build_model("test_mila")
    with pytest.raises(ValueError, match="batch"):
        export.example_input(model, batch_size=1)
    with pytest.raises(ValueError, match="opset 13 is too old"):
        export.save(None, None, "onnx", tmp_path / "m.onnx", 13)
    with pytest.raises(FileNotFoundError, match="config not found: nothing.py"):
        export.build_dense("nothing.py")


@pytest.mark.parametrize("position", ["first", "middle"])
def test_position_embedding_exported_at_its_own_grid_stays_dynamic(position, tmp_path):
    """Vim's stem exported at its position embedding's own grid (where eager skips the resize)
    runs at other grids, its own included, with the same resize as eager."""
    from ppma.layers.embed import PatchStem

    torch.manual_seed(0)
    stem = PatchStem(3, 8, patch_size=8, img_size=48, class_token_position=position).eval()
    torch.nn.init.normal_(stem.pos_embed)
    x = torch.randn(2, 3, 48, 48)
    path = tmp_path / "stem.pt2"
    export.save(export.export_program(stem, x), x, "pt2", path, export.DEFAULT_OPSET)
    run = export.runner("pt2", path)
    for shape in [(2, 3, 48, 48), (1, 3, 40, 56), (3, 3, 72, 48)]:
        assert export.max_relative_error(stem, run, shape) < 1e-5, shape


def test_output_path_is_a_file_or_a_file_in_a_folder(tmp_path):
    """One model into an existing folder (or a path ending in /) lands in it as NAME.FORMAT, as
    several models do; any other path is the file itself."""
    assert export.output_path(str(tmp_path / "m.onnx"), "test_vim", "onnx") == tmp_path / "m.onnx"
    assert export.output_path(str(tmp_path), "test_vim", "onnx") == tmp_path / "test_vim.onnx"
    assert export.output_path(f"{tmp_path}/new/", "test_vim", "pt2", features=True) == tmp_path / "new" / "test_vim_features.pt2"
    assert export.output_path(str(tmp_path / "new"), "test_vim", "onnx", several=True) == tmp_path / "new" / "test_vim.onnx"
    config = "mm_configs/mask_rcnn/mask_rcnn_ppma_tiny_fpn_1x_coco.py"
    assert export.output_path(str(tmp_path), config, "onnx") == tmp_path / "mask_rcnn_ppma_tiny_fpn_1x_coco.onnx"
