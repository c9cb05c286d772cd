"""FLOPs at 224x224 against the paper (fvcore, with the attention/mask ops counted)."""
import pytest
import timm
import torch

import ppma  # noqa: F401
from ppma.models.ppma import PRESETS

pytest.importorskip("fvcore", reason="FLOP counting needs fvcore (the 'test' extra)")
from ppma.models.flops import count_flops, flop_analysis  # noqa: E402

PAPER = {"ppma_tiny": 2.7e9, "ppma_small": 4.9e9, "ppma_base": 10.6e9}


@pytest.fixture(autouse=True)
def torch_backend(monkeypatch):
    monkeypatch.setenv("PPMA_BACKEND", "torch")


def extrapolated_flops(name, size=224, **kwargs):
    """FLOPs of preset ``name`` from a copy with one block per stage: blocks of a stage are
    identical, so each further block adds that stage's block FLOPs."""
    depths = kwargs.pop("depths", PRESETS[name]["depths"])
    analysis = flop_analysis(timm.create_model(name, depths=(1,) * 4, **kwargs), torch.zeros(1, 3, size, size))
    per_block = analysis.by_module()
    return analysis.total() + sum((d - 1) * per_block[f"stages.{s}.blocks.0"] for s, d in enumerate(depths))


def test_extrapolation_is_exact():
    micro = dict(embed_dims=(16, 32, 64, 128), num_heads=(1, 2, 4, 8), layerscale=(False, True, False, True))
    depths = (2, 1, 3, 2)
    assert extrapolated_flops("ppma_tiny", 64, depths=depths, **micro) == count_flops(
        timm.create_model("ppma_tiny", depths=depths, **micro), (1, 3, 64, 64))


@pytest.mark.parametrize("name", ["ppma_tiny", "ppma_small", "ppma_base"])
def test_flops_at_224_match_the_paper(name):
    flops = extrapolated_flops(name)
    assert abs(flops / PAPER[name] - 1) < 0.05, flops


def test_attention_mask_and_scan_ops_are_counted():
    from fvcore.nn import FlopCountAnalysis

    micro = dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))
    x = torch.zeros(1, 3, 64, 64)
    vanilla = timm.create_model("ppma_tiny", **micro).eval()
    ops = flop_analysis(vanilla, x).by_operator()
    assert ops["softmax"] > 0 and ops["cumsum"] > 0
    plain = FlopCountAnalysis(vanilla, x).unsupported_ops_warnings(False)
    assert flop_analysis(vanilla, x).total() > plain.total()
    linear = flop_analysis(timm.create_model("ppma_linear_tiny", **micro), x).by_operator()
    assert linear["polyline_scan"] > 0 and "softmax" not in linear
