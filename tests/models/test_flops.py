"""FLOP formulas of the registered ops against hand counts, and the counter that applies them."""
import pytest
import timm
import torch
from torch import nn

import ppma  # noqa: F401
from ppma.ops import polyline_attention
from ppma.ops.registry import get_op

pytest.importorskip("fvcore", reason="FLOP counting needs fvcore (the 'test' extra)")
from ppma.models.flops import count_flops, flop_analysis, total_flops  # noqa: E402

# Shapes of the hand counts: B=1, heads=2, grid 3x4 (N=12), q/k with d=5 channels, v with dv=3.
Q, V, DECAY = (1, 2, 3, 4, 5), (1, 2, 3, 4, 3), (1, 2, 3, 4)


def attention_flops(kind, form, grid=(3, 4)):
    q, v, d = (1, 2, *grid, 5), (1, 2, *grid, 3), (1, 2, *grid)
    return get_op("polyline_attention").flops(q, q, v, d, d, d if len(grid) == 3 else None, kind, form)


def test_polyline_scan_formula():
    # 3 FLOPs per element of x (1*2*3*4*5 = 120), per grid axis (2), per path order (2 for 'both')
    flops = get_op("polyline_scan").flops
    assert flops(Q, DECAY, DECAY, "both", None) == {"scan": 120 * 2 * 2 * 3}
    assert flops(Q, DECAY, DECAY, "v2h", None) == {"scan": 720}
    x3, d3 = (1, 1, 2, 3, 4, 2), (1, 1, 2, 3, 4)  # 48 elements, 3 axes
    assert flops(x3, d3, d3, "h2v", d3) == {"scan": 48 * 3 * 3}


def test_polyline_mask_formula():
    # per (B, head), N = 12: 1-D log masks, 2 FLOPs per entry: 4 lines of 3x3 (columns, 72) and
    # 3 rows of 4x4 (96); their sum N*H*W = 144 entries; exp 144; 'both' adds the transpose, 144
    flops = get_op("polyline_mask").flops
    assert flops(DECAY, DECAY, "both", None) == {"mask": 2 * (72 + 96 + 144 + 144 + 144)}
    assert flops(DECAY, DECAY, "v2h", None) == {"mask": 2 * (72 + 96 + 144 + 144)}
    # 3-D 2x3x4, N = 24: 2*N*(2+3+4) = 432, W and H masks summed per frame 24*12 = 288, + T: 576
    d3 = (1, 1, 2, 3, 4)
    assert flops(d3, d3, "h2v", d3) == {"mask": 432 + 288 + 576 + 576}


def test_vanilla_attention_formula():
    # per head: q k^T 12*12*5 = 720 and weights x v 12*12*3 = 432 multiply-adds; log mask 312
    # (see the mask test); official: 2 adds, 2 softmax, 2 halvings, 1 sum over 144 weights
    assert attention_flops("vanilla", "official") == {"products": 2 * 1152, "elementwise": 2 * (312 + 7 * 144)}
    # paper: exp, L + L^T, softmax, product with the mask
    assert attention_flops("vanilla", "paper") == {"products": 2 * 1152, "elementwise": 2 * (312 + 4 * 144)}


def test_criss_cross_attention_formula():
    # per head: 1-D weights along H, 4 lines of 3x3 = 36, and along W, 3 lines of 4x4 = 48: 84.
    # q k^T: 84 * 5 = 420; weights x v in both path orders: 2 * 84 * 3 = 504 (924 in all). Per
    # weight: 1-D log mask 2, softmax 1 and the mask add 1 (official) or exp and product 2
    # (paper); averaging the two orders: 3 * N * dv = 108
    assert attention_flops("criss_cross", "official") == {"products": 2 * 924, "elementwise": 2 * (84 * 4 + 108)}
    assert attention_flops("criss_cross", "paper") == {"products": 2 * 924, "elementwise": 2 * (84 * 5 + 108)}


class _Attend(nn.Module):
    def forward(self, q, k, v, log_alpha, log_beta):
        return polyline_attention(q, k, v, log_alpha, log_beta, kind="criss_cross")


def test_counter_applies_the_formula_to_the_traced_op():
    inputs = [torch.randn(Q), torch.randn(Q), torch.randn(V), -torch.rand(DECAY), -torch.rand(DECAY)]
    analysis = flop_analysis(_Attend(), inputs)
    want = {"polyline_attention.products": 2 * 924, "polyline_attention.elementwise": 2 * 444}
    assert dict(analysis.by_operator()) == want
    assert analysis.total() == 2 * (924 + 444)
    assert total_flops(analysis, exclude_terms=("products",)) == 2 * 444


@pytest.fixture
def torch_backend(monkeypatch):
    monkeypatch.setenv("PPMA_BACKEND", "torch")


def test_models_are_counted_through_their_ops(torch_backend):
    micro = dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))
    x = torch.zeros(1, 3, 64, 64)
    vanilla = flop_analysis(timm.create_model("ppma_tiny", **micro), x)
    ops = vanilla.by_operator()
    assert ops["polyline_attention.products"] > 0 and ops["polyline_attention.elementwise"] > 0
    assert not any(key.startswith(("softmax", "polyline_scan")) for key in ops), ops
    without = count_flops(timm.create_model("ppma_tiny", **micro), (1, 3, 64, 64), exclude_terms=("products",))
    assert without == vanilla.total() - ops["polyline_attention.products"]
    linear = flop_analysis(timm.create_model("ppma_linear_tiny", **micro), x).by_operator()
    assert linear["polyline_linear_attention.scan"] > 0 and not any(key.startswith("polyline_attention") for key in linear)
