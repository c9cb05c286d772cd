"""Classification with mmpretrain: the quick start trains and evaluates (one process, and two over
gloo); its checkpoint loads in tools/validate.py, timm and the dense backbone; every
classification config builds as its name says, with a sound recipe; bad inputs fail naming the problem."""
import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("mmpretrain", reason="mmpretrain is not installed (pip install 'ppma[mm]'); CI installs it")
import timm  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.optim import build_optim_wrapper  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from mmpretrain.registry import MODELS  # noqa: E402

import ppma.mm.classification  # noqa: E402,F401  (registers the classifier; allows checkpoint globals)
from ppma.bench import validate  # noqa: E402
from ppma.mm import train  # noqa: E402
from ppma.mm.backbone import PyramidBackbone  # noqa: E402
from ppma.mm.optim import no_weight_decay_parameters  # noqa: E402
from ppma.models.family import family_of  # noqa: E402

CONFIG_ROOT = Path(__file__).resolve().parents[2] / "mm_configs" / "classification"
QUICK = CONFIG_ROOT / "quickstart" / "test_ppma_shapes.py"
CONFIGS = sorted(CONFIG_ROOT.rglob("*.py"))
# One process, no loader workers, three iterations of four 64x64 images per epoch.
FAST = ["train_dataloader.batch_size=4", "default_hooks.logger.interval=1",
        *(f"{loader}.{key}" for loader in ("train_dataloader", "val_dataloader", "test_dataloader")
          for key in ("num_workers=0", "persistent_workers=False"))]

# What a classification config's name says: ``<preset>_<gpus>xb<batch per GPU>_<epochs>e_in1k``.
# The release's values (drop path, lr, weight decay, EMA momentum) are each config's own, with
# their source in its comments; the test checks the name and what every recipe satisfies.
NAME = re.compile(r"(?P<preset>\w+?)_(?P<gpus>\d+)xb(?P<batch>\d+)_(?P<epochs>\d+)e_in1k")


def check(result):
    assert result.returncode == 0, result.stdout[-6000:]
    return result.stdout


@pytest.fixture(scope="module")
def cls_root(mm, tmp_path_factory):
    """A run folder with data/shapes/classification: 4 training and 2 validation images per class."""
    root = tmp_path_factory.mktemp("cls_run")
    check(mm.run([sys.executable, mm.tools / "make_shapes_dataset.py", root / "data" / "shapes",
                  "--num-train", "1", "--num-val", "1", "--size", "32", "--cls-train", "4", "--cls-val", "2",
                  "--seed", "5"], root))
    return root


@pytest.fixture(scope="module")
def trained(mm, cls_root):
    """One epoch of the quick start (three steps, then validation) through tools/train.py;
    returns (work dir, log)."""
    work = cls_root / "work"
    out = check(mm.run([sys.executable, mm.tools / "train.py", QUICK, "--work-dir", work,
                        "--cfg-options", "train_cfg.max_epochs=1", *FAST], cls_root, env={"OMP_NUM_THREADS": "1"}))
    return work, out


@pytest.mark.slow
def test_quick_start_trains_and_evaluates(trained):
    work, out = trained
    assert "Epoch(train) [1][3/3]" in out and "loss:" in out
    assert re.search(r"Epoch\(val\) \[1\]\[1/1\] +accuracy/top1: [\d.]+", out)  # 6 images, one batch
    checkpoint = torch.load(work / "epoch_1.pth", map_location="cpu")  # weights_only, as resume does
    timm_keys = set(timm.create_model("test_ppma", num_classes=3).state_dict())
    assert set(checkpoint["state_dict"]) == timm_keys  # the timm model's own keys, head included
    assert set(checkpoint["ema_state_dict"]) == {f"module.{k}" for k in timm_keys} | {"steps"}
    assert checkpoint["optimizer"]["state"], "no optimizer step was taken"


@pytest.mark.slow
def test_checkpoint_loads_in_validate_timm_and_backbone(mm, cls_root, trained):
    work, out = trained
    checkpoint = work / "epoch_1.pth"
    metrics = validate.main(["--model", "test_ppma", "--checkpoint", str(checkpoint), "--workers", "0",
                             "--data", str(cls_root / "data" / "shapes" / "classification" / "val"),
                             "--img-size", "64", "--crop-pct", "1.0"])
    assert metrics["images"] == 6 and metrics["images_per_s"] > 0
    # the last validation of training ran the same (EMA) weights on the same images; JPEG decoding
    # (cv2 there, PIL here) may flip at most one near-tie
    trained_top1 = float(re.findall(r"accuracy/top1: ([\d.]+)", out)[-1])
    assert abs(metrics["top1"] - trained_top1) <= 100 / 6 + 1e-6

    state = torch.load(checkpoint, map_location="cpu")["state_dict"]
    model = timm.create_model("test_ppma", pretrained=True, num_classes=3,
                              pretrained_cfg_overlay=dict(file=str(checkpoint), num_classes=3))
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key

    backbone = PyramidBackbone("test_ppma", init_cfg=dict(type="Pretrained", checkpoint=str(checkpoint)))
    backbone.init_weights()  # strict: only the head is dropped and the output norms kept
    for key, value in backbone.model.state_dict().items():
        if not key.startswith("out_norms."):
            assert torch.equal(value, state[key]), key


def test_fine_tuning_from_an_official_checkpoint(official_layout, tmp_path):
    official = official_layout.state_dict(**official_layout.CFG)  # 7 classes, PPMA's own names
    torch.save({"model": official}, tmp_path / "official.pth")
    init_cfg = dict(type="Pretrained", checkpoint=str(tmp_path / "official.pth"))
    init_default_scope("mmpretrain")  # not the scope another test left behind
    same = MODELS.build(dict(type="PresetClassifier", model_name="ppma_tiny", init_cfg=init_cfg, **official_layout.OURS))
    same.init_weights()
    assert torch.equal(same.model.stem.conv1.weight, official["patch_embed.proj.0.weight"])
    assert torch.equal(same.model.head.fc.weight, official["head.weight"])
    other = MODELS.build(dict(type="PresetClassifier", model_name="ppma_tiny", init_cfg=init_cfg,
                              **dict(official_layout.OURS, num_classes=5)))
    fresh = other.model.head.fc.weight.clone()
    other.init_weights()  # another class count: the classifier keeps its initialisation
    assert torch.equal(other.model.head.fc.weight, fresh)
    assert torch.equal(other.model.head.fc1.weight, official["proj.weight"])


@pytest.mark.slow
def test_distributed_gloo_run(mm, cls_root):
    work = cls_root / "work_dist"
    cmd = ["bash", mm.tools / "dist_train.sh", QUICK, "2", "--work-dir", work,
           "--cfg-options", "train_cfg.max_epochs=1", *FAST]
    out = check(mm.run(cmd, cls_root, env={"PORT": str(mm.free_port()), "OMP_NUM_THREADS": "1"}))
    assert "Distributed training: True" in out and "Epoch(train) [1][2/2]" in out  # 12 images, 2 x 4 a step
    assert "accuracy/top1" in out and (work / "epoch_1.pth").is_file()


def test_every_config_name_says_what_it_is():
    for path in CONFIGS:
        if path != QUICK:
            match = NAME.fullmatch(path.stem)
            assert match, f"{path.name}: not <preset>_<gpus>xb<batch>_<epochs>e_in1k"
            assert path.parent.name == family_of(match["preset"]).name


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_builds(path):
    cfg = Config.fromfile(str(path))
    assert cfg.custom_imports.imports == ["ppma.mm.classification"]
    preset = cfg.model.model_name
    if not timm.is_model(preset):
        pytest.skip(f"timm does not know the preset {preset!r} yet (its family is not registered)")
    init_default_scope(cfg.default_scope)
    with torch.device("meta"):  # the released sizes, without their memory and initialisation
        classifier = MODELS.build(cfg.model)
    assert classifier.model.num_classes == cfg.model.num_classes == cfg.data_preprocessor.num_classes
    assert "ClassCountCheckHook" in [h.type for h in cfg.custom_hooks]
    if path == QUICK:
        return
    name = NAME.fullmatch(path.stem)
    batch, optimizer = int(name["batch"]), cfg.optim_wrapper.optimizer
    assert preset == name["preset"] and 0.0 <= cfg.model.drop_path_rate < 1.0 and cfg.model.num_classes == 1000
    assert optimizer.lr > 0 and optimizer.weight_decay > 0 and optimizer.get("fused") is True
    assert cfg.train_dataloader.batch_size == batch and cfg.auto_scale_lr.base_batch_size == int(name["gpus"]) * batch
    assert cfg.train_cfg.max_epochs == int(name["epochs"])
    assert cfg.param_scheduler[-1].eta_min == pytest.approx(optimizer.lr / 100)
    assert {"Mixup", "CutMix"} == {a.type for a in cfg.model.train_cfg.augments}
    assert cfg.model.loss.label_smooth_val == 0.1 and cfg.val_evaluator.topk == (1, 5)
    assert 0 < next(h for h in cfg.custom_hooks if h.type == "EMAHook").momentum < 1e-3


def test_no_weight_decay_where_declared():
    cfg = Config.fromfile(str(QUICK))
    init_default_scope(cfg.default_scope)
    classifier = MODELS.build(cfg.model)
    wrapper = build_optim_wrapper(classifier, cfg.optim_wrapper)
    declared = {id(p) for p in no_weight_decay_parameters(classifier).values()}
    assert declared, "test_ppma declares no parameters without weight decay"
    for group in wrapper.optimizer.param_groups:
        no_decay = any(id(p) in declared for p in group["params"]) or group["params"][0].ndim <= 1
        assert group["weight_decay"] == (0.0 if no_decay else cfg.optim_wrapper.optimizer.weight_decay)


def test_missing_data_folder_fails(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nothing" / "train"))):
        train.main([str(QUICK), "--work-dir", str(tmp_path / "work"), "--cfg-options",
                    f"train_dataloader.dataset.data_root={tmp_path / 'nothing'}", *FAST])


def test_class_count_mismatch_fails(cls_root, tmp_path):
    data = cls_root / "data" / "shapes" / "classification"
    expected = "train_dataloader's data set has 3 classes but the model test_ppma has 4 outputs"
    with pytest.raises(ValueError, match=expected):
        train.main([str(QUICK), "--work-dir", str(tmp_path / "work"), "--cfg-options",
                    "model.num_classes=4", "data_preprocessor.num_classes=4",
                    f"train_dataloader.dataset.data_root={data}", f"val_dataloader.dataset.data_root={data}", *FAST])


def test_checkpoint_of_another_model_fails(cls_root, tmp_path):
    other = timm.create_model("test_ppma", num_classes=3, embed_dims=(16, 32, 48, 72))
    torch.save({"state_dict": other.state_dict()}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match=r"does not fit 'test_ppma': .*size mismatch for stages\.3") as err:
        train.main([str(QUICK), "--work-dir", str(tmp_path / "work"), "--cfg-options",
                    f"model.init_cfg.checkpoint={tmp_path / 'other.pth'}", "model.init_cfg.type=Pretrained",
                    *(f"{loader}.dataset.data_root={cls_root / 'data' / 'shapes' / 'classification'}"
                      for loader in ("train_dataloader", "val_dataloader")), *FAST])
    assert "\n" not in str(err.value)
