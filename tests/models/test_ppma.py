"""PPMA presets through timm: parameter counts, the timm 1.0 API, shapes, errors, precision."""
import pytest
import timm
import torch

import ppma  # noqa: F401
from ppma.layers import PolylineAttention

MICRO = dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), drop_path_rate=0.0)
PRESETS = ("ppma_tiny", "ppma_small", "ppma_base", "ppma_linear_tiny", "ppma_linear_small", "ppma_linear_base",
           "ppma_tiny_3d")


@pytest.fixture(autouse=True)
def torch_backend(monkeypatch):
    monkeypatch.setenv("PPMA_BACKEND", "torch")  # the Triton scan is tested in tests/kernels


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,expected", [
    ("ppma_tiny", 14_335_272), ("ppma_small", 26_969_472), ("ppma_base", 54_158_524),
    ("ppma_linear_tiny", 14_335_272), ("ppma_linear_small", 26_969_472), ("ppma_linear_base", 54_158_524),
    # 3-D: the decay generator has a third output (gamma): + head_dim per block
    ("ppma_tiny_3d", 14_335_272 + 2 * 16 + 2 * 32 + 8 * 32 + 2 * 32),
])
def test_parameter_counts_match_the_release(name, expected):
    with torch.device("meta"):
        model = timm.create_model(name)
    assert n_params(model) == expected


def test_presets_are_registered_with_pretrained_cfgs():
    assert set(PRESETS) <= set(timm.list_models("ppma_*"))
    cfg = timm.get_pretrained_cfg("ppma_tiny.in1k")
    assert cfg.url.endswith("PPMA_T_202502251000/best.pth") and cfg.classifier == "head.fc"
    assert timm.get_pretrained_cfg("ppma_tiny_3d").input_size == (3, 8, 224, 224)  # (C, T, H, W)


def test_tiny_test_preset():
    torch.manual_seed(0)
    model = timm.create_model("test_ppma").eval()
    assert n_params(model) < 300_000 and [s.blocks[0].mixer.kind for s in model.stages] == [
        "criss_cross", "criss_cross", "vanilla", "vanilla"]
    cfg = model.pretrained_cfg
    x = torch.randn(1, *cfg["input_size"])
    with torch.no_grad():
        assert model.forward_features(x).shape == (1, model.num_features, *cfg["pool_size"])
        assert model(x).shape == (1, 1000) and model.head_hidden_size == 128
        unpooled = timm.create_model("test_ppma", num_classes=0, global_pool="").eval()
        assert unpooled(x).shape == (1, 128, *cfg["pool_size"])


def test_frozen_modules_of_a_features_model():
    model = timm.create_model("test_ppma", features_only=True, out_indices=(1, 3)).model
    assert model.frozen_modules(2) == [model.stem, model.stages[0], model.stages[1], model.out_norms["1"]]


def test_kind_and_form_overrides_reach_every_layer():
    kinds = ("linear", "criss_cross", "vanilla", "linear")
    model = timm.create_model("ppma_tiny", **MICRO, attn_kinds=kinds, form="paper")
    attns = [[m for m in stage.modules() if isinstance(m, PolylineAttention)] for stage in model.stages]
    assert [a[0].kind for a in attns] == ["linear", "criss_cross", "vanilla", "linear"]
    assert all(a.form == (None if a.kind == "linear" else "paper") for stage in attns for a in stage)
    with torch.device("meta"):
        assert timm.create_model("ppma_small").stages[2].blocks[0].mixer.kind == "criss_cross"




def test_features_only_out_indices_and_no_head():
    model = timm.create_model("ppma_tiny", features_only=True, out_indices=(1, 2), **MICRO)
    assert sorted(model.model.out_norms) == ["1", "2"]
    assert model.model.head is None and len(model.model.stages) == 3
    feats = model(torch.randn(2, 3, 64, 64))
    assert [f.shape[1] for f in feats] == [32, 64]
    classifier = timm.create_model("ppma_tiny", **MICRO)
    assert n_params(model) < n_params(classifier)  # no head; out norms only on stages 1-2






@pytest.mark.parametrize("name", ["ppma_tiny", "ppma_linear_tiny"])
def test_gradients_reach_the_decay_parameters(name):
    model = timm.create_model(name, **MICRO)
    model(torch.randn(2, 3, 32, 48)).logsumexp(-1).sum().backward()
    for n, p in model.named_parameters():
        if ".decay." in n:
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


def test_no_weight_decay_names_the_decay_parameters():
    model = timm.create_model("ppma_tiny", **MICRO)
    assert model.no_weight_decay() == {n for n, _ in model.named_parameters() if n.endswith(("dt_bias", "A_log"))}
    assert len(model.no_weight_decay()) == 2 * sum(MICRO["depths"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_forward_backward_of_the_linear_kind_without_nan(dtype):
    """The linear kind under autocast (test_family.py runs test_ppma's criss-cross and vanilla)."""
    # narrow: depthwise convs in bf16/fp16 take a slow per-channel path on CPU
    narrow = dict(MICRO, embed_dims=(8, 16, 16, 32), num_heads=(1, 2, 2, 4), mlp_ratios=1)
    model = timm.create_model("ppma_tiny", **narrow, attn_kinds=("linear",) * 4)
    with torch.autocast("cpu", dtype=dtype):
        out = model(torch.randn(2, 3, 32, 48))
    assert torch.isfinite(out).all()
    out.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_3d_model_features_and_logits():
    model = timm.create_model("ppma_tiny_3d", **MICRO, num_classes=3).eval()
    x = torch.randn(1, 3, 3, 64, 96)
    with torch.no_grad():
        assert model(x).shape == (1, 3)
        _, feats = model.forward_intermediates(x)
    for i, f in enumerate(feats):
        assert f.shape == (1, 16 * 2**i, 3, 16 // 2**i, 24 // 2**i)
    feats_model = timm.create_model("ppma_linear_tiny", **MICRO, token_layout="3d", features_only=True).eval()
    assert feats_model(torch.randn(1, 3, 2, 32, 32))[0].shape == (1, 16, 2, 8, 8)


@pytest.mark.parametrize("x,message", [
    (torch.randn(1, 4, 64, 64), "4 channels"),
    (torch.randn(3, 64, 64), "rank-3"),
    (torch.randn(1, 3, 2, 64, 64), "rank-5"),
    (torch.randn(1, 3, 16, 64), "too small"),
])
def test_bad_inputs_raise(x, message):
    model = timm.create_model("ppma_tiny", **MICRO).eval()
    with pytest.raises(ValueError, match=message):
        model(x)


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="attn_kinds"):
        timm.create_model("ppma_tiny", **MICRO, attn_kinds=("vanilla", "window", "vanilla", "vanilla"))
    with pytest.raises(ValueError, match="num_heads"):
        timm.create_model("ppma_tiny", **dict(MICRO, num_heads=(1, 2, 4)))
    with pytest.raises(TypeError, match="window_size"):
        timm.create_model("ppma_tiny", **MICRO, window_size=7)
