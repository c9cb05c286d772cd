"""The MILA (MLLA) configs of mm_configs/: each builds its model with the release's settings, and
the quick starts train one iteration through tools/train.py on generated data."""
from pathlib import Path

import pytest
import torch

pytest.importorskip("mmdet", reason="mmdet is not installed (pip install 'ppma[mm]'); CI installs it")
pytest.importorskip("mmseg", reason="mmseg is not installed (pip install 'ppma[mm]'); CI installs it")
from mmengine.config import Config  # noqa: E402
from mmengine.registry import MODELS, init_default_scope  # noqa: E402

from ppma.mm import PyramidBackbone  # noqa: E402

CONFIG_ROOT = Path(__file__).resolve().parents[2] / "mm_configs"
QUICK = {"det": CONFIG_ROOT / "quickstart" / "mask_rcnn_mila_micro_fpn_shapes.py",
         "seg": CONFIG_ROOT / "quickstart" / "upernet_mila_micro_shapes.py"}

# name -> (preset, drop path, lr, weight decay, schedule length): release (LeapLabTHU/MLLA,
# downstream/*/configs/mlla/); base 3x and tiny/small UPerNet are extrapolated (not released).
DET = {f"mask_rcnn_mila_{size}_fpn_{sched}_coco": (f"mila_{size}", dpr, 1e-4, 0.05, epochs)
       for sched, epochs, dprs in (("1x", 12, (0.1, 0.1, 0.1)), ("3x", 36, (0.3, 0.3, 0.3)))
       for size, dpr in zip(("tiny", "small", "base"), dprs)}
SEG = {f"upernet_mila_{size}_512x512_160k_ade20k": (f"mila_{size}", dpr, 6e-5, 0.01, 160000)
       for size, dpr in (("tiny", 0.2), ("small", 0.3), ("base", 0.5))}
RECIPES = {**DET, **SEG}
CONFIGS = sorted(CONFIG_ROOT.glob("*/*mila*.py"))
def test_the_recipes_exist():
    assert {p.stem for p in CONFIGS} == set(RECIPES) | {p.stem for p in QUICK.values()}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_builds(path):
    cfg = Config.fromfile(str(path))
    init_default_scope(cfg.default_scope)
    model = MODELS.build(cfg.model)
    backbone = model.backbone
    assert isinstance(backbone, PyramidBackbone) and backbone.model_name.startswith("mila_")
    channels = list(backbone.channels)
    if cfg.default_scope == "mmdet":
        assert [model.neck.lateral_convs[i].conv.in_channels for i in range(4)] == channels
    else:
        assert list(cfg.model.decode_head.in_channels) == channels
        assert cfg.model.auxiliary_head.in_channels == channels[2]
    # the released dense-prediction backbones norm each output: so do features_only MILA models
    assert len(backbone.model.out_norms) == 4
    assert cfg.optim_wrapper.constructor == "NoDecayOptimWrapperConstructor"
    assert dict(cfg.optim_wrapper.paramwise_cfg.custom_keys) == {"norm": dict(decay_mult=0.0)}
    if path.stem in RECIPES:
        preset, dpr, lr, wd, length = RECIPES[path.stem]
        assert backbone.model_name == preset
        assert cfg.model.backbone.drop_path_rate == dpr
        assert cfg.model.backbone.init_cfg.type == "Pretrained"
        assert (cfg.optim_wrapper.optimizer.lr, cfg.optim_wrapper.optimizer.weight_decay) == (lr, wd)
        assert cfg.train_cfg.get("max_epochs", cfg.train_cfg.get("max_iters")) == length
        if cfg.default_scope == "mmdet":  # multi-scale + crop training for 1x and 3x, as released
            assert cfg.train_pipeline[3].type == "RandomChoice"
        else:
            assert cfg.model.test_cfg.mode == "whole"
    if "tiny" in path.stem or "micro" in path.stem:  # a forward of the backbone on a 64x64 input
        backbone.eval()
        with torch.no_grad():
            feats = backbone(torch.randn(1, 3, 64, 64))
        assert [tuple(f.shape) for f in feats] == [(1, c, 64 // s, 64 // s)
                                                  for c, s in zip(channels, (4, 8, 16, 32))]


@pytest.mark.parametrize("task", ["det", "seg"])
def test_quickstart_trains_one_iteration(mm, shapes_root, task):
    work = shapes_root / f"work_mila_{task}"
    state = mm.train_one_iteration(QUICK[task], work, shapes_root)
    assert any(k.startswith("backbone.model.out_norms.") for k in state["state_dict"])
