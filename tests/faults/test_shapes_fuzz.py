"""Random input sizes (odd, H != W) and batch sizes through every test preset: forward and
backward finite; features_only maps of the hierarchical families at ceil(size / stride) (the
plain Vim's maps follow its patch grid, floor((size - patch) / stride) + 1: checked finite)."""
import math
import random

import pytest
import timm
import torch

import ppma  # noqa: F401  (registers the presets)
from ppma.models.family import package_models
from ppma.models.skeleton import HierarchicalBackbone

PRESETS = [name for name in package_models() if name.startswith("test_")]
DRAWS = 1


def draws(name):
    rng = random.Random(f"fuzz-{name}")
    for _ in range(DRAWS):
        h = rng.randrange(32, 258)
        w = rng.choice([s for s in range(32, 258) if s != h])
        yield rng.randint(1, 3), h, w


@pytest.mark.parametrize("name", PRESETS)
def test_random_shapes_forward_backward(name):
    model = timm.create_model(name, num_classes=5)
    features = timm.create_model(name, features_only=True)
    hierarchical = isinstance(model, HierarchicalBackbone)
    for batch, h, w in draws(name):
        x = torch.randn(batch, 3, h, w, requires_grad=True)
        out = model(x)
        assert out.shape == (batch, 5) and torch.isfinite(out).all(), (batch, h, w)
        out.square().mean().backward()
        assert torch.isfinite(x.grad).all(), (batch, h, w)
        maps = features(torch.randn(batch, 3, h, w))
        for f, stride in zip(maps, features.feature_info.reduction()):
            assert f.shape[0] == batch and torch.isfinite(f).all()
            assert not hierarchical or f.shape[-2:] == (math.ceil(h / stride), math.ceil(w / stride)), (name, h, w, stride, f.shape)
