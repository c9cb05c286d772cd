"""Layer-wise lr decay ids come from the models' group_matcher, as the BEiT-style rule says: every
family's test preset, by its kind (hierarchical stages, or plain blocks)."""
import pytest
import timm

pytest.importorskip("mmengine")
from ppma.mm.optim import block_layer_ids  # noqa: E402
from ppma.models.family import families  # noqa: E402
from ppma.models.skeleton import HierarchicalBackbone  # noqa: E402

HIERARCHICAL = [f.test_preset for f in families() if issubclass(f.model_class, HierarchicalBackbone)]
PLAIN = [f.test_preset for f in families() if f.test_preset not in HIERARCHICAL]


@pytest.mark.parametrize("name", HIERARCHICAL)
def test_hierarchical_layer_ids(name):
    model = timm.create_model(name, depths=(2, 1, 3, 1), output_norms=[1, 3], with_head=False)
    ids, total = block_layer_ids(model)
    assert total == 7
    assert ids.keys() == dict(model.named_parameters()).keys()
    expected_block = {(0, 0): 1, (0, 1): 2, (1, 0): 3, (2, 0): 4, (2, 1): 5, (2, 2): 6, (3, 0): 7}
    for param, lid in ids.items():
        parts = param.split(".")
        if parts[0] == "stem":
            assert lid == 0, param
        elif parts[0] == "stages" and parts[2] == "blocks":
            assert lid == expected_block[int(parts[1]), int(parts[3])], param
        elif parts[0] == "stages" and parts[2] == "downsample":  # with the stage's first block
            assert lid == expected_block[int(parts[1]), 0], param
        else:  # output norms
            assert parts[0] == "out_norms" and lid == 8, param


@pytest.mark.parametrize("name", PLAIN)
def test_plain_layer_ids(name):
    model = timm.create_model(name, depth=5, pyramid=True)
    ids, total = block_layer_ids(model)
    assert total == 5
    for param, lid in ids.items():
        parts = param.split(".")
        if parts[0] == "stem":
            assert lid == 0, param
        elif parts[0] == "blocks":
            assert lid == int(parts[1]) + 1, param
        else:  # final norm, dense-prediction adapter, head
            assert lid == 6, param
    assert {p.split(".")[0] for p, lid in ids.items() if lid == 6} >= {"norm", "pyramid", "head"}
