"""Renamed public names (docs/design.md, "Renamed names"): each old name still works, gives what
the new one gives and warns naming the new one; an old and a new keyword together are refused."""
import importlib

import pytest
import torch

import ppma  # noqa: F401  (registers the presets)
from ppma.layers import DecayGenerator, PolylineAttention
from ppma.models.ppma import PPMA
from ppma.models.skeleton import HierarchicalBackbone

ATTRIBUTES = [  # module, old name, new name
    ("ppma.layers", "GRIDS", "GRID_LAYOUTS"),
    ("ppma.layers.layout", "GRIDS", "GRID_LAYOUTS"),
    ("ppma.layers.polyline_attention", "KINDS", "ATTENTION_KINDS"),
    ("ppma.layers.mila", "MILAttention", "MILAAttention"),
]


@pytest.mark.parametrize("module, old, new", ATTRIBUTES)
def test_old_module_attribute_is_the_new_one_and_warns(module, old, new):
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{old} is renamed {module}\.{new}"):
        assert getattr(mod, old) is getattr(mod, new)
    with pytest.raises(AttributeError, match=f"module '{module}' has no attribute 'NOPE'"):
        mod.NOPE  # noqa: B018


def test_mm_read_checkpoint_is_read_checkpoint_or_url():
    checkpoint = pytest.importorskip("ppma.mm.checkpoint", reason="ppma.mm needs mmengine (the 'mm' extra)")
    with pytest.warns(DeprecationWarning, match="read_checkpoint is renamed .*read_checkpoint_or_url"):
        assert checkpoint.read_checkpoint is checkpoint.read_checkpoint_or_url


def small_ppma(**kwargs):
    return PPMA(embed_dims=(8, 16, 16, 16), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 2), head_hidden_dim=16, **kwargs)


@pytest.mark.parametrize("build, old, new, value", [
    (lambda **kw: PolylineAttention(8, 2, **kw), "grid", "token_layout", "3d"),
    (lambda **kw: PolylineAttention(8, 2, **kw), "mask_form", "form", "paper"),
    (lambda **kw: DecayGenerator(8, 2, **kw), "grid", "token_layout", "3d"),
    (small_ppma, "grid", "token_layout", "3d"),
    (small_ppma, "mask_form", "form", "paper"),
])
def test_old_keyword_builds_what_the_new_one_builds(build, old, new, value):
    torch.manual_seed(0)
    expected = build(**{new: value})
    torch.manual_seed(0)
    with pytest.warns(DeprecationWarning, match=rf"\({old}=\.\.\.\) is renamed .*\({new}=\.\.\.\)"):
        got = build(**{old: value})
    assert getattr(got, new) == value == getattr(expected, new)
    with pytest.warns(DeprecationWarning, match=rf"\.{old} is renamed .*\.{new}"):
        assert getattr(got, old) == value
    assert got.state_dict().keys() == expected.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(got.state_dict().values(), expected.state_dict().values()))
    with pytest.raises(TypeError, match=rf"pass {new}= only \({old}= is its deprecated name\)"):
        build(**{old: value, new: value})


def test_backbone_grid_keyword():
    with pytest.warns(DeprecationWarning, match=r"HierarchicalBackbone\(grid=\.\.\.\)"):
        model = HierarchicalBackbone([lambda dim: PolylineAttention(dim, 1, token_layout="3d")] * 4,
                                     embed_dims=(8, 8, 8, 8), depths=(1, 1, 1, 1), grid="3d")
    assert model.token_layout == model.input_layout == "3d"


OPS = ["cross_scan", "polyline_attention", "polyline_linear_attention", "polyline_mask", "polyline_scan",
       "selective_scan"]


@pytest.mark.parametrize("op", OPS)
def test_op_folder_at_its_old_path_serves_the_new_folder_and_leaves_the_function(op):
    """``ppma/ops/<op>/`` is ``ppma/ops/<op>_impl/``: ``from`` imports at the old path warn and give
    the new modules' objects, and ``ppma.ops.<op>`` stays the public function."""
    ops = importlib.import_module("ppma.ops")
    function = getattr(ops, op)
    new = importlib.import_module(f"ppma.ops.{op}_impl.reference")
    with pytest.warns(DeprecationWarning, match=rf"module ppma\.ops\.{op}\.reference is renamed ppma\.ops\.{op}_impl"):
        old = importlib.import_module(f"ppma.ops.{op}.reference")
        names = [n for n in vars(new) if n.endswith("_reference")]
        assert names and all(getattr(old, n) is getattr(new, n) for n in names)
    with pytest.warns(DeprecationWarning, match=rf"module ppma\.ops\.{op} is renamed ppma\.ops\.{op}_impl"):
        assert importlib.import_module(f"ppma.ops.{op}").op is importlib.import_module(f"ppma.ops.{op}_impl.op")
    assert getattr(ops, op) is function and callable(function)
    with pytest.raises(ModuleNotFoundError, match=rf"ppma\.ops\.{op}\.nothing"):
        importlib.import_module(f"ppma.ops.{op}.nothing")
