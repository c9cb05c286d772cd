"""ppma.mm.PyramidBackbone: features, registries, freezing, checkpoints, errors."""
import argparse
import math

import numpy as np
import pytest
import torch

pytest.importorskip("mmdet", reason="mmdet is not installed (pip install 'ppma[mm]'); CI installs it")
import timm  # noqa: E402

from ppma.mm import PyramidBackbone  # noqa: E402


@pytest.fixture
def build(mm):
    def make(**kwargs):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, ())))
        return PyramidBackbone(model_name="ppma_tiny", **{**mm.micro, "drop_path_rate": 0.0, **kwargs})
    return make


def test_multiscale_features_at_odd_size(build):
    x = torch.randn(1, 3, 67, 93)
    feats = build()(x)
    assert len(feats) == 4
    for i, (f, c) in enumerate(zip(feats, (16, 32, 64, 128))):
        s = 4 * 2**i
        assert f.shape == (1, c, math.ceil(67 / s), math.ceil(93 / s))
        assert torch.isfinite(f).all()
    picked = build(out_indices=(1, 3))
    assert picked.channels == (32, 128)
    assert [f.shape[1] for f in picked(x)] == [32, 128]
    assert sorted(picked.model.out_norms) == ["1", "3"]


@pytest.mark.parametrize("package", ["mmdet", "mmseg"])
def test_registered_in_both_registries(mm, package):
    registry = pytest.importorskip(f"{package}.registry", reason=f"{package} is not installed").MODELS
    model = registry.build(dict(type="PyramidBackbone", model_name="ppma_tiny", **mm.micro))
    assert isinstance(model, PyramidBackbone)
    assert registry.get("PPMA") is None  # no family-named alias


def test_frozen_stages(build):
    model = build(frozen_stages=2).train()
    frozen = ("stem.", "stages.0.", "stages.1.", "out_norms.0.", "out_norms.1.")
    for name, p in model.model.named_parameters():
        assert p.requires_grad == (not name.startswith(frozen)), name
    assert not model.model.stem.training and not model.model.stages[1].training
    assert model.model.stages[2].training
    sum(f.sum() for f in model(torch.randn(1, 3, 64, 64))).backward()
    assert model.model.stem.conv1.weight.grad is None
    assert model.model.stages[2].blocks[0].mixer.q_proj.weight.grad is not None


def test_norm_eval_keeps_batchnorm_in_eval(build):
    model = build(norm_eval=True).train()
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns)
    assert model.model.stages[0].blocks[0].norm1.training


def test_gradient_checkpointing_gives_the_same_gradients(build):
    plain = build()
    checkpointed = build(with_cp=True)
    checkpointed.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, 64, 80)
    grads = []
    for model in (plain, checkpointed):
        model.train()
        model.zero_grad()
        sum(f.square().mean() for f in model(x)).backward()
        grads.append(model.model.stages[1].blocks[0].mixer.q_proj.weight.grad)
    assert checkpointed.model.stages[0].grad_checkpointing
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-6)


def test_unknown_backbone_argument_is_named(mm):
    from mmdet.registry import MODELS

    with pytest.raises(TypeError, match="bogus_width"):
        MODELS.build(dict(type="PyramidBackbone", model_name="ppma_tiny", bogus_width=3, **mm.micro))


def test_bad_arguments(build):
    with pytest.raises(ValueError, match="'resnet18' is a timm model of timm.models.resnet, not a model of this package"):
        PyramidBackbone(model_name="resnet18")
    with pytest.raises(ValueError, match="frozen_stages"):
        build(frozen_stages=5)
    with pytest.raises(ValueError, match="init_cfg"):
        build(init_cfg=dict(type="Kaiming"))


def classifier(mm, **kwargs):
    return timm.create_model("ppma_tiny", **{**mm.micro, **kwargs})


def test_loads_a_classification_checkpoint(mm, build, tmp_path):
    source = classifier(mm)
    path = tmp_path / "best.pth"
    # as the official training script writes it: model, args (a Namespace), numpy scalars
    torch.save({"model": source.state_dict(), "args": argparse.Namespace(lr=1e-3),
                "max_accuracy": np.float64(0.5)}, path)
    model = build(init_cfg=dict(type="Pretrained", checkpoint=str(path)))
    norms_before = {k: v.clone() for k, v in model.model.state_dict().items() if k.startswith("out_norms")}
    model.init_weights()
    state = model.model.state_dict()
    for key, value in source.state_dict().items():
        if not key.startswith("head."):
            torch.testing.assert_close(state[key], value, rtol=0, atol=0, msg=key)
    for key, value in norms_before.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0)
    assert sorted(model.load_checkpoint(str(path))) == sorted(norms_before)


def test_loads_our_detector_checkpoint_and_safetensors(mm, build, tmp_path):
    from safetensors.torch import save_file

    trained = build()
    state = {f"backbone.{k}": v for k, v in trained.state_dict().items()}
    state["neck.lateral_convs.0.conv.weight"] = torch.zeros(1)
    torch.save({"state_dict": state, "meta": {"iter": np.int64(1)}}, tmp_path / "iter_1.pth")
    save_file(classifier(mm).state_dict(), str(tmp_path / "converted.safetensors"))
    for name in ("iter_1.pth", "converted.safetensors"):
        model = build()
        kept = model.load_checkpoint(str(tmp_path / name))
        if name == "iter_1.pth":
            assert kept == []
            for key, value in trained.state_dict().items():
                torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0)
        else:
            assert kept and all(k.startswith("out_norms.") for k in kept)


def test_mismatched_checkpoints_name_the_keys(mm, build, tmp_path):
    good = classifier(mm).state_dict()
    cases = {
        "wider": (classifier(mm, embed_dims=(24, 32, 64, 128)).state_dict(),
                  r"size mismatch for stem\.conv1\.weight"),
        "extra": ({**good, "stages.0.blocks.0.extra.weight": torch.zeros(2)},
                  r"stages\.0\.blocks\.0\.extra\.weight"),
        "missing": ({k: v for k, v in good.items() if "stages.1.downsample.conv" not in k},
                    r"stages\.1\.downsample\.conv\.weight"),
    }
    for name, (state, pattern) in cases.items():
        torch.save({"model": state}, tmp_path / f"{name}.pth")
        with pytest.raises(ValueError, match=pattern):
            build(init_cfg=dict(type="Pretrained", checkpoint=str(tmp_path / f"{name}.pth"))).init_weights()
    with pytest.raises(FileNotFoundError):
        build().load_checkpoint(str(tmp_path / "absent.pth"))


def test_loads_an_official_classification_checkpoint(mm, tmp_path, official_layout):
    official = official_layout.state_dict(**official_layout.CFG)
    torch.save({"model": official, "args": argparse.Namespace(model="PPMA_T")}, tmp_path / "best.pth")
    cfg = {k: v for k, v in official_layout.OURS.items() if k != "num_classes"}
    model = PyramidBackbone(model_name="ppma_tiny", init_cfg=dict(type="Pretrained", checkpoint=str(tmp_path / "best.pth")), **cfg)
    model.init_weights()
    state = model.model.state_dict()
    torch.testing.assert_close(state["stem.conv1.weight"], official["patch_embed.proj.0.weight"], rtol=0, atol=0)
    torch.testing.assert_close(state["stages.2.blocks.0.mixer.decay.A_log"],
                               official["layers.2.blocks.0.retention.path_embed.A_log"], rtol=0, atol=0)
    torch.testing.assert_close(state["stages.3.blocks.0.ls1.gamma"],
                               official["layers.3.blocks.0.gamma_1"].reshape(-1), rtol=0, atol=0)
    x = torch.randn(1, 3, 64, 64)
    assert all(torch.isfinite(f).all() for f in model.eval()(x))
