"""The Vim configs of mm_configs/: each builds its model with the release's settings (layer-wise lr
decay included), and the quick starts train one iteration through tools/train.py on generated data."""
from pathlib import Path

import pytest
import torch

pytest.importorskip("mmdet", reason="mmdet is not installed (pip install 'ppma[mm]'); CI installs it")
pytest.importorskip("mmseg", reason="mmseg is not installed (pip install 'ppma[mm]'); CI installs it")
from mmengine.config import Config  # noqa: E402
from mmengine.optim import build_optim_wrapper  # noqa: E402
from mmengine.registry import MODELS, init_default_scope  # noqa: E402

from ppma.mm import PyramidBackbone  # noqa: E402

CONFIG_ROOT = Path(__file__).resolve().parents[2] / "mm_configs"
QUICK = {"det": CONFIG_ROOT / "quickstart" / "mask_rcnn_vim_hier_micro_fpn_shapes.py",
         "seg": CONFIG_ROOT / "quickstart" / "upernet_vim_micro_shapes.py"}

# name -> (preset, drop path, lr, weight decay, layer decay, schedule length): the release
# (hustvl/Vim, seg/configs/vim/upernet/ with seg/scripts/ft_vim_*_upernet.sh); the hierarchical
# Mask R-CNN takes PPMA-T's recipe (not released).
RECIPES = {
    "upernet_vim_tiny_512x512_60k_ade20k": ("vim_tiny", 0.1, 2e-4, 0.1, 0.92, 60000),
    "upernet_vim_small_512x512_60k_ade20k": ("vim_small", 0.1, 1e-4, 0.05, 0.956, 60000),
    "mask_rcnn_vim_hier_tiny_fpn_1x_coco": ("vim_hier_tiny", 0.1, 1e-4, 0.05, None, 12),
}
CONFIGS = sorted(CONFIG_ROOT.glob("*/*vim*.py"))
def test_the_recipes_exist():
    assert {p.stem for p in CONFIGS} == set(RECIPES) | {p.stem for p in QUICK.values()}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_builds(path):
    cfg = Config.fromfile(str(path))
    init_default_scope(cfg.default_scope)
    model = MODELS.build(cfg.model)
    backbone = model.backbone
    assert isinstance(backbone, PyramidBackbone) and backbone.model_name.startswith("vim_")
    channels = list(backbone.channels)
    if cfg.default_scope == "mmdet":
        assert [model.neck.lateral_convs[i].conv.in_channels for i in range(4)] == channels
    else:
        assert list(cfg.model.decode_head.in_channels) == channels
        assert cfg.model.auxiliary_head.in_channels == channels[2]
    plain = "hier" not in backbone.model_name
    if plain:  # the released dense-prediction backbone: no class token, the adapter, positions for the crop
        assert backbone.model.stem.cls_token is None and backbone.model.pyramid is not None
        assert backbone.model.stem.pos_grid == (cfg.crop_size[0] // 16,) * 2
    if path.stem in RECIPES:
        preset, dpr, lr, wd, layer_decay, length = RECIPES[path.stem]
        assert backbone.model_name == preset and cfg.model.backbone.drop_path_rate == dpr
        assert cfg.model.backbone.init_cfg.type == "Pretrained"
        assert (cfg.optim_wrapper.optimizer.lr, cfg.optim_wrapper.optimizer.weight_decay) == (lr, wd)
        assert cfg.train_cfg.get("max_epochs", cfg.train_cfg.get("max_iters")) == length
        assert cfg.optim_wrapper.paramwise_cfg.get("layer_decay_rate") == layer_decay
        if plain:
            assert cfg.model.test_cfg == dict(mode="slide", crop_size=(512, 512), stride=(341, 341))
            lrs = {n: g["lr"] for g in build_optim_wrapper(model, cfg.optim_wrapper).optimizer.param_groups
                   for n in [next(k for k, p in model.named_parameters() if p is g["params"][0])]}
            assert lrs["backbone.model.blocks.23.norm.weight"] == pytest.approx(lr * layer_decay)
            assert lrs["backbone.model.stem.proj.weight"] == pytest.approx(lr * layer_decay**25)
            assert lrs["decode_head.conv_seg.weight"] == lr
    if "tiny" in path.stem or "micro" in path.stem:  # a forward of the backbone on a 64x64 input
        backbone.eval()
        with torch.no_grad():
            feats = backbone(torch.randn(1, 3, 64, 64))
        assert [tuple(f.shape) for f in feats] == [(1, c, 64 // s, 64 // s) for c, s in zip(channels, (4, 8, 16, 32))]


@pytest.mark.parametrize("task", ["seg"])  # the detection quick start builds above; one run is enough in CI
def test_quickstart_trains_one_iteration(mm, shapes_root, task):
    work = shapes_root / f"work_vim_{task}"
    mm.train_one_iteration(QUICK[task], work, shapes_root)
