"""Every config in mm_configs/ parses and builds its model, with consistent channels."""
from pathlib import Path

import pytest

pytest.importorskip("mmdet", reason="mmdet is not installed (pip install 'ppma[mm]'); CI installs it")
pytest.importorskip("mmseg", reason="mmseg is not installed (pip install 'ppma[mm]'); CI installs it")
from mmengine.config import Config  # noqa: E402
from mmengine.registry import MODELS, init_default_scope  # noqa: E402

from ppma.mm import PyramidBackbone  # noqa: E402

CONFIG_ROOT = Path(__file__).resolve().parents[2] / "mm_configs"
# detection and segmentation; the classification configs are tests/mm/test_classification.py's
CONFIGS = sorted(p for p in CONFIG_ROOT.rglob("*.py") if not {"_base_", "classification"} & set(p.parts))


def test_the_recipes_exist():
    names = {p.stem for p in CONFIGS}
    for size in ("tiny", "small", "base", "linear_tiny"):
        for sched in ("1x", "3x"):
            assert f"mask_rcnn_ppma_{size}_fpn_{sched}_coco" in names
        assert f"upernet_ppma_{size}_512x512_160k_ade20k" in names
        assert f"upernet_ppma_{size}_1024x1024_160k_cityscapes" in names
    assert {"mask_rcnn_ppma_micro_fpn_shapes", "upernet_ppma_micro_shapes"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_builds(path):
    cfg = Config.fromfile(str(path))
    assert cfg.custom_imports.imports == ["ppma.mm"]
    init_default_scope(cfg.default_scope)
    model = MODELS.build(cfg.model)
    backbone = model.backbone
    assert isinstance(backbone, PyramidBackbone)
    if "quickstart" not in path.parts:
        assert backbone.model_name in path.stem
    channels = list(backbone.channels)
    if cfg.default_scope == "mmdet":
        assert list(model.neck.lateral_convs[i].conv.in_channels for i in range(4)) == channels
    else:
        assert list(cfg.model.decode_head.in_channels) == channels
        assert cfg.model.auxiliary_head.in_channels == channels[2]
    if cfg.optim_wrapper.constructor == "LayerDecayOptimWrapperConstructor":  # Vim: layer-wise lr decay, as released
        assert cfg.optim_wrapper.paramwise_cfg.flat_decay_mult == 0.0  # no decay on 1-D parameters (norms, biases)
        return
    assert cfg.optim_wrapper.constructor == "NoDecayOptimWrapperConstructor"  # asks no_weight_decay()
    assert dict(cfg.optim_wrapper.paramwise_cfg.custom_keys) == {"norm": dict(decay_mult=0.0)}
