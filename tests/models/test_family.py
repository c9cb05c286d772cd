"""The family records (ppma.models.family) and the generic checks every family passes, run over
the records as timm's tests run over list_models."""
import pytest
import timm
import torch
from timm.models import model_entrypoint

from ppma.models.family import Family, create_from_checkpoint, families, family_of, package_models, register_family

FAMILIES = families()
IDS = [f.name for f in FAMILIES]


def test_records_are_the_timm_presets_of_the_package():
    ours = sorted(n for n in timm.list_models() if model_entrypoint(n).__module__.startswith("ppma."))
    assert package_models() == ours
    assert {f.name for f in FAMILIES} == {"ppma", "vmamba", "vim", "vim_hier", "mila"}
    for family in FAMILIES:
        for preset in family.presets:
            assert family_of(preset) is family
            assert model_entrypoint(preset).__module__ == family.model_class.__module__


def test_lookup_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown model 'ppma_huge'; the models of this package: .*vmamba_tiny"):
        family_of("ppma_huge")
    with pytest.raises(ValueError, match="'resnet18' is a timm model of timm.models.resnet, not a model of this"):
        family_of("resnet18")


def test_registration_errors_name_the_problem():
    ppma = family_of("ppma_tiny")
    with pytest.raises(ValueError, match="family 'ppma' is already registered"):
        register_family(ppma)
    with pytest.raises(ValueError, match=r"family 'other': presets \['test_ppma'\] belong to another family"):
        register_family(Family(**{**vars(ppma), "name": "other", "presets": ("test_ppma",)}))
    with pytest.raises(ValueError, match="test_preset 'ppma_huge' is not one of its presets"):
        Family(**{**vars(ppma), "test_preset": "ppma_huge"})
    assert families() == FAMILIES


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_forward_backward_batch1_h_ne_w(family):
    model = timm.create_model(family.test_preset, num_classes=5)
    assert isinstance(model, family.model_class)
    out = model(torch.randn(1, 3, 64, 96))
    assert out.shape == (1, 5) and torch.isfinite(out).all()
    out.sum().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"no gradient for {missing}"


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_checkpoint_round_trip(family):
    model = timm.create_model(family.test_preset, num_classes=7).eval()
    again = create_from_checkpoint(family.test_preset, {"model": model.state_dict()}).eval()
    assert again.num_classes == 7
    ours, theirs = model.state_dict(), again.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), again(x))
