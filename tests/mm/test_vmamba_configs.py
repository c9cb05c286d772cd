"""The VMamba configs of mm_configs/: each builds its model with the release's settings, and the
quick starts train one iteration through tools/train.py on generated data."""
from pathlib import Path

import pytest
import torch

pytest.importorskip("mmdet", reason="mmdet is not installed (pip install 'ppma[mm]'); CI installs it")
pytest.importorskip("mmseg", reason="mmseg is not installed (pip install 'ppma[mm]'); CI installs it")
from mmengine.config import Config  # noqa: E402
from mmengine.registry import MODELS, init_default_scope  # noqa: E402

from ppma.mm import PyramidBackbone  # noqa: E402

CONFIG_ROOT = Path(__file__).resolve().parents[2] / "mm_configs"
QUICK = {"det": CONFIG_ROOT / "quickstart" / "mask_rcnn_vmamba_micro_fpn_shapes.py",
         "seg": CONFIG_ROOT / "quickstart" / "upernet_vmamba_micro_shapes.py"}

# size -> drop path of the release (MzeroMiko/VMamba, detection|segmentation/configs/vssm1/):
# VMamba-T is s1l8 (vmamba_tiny), VMamba-S/B are s2l15; the same drop path for 1x, 3x and UPerNet.
SIZES = {"tiny": 0.2, "small_s2l15": 0.3, "base_s2l15": 0.6}
# name -> (preset, drop path, lr, weight decay, schedule length, warm-up iterations, milestones)
DET = {f"mask_rcnn_vmamba_{size}_fpn_{sched}_coco": (f"vmamba_{size}", dpr, 1e-4, 0.05, epochs, 1000, milestones)
       for sched, epochs, milestones in (("1x", 12, [8, 11]), ("3x", 36, [27, 33])) for size, dpr in SIZES.items()}
SEG = {f"upernet_vmamba_{size}_512x512_160k_ade20k": (f"vmamba_{size}", dpr, 6e-5, 0.01, 160000, 1500, None)
       for size, dpr in SIZES.items()}
RECIPES = {**DET, **SEG}
CONFIGS = sorted(CONFIG_ROOT.glob("*/*vmamba*.py"))
def test_the_recipes_exist():
    assert {p.stem for p in CONFIGS} == set(RECIPES) | {p.stem for p in QUICK.values()}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_builds(path):
    cfg = Config.fromfile(str(path))
    init_default_scope(cfg.default_scope)
    model = MODELS.build(cfg.model)
    backbone = model.backbone
    assert isinstance(backbone, PyramidBackbone) and backbone.model_name.startswith("vmamba_")
    channels = list(backbone.channels)
    if cfg.default_scope == "mmdet":
        assert [model.neck.lateral_convs[i].conv.in_channels for i in range(4)] == channels
    else:
        assert list(cfg.model.decode_head.in_channels) == channels
        assert cfg.model.auxiliary_head.in_channels == channels[2]
    # the released dense-prediction backbones norm each output (outnorm{i}): so do features_only models
    assert len(backbone.model.out_norms) == 4
    assert cfg.optim_wrapper.constructor == "NoDecayOptimWrapperConstructor"
    assert dict(cfg.optim_wrapper.paramwise_cfg.custom_keys) == {"norm": dict(decay_mult=0.0)}
    if path.stem in RECIPES:
        preset, dpr, lr, wd, length, warmup, milestones = RECIPES[path.stem]
        assert backbone.model_name == preset
        assert cfg.model.backbone.drop_path_rate == dpr
        assert cfg.model.backbone.init_cfg.type == "Pretrained"
        assert (cfg.optim_wrapper.optimizer.lr, cfg.optim_wrapper.optimizer.weight_decay) == (lr, wd)
        assert cfg.train_cfg.get("max_epochs", cfg.train_cfg.get("max_iters")) == length
        assert cfg.param_scheduler[0].end == warmup
        if cfg.default_scope == "mmdet":  # 1x: single scale; 3x: multi-scale + crop, as released
            assert cfg.param_scheduler[1].milestones == milestones
            assert cfg.train_pipeline[3].type == ("RandomChoice" if "3x" in path.stem else "RandomFlip")
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
    work = shapes_root / f"work_vmamba_{task}"
    state = mm.train_one_iteration(QUICK[task], work, shapes_root)
    assert any(k.startswith("backbone.model.out_norms.") for k in state["state_dict"])
    assert any(k.endswith(".op.A_logs") for k in state["state_dict"])
