"""The README's one-line loader (``timm.create_model(name, pretrained=True,
pretrained_cfg_overlay=dict(file=PATH))``) and ``read_checkpoint`` with a bad file, for every
family: a missing file, random bytes, a truncated file and a pickle that needs a global not
allowed each raise an error that names the file and the problem."""
import pickle
import random
import re

import pytest
import timm
import torch

from ppma.models.checkpoint import read_checkpoint
from ppma.models.family import families

PRESETS = [family.test_preset for family in families()]


class Trainer:
    """Something a training script pickled beside the weights (not a weights-only type)."""


def one_line(name: str):
    return lambda path: timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))


def loaders(name: str):
    return [read_checkpoint, one_line(name)]


@pytest.mark.parametrize("name", PRESETS)
def test_missing_file(name, tmp_path):
    path = tmp_path / "nowhere" / "best.pth"
    for load in loaders(name):
        with pytest.raises(FileNotFoundError, match=f"checkpoint not found: {re.escape(str(path))}$"):
            load(path)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bytes(name, seed, tmp_path):
    path = tmp_path / "best.pth"
    path.write_bytes(random.Random(seed).randbytes(1000))
    for load in loaders(name):
        with pytest.raises(ValueError, match=f"cannot read checkpoint {re.escape(str(path))}: truncated or not a "
                                             "checkpoint") as err:
            load(path)
        assert "trust" not in str(err.value) and "weights_only" not in str(err.value)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("legacy", [False, True])
def test_truncated_file(name, legacy, tmp_path):
    path = tmp_path / "best.pth"
    torch.save({"model": timm.create_model(name).state_dict()}, path, _use_new_zipfile_serialization=not legacy)
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    for load in loaders(name):
        with pytest.raises(ValueError, match=f"cannot read checkpoint {re.escape(str(path))}: truncated or not a "
                                             "checkpoint"):
            load(path)


@pytest.mark.parametrize("name", PRESETS)
def test_a_pickle_that_needs_a_global(name, tmp_path):
    path = tmp_path / "best.pth"
    torch.save({"model": timm.create_model(name).state_dict(), "trainer": Trainer()}, path)
    for load in loaders(name):
        with pytest.raises(pickle.UnpicklingError, match=f"checkpoint {re.escape(str(path))} needs "
                                                         rf"{__name__}\.Trainer, which weights-only loading does "
                                                         r"not allow.*add_safe_globals\(\[") as err:
            load(path)
        assert "import ppma.mm" in str(err.value)
    with torch.serialization.safe_globals([Trainer]):  # the documented way, once trusted
        model = one_line(name)(path)
        saved = read_checkpoint(path)["model"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
