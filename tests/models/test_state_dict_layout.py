"""Every family's state dict holds contiguous tensors, whatever layout a parameter is stored in for
speed (``ppma.layers.conv.channels_last_weight``), so ``safetensors`` saves it and it loads back."""
from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file

from ppma.models.family import families


@pytest.mark.parametrize("family", families(), ids=lambda f: f.name)
def test_state_dict_is_contiguous_and_round_trips_through_safetensors(family, tmp_path):
    model = timm.create_model(family.test_preset)
    state = model.state_dict()
    assert all(t.is_contiguous() for t in state.values())
    save_file(state, tmp_path / "weights.safetensors")
    loaded = timm.create_model(family.test_preset)
    loaded.load_state_dict(load_file(tmp_path / "weights.safetensors"))
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, state[key]), key
