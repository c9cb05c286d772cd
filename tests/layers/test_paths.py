"""ppma.layers.paths: each per-device arrangement computes the same function, outputs and gradients."""
import copy

import pytest
import timm
import torch

import ppma  # noqa: F401  (registers the presets)
from ppma.layers.paths import CPU_PATHS, GPU_PATHS, paths_for, use_paths_of

PRESETS = ["test_mila", "test_ppma", "test_vmamba"]  # the families whose layers ask paths_for


def run(model, x, kind, grad):
    torch.manual_seed(1)  # the same drop-path draws
    with use_paths_of(kind), torch.set_grad_enabled(grad):
        out = model(x)
        if grad:
            out.sum().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("mode, batch", [("train", 2), ("eval", 1)])
def test_arrangements_agree(name, mode, batch):
    torch.manual_seed(0)
    base = getattr(timm.create_model(name, drop_path_rate=0.1), mode)()
    x = torch.randn(batch, 3, 37, 45)  # odd grids, H != W
    (want, want_grads), (got, got_grads) = (run(copy.deepcopy(base), x, kind, grad=True) for kind in ("cpu", "gpu"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    scale = max(g.abs().max().item() for g in want_grads.values())
    for key, g in want_grads.items():  # against the largest gradient: a bias before a train-mode BN has ~0
        torch.testing.assert_close(got_grads[key], g, rtol=1e-4, atol=1e-5 * scale, msg=key)
    if mode == "eval":  # CPU inference (in place where autograd records nothing) against the other
        (cpu, _), (gpu, _) = (run(base, x, kind, grad=False) for kind in ("cpu", "gpu"))
        torch.testing.assert_close(cpu, gpu, rtol=1e-5, atol=1e-5 * gpu.abs().max().item())


def test_one_value_sets_every_layout_choice():
    for name in ("qk_channels_first", "conv1x1_as_linear", "fold_conv_residual", "channels_last_stem",
                 "update_views_in_place"):
        assert getattr(CPU_PATHS, name) is True and getattr(GPU_PATHS, name) is False, name


def test_paths_follow_device_and_grad_mode():
    assert paths_for("cuda") is GPU_PATHS and paths_for(torch.device("meta")) is GPU_PATHS
    assert paths_for("cpu") is GPU_PATHS  # autograd records: the training arrangement
    with torch.no_grad():
        assert paths_for("cpu") is CPU_PATHS
        with use_paths_of("cuda"):
            assert paths_for("cpu") is GPU_PATHS
        assert paths_for("cpu") is CPU_PATHS
    with pytest.raises(ValueError, match="unknown device kind 'tpu'"), use_paths_of("tpu"):
        pass
