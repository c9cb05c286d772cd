"""Every detection/segmentation config in mm_configs/ builds its model with consistent channels and
the release's settings of its family (the recipe tables below), and the families' quick starts
train one iteration through tools/train.py on generated data. The classification configs are
tests/mm/test_classification.py's."""
from pathlib import Path

import pytest
import torch

pytest.importorskip("mmdet", reason="mmdet is not installed (pip install 'ppma[mm]'); CI installs it")
pytest.importorskip("mmseg", reason="mmseg is not installed (pip install 'ppma[mm]'); CI installs it")
from mmengine.config import Config  # noqa: E402
from mmengine.optim import build_optim_wrapper  # noqa: E402
from mmengine.registry import MODELS, init_default_scope  # noqa: E402

from ppma.mm import PyramidBackbone  # noqa: E402
from ppma.models.family import family_of  # noqa: E402

CONFIG_ROOT = Path(__file__).resolve().parents[2] / "mm_configs"
CONFIGS = sorted(p for p in CONFIG_ROOT.rglob("*.py") if not {"_base_", "classification"} & set(p.parts))
QUICK = CONFIG_ROOT / "quickstart"


def recipe(preset, drop_path, lr, weight_decay, length, **extra):
    return dict(preset=preset, drop_path=drop_path, lr=lr, weight_decay=weight_decay, length=length, **extra)


# name -> the release's settings, checked in the built config. Families without an entry here
# (PPMA) are checked for their set of recipes only.
# VMamba (MzeroMiko/VMamba, detection|segmentation/configs/vssm1/): VMamba-T is s1l8 (vmamba_tiny),
# VMamba-S/B are s2l15; the same drop path for 1x, 3x and UPerNet; 1x single-scale, 3x multi-scale.
VMAMBA_SIZES = {"tiny": 0.2, "small_s2l15": 0.3, "base_s2l15": 0.6}
# MILA (LeapLabTHU/MLLA, downstream/*/configs/mlla/); base 3x and tiny/small UPerNet are
# extrapolated (not released); multi-scale + crop training for 1x and 3x.
MILA_DROP_PATH = {"1x": (0.1, 0.1, 0.1), "3x": (0.3, 0.3, 0.3), "upernet": (0.2, 0.3, 0.5)}
SCHEDULES = {"1x": (12, [8, 11]), "3x": (36, [27, 33])}
RECIPES = {
    **{f"mask_rcnn_vmamba_{size}_fpn_{sched}_coco": recipe(
        f"vmamba_{size}", dpr, 1e-4, 0.05, epochs, warmup=1000, milestones=milestones,
        augment="RandomChoice" if sched == "3x" else "RandomFlip")
       for sched, (epochs, milestones) in SCHEDULES.items() for size, dpr in VMAMBA_SIZES.items()},
    **{f"upernet_vmamba_{size}_512x512_160k_ade20k": recipe(f"vmamba_{size}", dpr, 6e-5, 0.01, 160000, warmup=1500)
       for size, dpr in VMAMBA_SIZES.items()},
    **{f"mask_rcnn_mila_{size}_fpn_{sched}_coco": recipe(f"mila_{size}", dpr, 1e-4, 0.05, epochs, augment="RandomChoice")
       for sched, (epochs, _) in SCHEDULES.items() for size, dpr in zip(("tiny", "small", "base"), MILA_DROP_PATH[sched])},
    **{f"upernet_mila_{size}_512x512_160k_ade20k": recipe(f"mila_{size}", dpr, 6e-5, 0.01, 160000)
       for size, dpr in zip(("tiny", "small", "base"), MILA_DROP_PATH["upernet"])},
    # Vim (hustvl/Vim, seg/configs/vim/upernet/ with seg/scripts/ft_vim_*_upernet.sh): layer-wise lr
    # decay; the hierarchical Mask R-CNN takes PPMA-T's recipe (not released)
    "upernet_vim_tiny_512x512_60k_ade20k": recipe("vim_tiny", 0.1, 2e-4, 0.1, 60000, layer_decay=0.92),
    "upernet_vim_small_512x512_60k_ade20k": recipe("vim_small", 0.1, 1e-4, 0.05, 60000, layer_decay=0.956),
    "mask_rcnn_vim_hier_tiny_fpn_1x_coco": recipe("vim_hier_tiny", 0.1, 1e-4, 0.05, 12, layer_decay=None),
}
PPMA_RECIPES = {f"mask_rcnn_ppma_{size}_fpn_{sched}_coco" for size in ("tiny", "small", "base", "linear_tiny")
                for sched in SCHEDULES} | {f"upernet_ppma_{size}_{data}" for size in ("tiny", "small", "base", "linear_tiny")
                                           for data in ("512x512_160k_ade20k", "1024x1024_160k_cityscapes")}
# family -> its quick starts (generated data) and the one CI trains for one iteration
QUICK_STARTS = {
    "ppma": ("mask_rcnn_ppma_micro_fpn_shapes", "upernet_ppma_micro_shapes"),  # trained by test_tools.py
    "vmamba": ("mask_rcnn_vmamba_micro_fpn_shapes", "upernet_vmamba_micro_shapes"),
    "mila": ("mask_rcnn_mila_micro_fpn_shapes", "upernet_mila_micro_shapes"),
    "vim": ("mask_rcnn_vim_hier_micro_fpn_shapes", "upernet_vim_micro_shapes"),
}
TRAINED = ["mask_rcnn_vmamba_micro_fpn_shapes", "upernet_vmamba_micro_shapes", "mask_rcnn_mila_micro_fpn_shapes",
           "upernet_mila_micro_shapes", "upernet_vim_micro_shapes"]  # Vim's detection quick start builds below


def family_name(path: Path) -> str:
    """The family a config file belongs to, by its name (``vim_hier`` counts as ``vim``)."""
    return next(f for f in QUICK_STARTS if f"_{f}_" in path.stem)


def test_the_recipes_exist():
    names = {p.stem for p in CONFIGS}
    assert PPMA_RECIPES | set(RECIPES) | {q for qs in QUICK_STARTS.values() for q in qs} == names


def check_output_norms(backbone, cfg):
    """The released dense-prediction backbones norm each output: so do features_only models."""
    assert len(backbone.model.out_norms) == 4


def check_plain_vim(backbone, cfg):
    """The released dense-prediction Vim: no class token, the adapter, positions for the crop."""
    if "hier" not in backbone.model_name:
        assert backbone.model.stem.cls_token is None and backbone.model.pyramid is not None
        assert backbone.model.stem.pos_grid == (cfg.crop_size[0] // 16,) * 2


FAMILY_CHECKS = {"ppma": (), "vmamba": (check_output_norms,), "mila": (check_output_norms,), "vim": (check_plain_vim,)}


def check_recipe(model, cfg, expected):
    backbone = model.backbone
    assert backbone.model_name == expected["preset"]
    assert cfg.model.backbone.drop_path_rate == expected["drop_path"]
    assert cfg.model.backbone.init_cfg.type == "Pretrained"
    assert (cfg.optim_wrapper.optimizer.lr, cfg.optim_wrapper.optimizer.weight_decay) == (
        expected["lr"], expected["weight_decay"])
    assert cfg.train_cfg.get("max_epochs", cfg.train_cfg.get("max_iters")) == expected["length"]
    if "warmup" in expected:
        assert cfg.param_scheduler[0].end == expected["warmup"]
    if "milestones" in expected:
        assert cfg.param_scheduler[1].milestones == expected["milestones"]
    if "augment" in expected:
        assert cfg.train_pipeline[3].type == expected["augment"]
    if "layer_decay" in expected:
        layer_decay = expected["layer_decay"]
        assert cfg.optim_wrapper.paramwise_cfg.get("layer_decay_rate") == layer_decay
        if layer_decay is not None:  # plain Vim: the released sliding-window test and lr per layer
            lr = expected["lr"]
            assert cfg.model.test_cfg == dict(mode="slide", crop_size=(512, 512), stride=(341, 341))
            lrs = {n: g["lr"] for g in build_optim_wrapper(model, cfg.optim_wrapper).optimizer.param_groups
                   for n in [next(k for k, p in model.named_parameters() if p is g["params"][0])]}
            assert lrs["backbone.model.blocks.23.norm.weight"] == pytest.approx(lr * layer_decay)
            assert lrs["backbone.model.stem.proj.weight"] == pytest.approx(lr * layer_decay**25)
            assert lrs["decode_head.conv_seg.weight"] == lr
            return
    if cfg.default_scope == "mmseg":
        assert cfg.model.test_cfg.mode == "whole"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_builds(path):
    cfg = Config.fromfile(str(path))
    assert cfg.custom_imports.imports == ["ppma.mm"]
    init_default_scope(cfg.default_scope)
    model = MODELS.build(cfg.model)
    backbone = model.backbone
    family = family_name(path)
    assert isinstance(backbone, PyramidBackbone) and family_of(backbone.model_name).name.startswith(family)
    if "quickstart" not in path.parts:
        assert backbone.model_name in path.stem
    channels = list(backbone.channels)
    if cfg.default_scope == "mmdet":
        assert [model.neck.lateral_convs[i].conv.in_channels for i in range(4)] == channels
    else:
        assert list(cfg.model.decode_head.in_channels) == channels
        assert cfg.model.auxiliary_head.in_channels == channels[2]
    for check in FAMILY_CHECKS[family]:
        check(backbone, cfg)
    if cfg.optim_wrapper.constructor == "LayerDecayOptimWrapperConstructor":  # Vim: layer-wise lr decay, as released
        assert cfg.optim_wrapper.paramwise_cfg.flat_decay_mult == 0.0  # no decay on 1-D parameters (norms, biases)
    else:
        assert cfg.optim_wrapper.constructor == "NoDecayOptimWrapperConstructor"  # asks no_weight_decay()
        assert dict(cfg.optim_wrapper.paramwise_cfg.custom_keys) == {"norm": dict(decay_mult=0.0)}
    if path.stem in RECIPES:
        check_recipe(model, cfg, RECIPES[path.stem])
    if "tiny" in path.stem or "micro" in path.stem:  # a forward of the backbone on a 64x64 input
        backbone.eval()
        with torch.no_grad():
            feats = backbone(torch.randn(1, 3, 64, 64))
        assert [tuple(f.shape) for f in feats] == [(1, c, 64 // s, 64 // s) for c, s in zip(channels, (4, 8, 16, 32))]


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED)
def test_quickstart_trains_one_iteration(mm, shapes_root, name):
    state = mm.train_one_iteration(QUICK / f"{name}.py", shapes_root / f"work_{name}", shapes_root)["state_dict"]
    if "vmamba" in name or "mila" in name:
        assert any(k.startswith("backbone.model.out_norms.") for k in state)
    if "vmamba" in name:
        assert any(k.endswith(".op.A_logs") for k in state)
