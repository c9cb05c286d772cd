"""What a new user gets for bad or unusual input, the same on every family (its test preset): a
named error."""
import pytest
import timm
import torch

import ppma  # noqa: F401  (registers the presets)
from ppma.models.checkpoint import check_pretrained, load_strict, model_state_dict, read_checkpoint
from ppma.models.family import families, family_of
from ppma.models.skeleton import HierarchicalBackbone

FAMILIES = [f.test_preset for f in families()]


def other_widths(name: str) -> dict:
    """The keywords of another variant of ``name``'s family: other widths (a hierarchical model's
    ``embed_dims`` per stage, a plain model's one ``embed_dim``)."""
    if issubclass(family_of(name).model_class, HierarchicalBackbone):
        return dict(embed_dims=(32, 64, 96, 128))
    return dict(embed_dim=32)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param, timm.create_model(request.param).eval()


def test_uint8_image(family):
    _, model = family
    with pytest.raises(TypeError, match=r"floating-point image, got torch\.uint8; convert with x\.float\(\) / 255"):
        model(torch.randint(0, 256, (1, 3, 64, 64), dtype=torch.uint8))


def test_empty_batch(family):
    _, model = family
    with pytest.raises(ValueError, match=r"empty batch \(B=0\)"):
        model(torch.zeros(0, 3, 64, 64))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_image_is_named(family, bad):
    _, model = family
    x = torch.randn(1, 3, 64, 64)
    x[0, 1, 5, 7] = bad
    with pytest.raises(ValueError, match="input contains NaN or infinite values") as err:
        model(x)
    assert "log_alpha" not in str(err.value)


def test_truncated_checkpoint_names_the_file(family, tmp_path):
    name, model = family
    path = tmp_path / f"{name}.pth"
    torch.save(model.state_dict(), path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=f"cannot read checkpoint {path}: truncated"):
        read_checkpoint(path)
    with pytest.raises(ValueError, match=f"cannot read checkpoint {path}: a truncated zip"):
        check_pretrained(name, dict(file=str(path)))


def test_truncated_safetensors_names_the_file(family, tmp_path):
    from safetensors.torch import save_file

    name, model = family
    path = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    path.write_bytes(path.read_bytes()[:100])
    for check in (read_checkpoint, lambda p: check_pretrained(name, dict(file=str(p)))):
        with pytest.raises(ValueError, match=f"cannot read checkpoint {path}"):
            check(path)


def test_missing_checkpoint_names_the_path(family, tmp_path):
    name, _ = family
    path = tmp_path / "nowhere" / "weights.pth"
    with pytest.raises(FileNotFoundError, match=f"checkpoint not found: {path}"):
        read_checkpoint(path)
    with pytest.raises(FileNotFoundError, match=f"pretrained weights of '{name}' not found: {path}"):
        check_pretrained(name, dict(file=str(path)))


@pytest.mark.parametrize("name", [*FAMILIES, "mila_tiny"])
def test_no_download_says_how_to_pass_a_file(name):
    with pytest.raises(ValueError, match=rf"'{name}' has no download .*pretrained_cfg_overlay=dict\(file="):
        check_pretrained(name)


def test_a_good_file_passes(family, tmp_path):
    name, model = family
    path = tmp_path / f"{name}.pth"
    torch.save(model.state_dict(), path)
    check_pretrained(name, dict(file=str(path)))


def test_another_variants_checkpoint_names_keys_and_shapes(family):
    name, model = family
    other = timm.create_model(name, **other_widths(name))
    with pytest.raises(ValueError, match=rf"checkpoint other\.pth does not fit '{name}': .*size mismatch for stem\."):
        load_strict(model, other.state_dict(), family_of(name).checkpoint_filter_fn, source="checkpoint other.pth",
                    model_name=name)
    with pytest.raises(ValueError, match=r"shapes differ: .*size mismatch for stem\."):
        family_of(name).checkpoint_filter_fn(other.state_dict(), model)


def test_load_strict_reports_what_it_did(family):
    name, model = family
    source = timm.create_model(name)
    state = {**source.state_dict(), "extra.not_used": torch.ones(1)}
    with pytest.raises(ValueError, match=r"keys without a counterpart in the model: \['extra\.not_used'\]"):
        load_strict(model, state, family_of(name).checkpoint_filter_fn, model_name=name)
    report = load_strict(model, source.state_dict(), family_of(name).checkpoint_filter_fn, model_name=name)
    assert sorted(report.loaded) == sorted(model.state_dict()) and not report.kept
    for k, v in model.state_dict().items():
        assert torch.equal(v, source.state_dict()[k]), k
    assert model_state_dict(dict(model=report)).keys() == report.keys()
