"""Reading checkpoint files and finding the model's tensors in every accepted layout."""
import argparse
import pickle

import pytest
import torch
from safetensors.torch import save_file

import ppma.models.ppma
from ppma.models.checkpoint import model_state_dict, read_checkpoint
from ppma.models.family import family_of, package_models

WEIGHTS = {"stem.conv1.weight": torch.randn(2, 3), "head.fc.bias": torch.randn(4)}


@pytest.mark.parametrize("layout", ["plain", "model", "models", "state_dict", "ddp", "segmentor"])
def test_model_state_dict_finds_the_weights(layout):
    wrapped = {
        "plain": WEIGHTS,
        "model": {"model": WEIGHTS, "epoch": 3},
        "models": {"models": WEIGHTS, "optimizer": {"state": {}}, "args": argparse.Namespace(lr=1)},
        "state_dict": {"state_dict": WEIGHTS, "meta": {}},
        "ddp": {"model": {f"module.{k}": v for k, v in WEIGHTS.items()}},
        "segmentor": {"state_dict": {**{f"backbone.model.{k}": v for k, v in WEIGHTS.items()},
                                     "decode_head.conv_seg.weight": torch.randn(3)}},
    }[layout]
    state = model_state_dict(wrapped)
    assert state.keys() == WEIGHTS.keys()
    for k, v in WEIGHTS.items():
        assert state[k] is v


def test_model_state_dict_rejects_what_holds_no_weights():
    with pytest.raises(ValueError, match="holds no tensors"):
        model_state_dict({"epoch": 3, "args": argparse.Namespace()})
    with pytest.raises(ValueError, match="must be a dict"):
        model_state_dict([torch.ones(1)])


@pytest.mark.parametrize("allowed_before", [False, True])
def test_read_checkpoint_allows_namespace_and_keeps_the_allow_list(tmp_path, allowed_before):
    path = tmp_path / "best.pth"
    torch.save({"models": WEIGHTS, "args": argparse.Namespace(model="PPMAViT_T")}, path)
    if allowed_before:
        torch.serialization.add_safe_globals([argparse.Namespace])
    try:
        checkpoint = read_checkpoint(path)
        assert checkpoint["args"].model == "PPMAViT_T"
        assert (argparse.Namespace in torch.serialization.get_safe_globals()) == allowed_before
    finally:
        torch.serialization._weights_only_unpickler._remove_safe_globals([argparse.Namespace])


class Foreign:  # any class torch does not allow
    pass


def test_read_checkpoint_refuses_other_objects_and_reads_safetensors(tmp_path):
    torch.save({"model": WEIGHTS, "extra": Foreign()}, tmp_path / "bad.pth")
    with pytest.raises(pickle.UnpicklingError, match="Foreign"):
        read_checkpoint(tmp_path / "bad.pth")
    save_file(WEIGHTS, tmp_path / "w.safetensors")
    state = read_checkpoint(tmp_path / "w.safetensors")
    torch.testing.assert_close(state, WEIGHTS)
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        read_checkpoint(tmp_path / "missing.pth")


def test_family_is_found_by_the_model_name():
    assert family_of("ppma_small") is family_of("test_ppma")
    assert family_of("ppma_small").model_class is ppma.models.ppma.PPMA
    assert family_of("ppma_linear_tiny").checkpoint_filter_fn is ppma.models.ppma.checkpoint_filter_fn
    assert family_of("ppma_tiny_3d").checkpoint_model_kwargs is ppma.models.ppma.checkpoint_model_kwargs
    assert {"ppma_tiny", "test_ppma"} <= set(package_models()) and "resnet18" not in package_models()


def test_family_lookup_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown model 'ppma_huge'; the models of this package: .*ppma_tiny"):
        family_of("ppma_huge")
    with pytest.raises(ValueError, match="'resnet18' is a timm model of timm.models.resnet, not a model of this package"):
        family_of("resnet18")


def test_model_state_dict_takes_ema_weights_unless_told_not_to():
    ema = {k: v + 1 for k, v in WEIGHTS.items()}
    for key in ("model_ema", "state_dict_ema"):
        checkpoint = {"model": WEIGHTS, key: ema, "epoch": 3}
        assert all(model_state_dict(checkpoint)[k] is v for k, v in ema.items())
        assert all(model_state_dict(checkpoint, use_ema=False)[k] is v for k, v in WEIGHTS.items())
    assert all(model_state_dict({"model": WEIGHTS})[k] is v for k, v in WEIGHTS.items())  # no EMA: the model


def test_read_checkpoint_allows_the_yacs_config_of_official_mlla_checkpoints(tmp_path, monkeypatch):
    try:
        from yacs.config import CfgNode
    except ImportError:  # an equivalent class under the same module path
        import sys
        import types

        CfgNode = type("CfgNode", (dict,), {"__module__": "yacs.config"})
        module = types.ModuleType("yacs.config")
        module.CfgNode = CfgNode
        monkeypatch.setitem(sys.modules, "yacs", types.ModuleType("yacs"))
        monkeypatch.setitem(sys.modules, "yacs.config", module)
    config = CfgNode()
    config["MODEL"] = CfgNode({"NAME": "mlla_tiny", "DROP_PATH_RATE": 0.2})
    config["TRAIN"] = CfgNode({"EPOCHS": 300, "STEPS": [1, 2]})
    path = tmp_path / "ckpt_epoch_299.pth"
    torch.save({"model": WEIGHTS, "config": config, "epoch": 299}, path)
    before = set(torch.serialization.get_safe_globals())  # a set: its order is not kept
    checkpoint = read_checkpoint(path)
    assert set(torch.serialization.get_safe_globals()) == before
    assert checkpoint["config"] == {"MODEL": {"NAME": "mlla_tiny", "DROP_PATH_RATE": 0.2},
                                    "TRAIN": {"EPOCHS": 300, "STEPS": [1, 2]}}
    assert model_state_dict(checkpoint).keys() == WEIGHTS.keys()
    with pytest.raises(pickle.UnpicklingError, match="CfgNode"):  # only while ppma reads a checkpoint
        torch.load(path, weights_only=True)
