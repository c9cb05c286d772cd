"""Every detection/segmentation config in mm_configs/ builds its model with consistent channels and
what its name says (preset, schedule, crop, data set) with a sound recipe, and the families' quick starts
train one iteration through tools/train.py on generated data. The classification configs are
tests/mm/test_classification.py's."""
import re
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


# What a config's name says it is: ``mask_rcnn_<preset>_fpn_<1x|3x>_coco`` or
# ``upernet_<preset>_<H>x<W>_<N>k_<ade20k|cityscapes>``. The release's hyperparameters (drop
# path, lr, weight decay, ...) are each config's own, with their source in its comments; the
# tests check what the name promises and what every recipe must satisfy, not the values again.
NAME = re.compile(r"(?:mask_rcnn_(?P<det>\w+?)_fpn_(?P<schedule>[13]x)_coco"
                  r"|upernet_(?P<seg>\w+?)_(?P<h>\d+)x(?P<w>\d+)_(?P<k>\d+)k_(?P<data>ade20k|cityscapes))")
SCHEDULES = {"1x": (12, [8, 11]), "3x": (36, [27, 33])}  # mmdet's schedules: epochs, lr steps
DATASETS = {"ade20k": ("ADE20KDataset", 150), "cityscapes": ("CityscapesDataset", 19)}
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


def test_every_config_name_says_what_it_is():
    quick = {p.stem for p in CONFIGS if QUICK in p.parents}
    assert quick == {q for qs in QUICK_STARTS.values() for q in qs}
    for path in CONFIGS:
        if path.stem not in quick:
            match = NAME.fullmatch(path.stem)
            assert match, f"{path.name}: not mask_rcnn_<preset>_fpn_<1x|3x>_coco or upernet_<preset>_<H>x<W>_<N>k_<data>"
            family_of(match["det"] or match["seg"])  # a preset of this package


def check_output_norms(backbone, cfg):
    """The released dense-prediction backbones norm each output: so do features_only models."""
    assert len(backbone.model.out_norms) == 4


def check_plain_vim(backbone, cfg):
    """The released dense-prediction Vim: no class token, the adapter, positions for the crop."""
    if "hier" not in backbone.model_name:
        assert backbone.model.stem.cls_token is None and backbone.model.pyramid is not None
        assert backbone.model.stem.pos_grid == (cfg.crop_size[0] // 16,) * 2


FAMILY_CHECKS = {"ppma": (), "vmamba": (check_output_norms,), "mila": (check_output_norms,), "vim": (check_plain_vim,)}


def check_recipe(model, cfg, name):
    """What the name ``name`` (a :data:`NAME` match) promises, and what every recipe satisfies."""
    assert model.backbone.model_name == (name["det"] or name["seg"])
    init = cfg.model.backbone.init_cfg  # None: no ImageNet checkpoint released (PPMA's linear kind)
    assert init is None or (init.type == "Pretrained" and init.checkpoint)
    assert 0.0 <= cfg.model.backbone.drop_path_rate < 1.0
    optimizer = cfg.optim_wrapper.optimizer
    assert optimizer.type == "AdamW" and optimizer.lr > 0 and optimizer.weight_decay >= 0
    assert optimizer.get("fused") is True  # one kernel a step for every parameter (docs/openmmlab.md)
    if name["det"]:
        epochs, milestones = SCHEDULES[name["schedule"]]
        assert cfg.train_cfg.max_epochs == epochs and cfg.param_scheduler[1].milestones == milestones
        if name["schedule"] == "3x":  # the 3x schedules train at several scales
            assert cfg.train_pipeline[3].type == "RandomChoice"
    else:
        assert cfg.train_cfg.max_iters == 1000 * int(name["k"])
        assert tuple(cfg.crop_size) == tuple(cfg.model.data_preprocessor.size) == (int(name["h"]), int(name["w"]))
        dataset, classes = DATASETS[name["data"]]
        assert cfg.train_dataloader.dataset.type == dataset and cfg.model.decode_head.num_classes == classes
    length = cfg.train_cfg.get("max_epochs", cfg.train_cfg.get("max_iters"))
    assert 0 < cfg.param_scheduler[0].end < (length if cfg.param_scheduler[0].by_epoch else 1000 * length)
    rate = cfg.optim_wrapper.get("paramwise_cfg", {}).get("layer_decay_rate")
    if rate is not None:  # plain Vim: block i's lr is lr * rate**(depth - i), the stem's rate**(depth + 1)
        depth, lr = len(model.backbone.model.blocks), optimizer.lr
        names = {id(p): k for k, p in model.named_parameters()}
        lrs = {names[id(p)]: g["lr"] for g in build_optim_wrapper(model, cfg.optim_wrapper).optimizer.param_groups
               for p in g["params"]}
        assert lrs[f"backbone.model.blocks.{depth - 1}.norm.weight"] == pytest.approx(lr * rate)
        assert lrs["backbone.model.stem.proj.weight"] == pytest.approx(lr * rate ** (depth + 1))
        assert lrs["decode_head.conv_seg.weight"] == lr


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
    if "quickstart" not in path.parts:
        check_recipe(model, cfg, NAME.fullmatch(path.stem))
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
