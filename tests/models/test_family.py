"""The family records (ppma.models.family) and the generic checks every family passes, run over
the records as timm's tests run over list_models."""
import pytest
import timm
import torch
from timm.models import model_entrypoint

from ppma.models.family import Family, create_from_checkpoint, families, family_of, package_models, register_family
from ppma.models.skeleton import HierarchicalBackbone

FAMILIES = families()
IDS = [f.name for f in FAMILIES]


def test_records_are_the_timm_presets_of_the_package():
    ours = sorted(n for n in timm.list_models() if model_entrypoint(n).__module__.startswith("ppma."))
    assert package_models() == ours
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


HIERARCHICAL = [f for f in FAMILIES if issubclass(f.model_class, HierarchicalBackbone)]


def seed_msg(message):
    return f"{message} (seed {torch.initial_seed()})"


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_forward_backward_batch1_h_ne_w(family):
    """The test preset is tiny; batch 1, H != W, odd token grids (13x17, 7x9, 4x5, 2x3 in the
    stages of a hierarchical model); drop path on; every parameter gets a finite gradient."""
    model = timm.create_model(family.test_preset, num_classes=5, drop_path_rate=0.1)
    assert isinstance(model, family.model_class) and n_params(model) < 400_000
    out = model(torch.randn(1, 3, 52, 68))
    assert out.shape == (1, 5) and torch.isfinite(out).all(), seed_msg("non-finite logits")
    out.logsumexp(-1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, seed_msg(f"no finite gradient for {missing}")


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_meta_device_forward_backward(family):
    """On meta tensors (shape inference without memory or compute, as for memory estimates and
    empty-weight initialization) the model runs forward and backward: the ops' custom ops take
    their fake implementations and leave autocast alone (meta has none)."""
    model = timm.create_model(family.test_preset, num_classes=5).to("meta")
    out = model(torch.empty(2, 3, 52, 68, device="meta"))
    assert out.shape == (2, 5) and out.device.type == "meta"
    out.sum().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_grad_checkpointing_gives_the_same_gradients(family):
    model = timm.create_model(family.test_preset)
    x = torch.randn(1, 3, 36, 44)
    grads = []
    for enable in (False, True):
        model.zero_grad()
        model.set_grad_checkpointing(enable)
        model(x).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, msg=lambda m, n=n: seed_msg(f"{n}: {m}"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_autocast_forward_backward_without_nan(family, dtype):
    model = timm.create_model(family.test_preset).eval()
    x = torch.randn(1, 3, 36, 44)
    with torch.no_grad():
        ref = model(x)
    with torch.autocast("cpu", dtype=dtype):
        y = model(x)
    assert torch.isfinite(y).all(), seed_msg(f"NaN/inf under {dtype} autocast")
    rel = ((y.detach().float() - ref).norm() / ref.norm()).item()
    assert rel < 0.05, seed_msg(f"{dtype} relative error {rel:.3g}")
    y.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None), seed_msg(
        f"non-finite gradient under {dtype} autocast")


@pytest.mark.parametrize("family", HIERARCHICAL, ids=[f.name for f in HIERARCHICAL])
@pytest.mark.parametrize("shape", [(1, 3, 161, 227), (2, 3, 33, 47), (1, 3, 32, 33)])
def test_features_only_at_odd_sizes(family, shape):
    """Stage ``s`` features are ``ceil(H / 2**(s + 2)) x ceil(W / 2**(s + 2))`` (plain Vim's
    floor-to-the-patch-grid rule is tested in test_vim.py)."""
    model = timm.create_model(family.test_preset, features_only=True).eval()
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    with torch.no_grad():
        feats = model(torch.randn(shape))
    h, w = shape[2:]
    for s, (f, c) in enumerate(zip(feats, model.feature_info.channels())):
        assert f.shape == (shape[0], c, -(-h // 2 ** (s + 2)), -(-w // 2 ** (s + 2))), seed_msg(f"stage {s}: {f.shape}")
        assert torch.isfinite(f).all(), seed_msg(f"stage {s} not finite")


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_forward_intermediates_and_classifier_api(family):
    model = timm.create_model(family.test_preset).eval()
    x = torch.randn(1, 3, 97, 130)
    channels = [info["num_chs"] for info in model.feature_info]
    with torch.no_grad():
        final, inter = model.forward_intermediates(x)
        assert [t.shape[:2] for t in inter] == [(1, c) for c in channels]
        torch.testing.assert_close(final, model.forward_features(x))
        one = model.forward_intermediates(x, indices=[1], intermediates_only=True)
        assert len(one) == 1 and torch.equal(one[0], inter[1])
        assert model(x).shape == (1, 1000)
        assert model.forward_head(final, pre_logits=True).shape == (1, model.head_hidden_size)
        model.reset_classifier(5)
        assert model(x).shape == (1, 5)
        model.reset_classifier(0)
        assert model(x).shape == (1, model.head_hidden_size)
        if family in HIERARCHICAL:  # a classifier has no output norms: the last intermediate is the final map
            assert torch.equal(inter[-1], final)
            model.reset_classifier(0, global_pool="")
            assert model(x).shape == (1, model.head_hidden_size, 4, 5)


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
def test_checkpoint_round_trip(family):
    """Our layout through the record (``checkpoint_model_kwargs``, ``checkpoint_filter_fn``, strict
    load) gives the same tensors and logits; a features model without output norms loads the
    classifier's checkpoint (head dropped) and gives its intermediates."""
    model = timm.create_model(family.test_preset, num_classes=7).eval()
    again = create_from_checkpoint(family.test_preset, {"model": model.state_dict()}).eval()
    assert again.num_classes == 7
    ours, theirs = model.state_dict(), again.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), again(x))
    if family in HIERARCHICAL:
        features = timm.create_model(family.test_preset, features_only=True, output_norms=()).eval()
        features.model.load_state_dict(family.checkpoint_filter_fn(model.state_dict(), features.model), strict=True)
        with torch.no_grad():
            expected = model.forward_intermediates(x, intermediates_only=True)
            for got, want in zip(features(x), expected, strict=True):
                assert torch.equal(got, want)
