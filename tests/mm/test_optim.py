"""NoDecayOptimWrapperConstructor: zero weight decay exactly where the model declares it."""
import pytest
import torch
from torch import nn

pytest.importorskip("mmdet", reason="mmdet is not installed (pip install 'ppma[mm]'); CI installs it")
pytest.importorskip("mmseg", reason="mmseg is not installed (pip install 'ppma[mm]'); CI installs it")
from mmengine.optim import build_optim_wrapper  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

from ppma.mm import NoDecayOptimWrapperConstructor  # noqa: E402
from ppma.mm.analysis import build_model  # noqa: E402
from ppma.mm.optim import no_weight_decay_parameters  # noqa: E402
from ppma.mm.runtime import load_config  # noqa: E402

NAME = "NoDecayOptimWrapperConstructor"


def decay_of(model, wrapper):
    """Parameter name -> (weight decay, lr) of its group."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (group["weight_decay"], group["lr"])
            for group in wrapper.optimizer.param_groups for p in group["params"]}


@pytest.mark.parametrize("package", ["mmdet", "mmseg"])
def test_the_scoped_registries_find_it(package):
    registry = pytest.importorskip(f"{package}.registry").OPTIM_WRAPPER_CONSTRUCTORS
    assert registry.get(NAME) is NoDecayOptimWrapperConstructor


@pytest.fixture(scope="module")
def detector(mm):
    cfg = load_config(str(mm.quick_det))
    init_default_scope(cfg.default_scope)
    return cfg, build_model(cfg)


def test_declared_parameters_and_nothing_else_get_no_decay(detector):
    cfg, model = detector
    declared = {f"backbone.model.{n}" for n in model.backbone.model.no_weight_decay()}
    assert declared and declared == set(no_weight_decay_parameters(model))
    # what the configs listed by name before: the polyline decays' dt_bias and A_log
    assert declared == {n for n, _ in model.named_parameters() if n.endswith(("dt_bias", "A_log"))}
    wrapper = build_optim_wrapper(model, dict(type="OptimWrapper", constructor=NAME,
                                              optimizer=dict(type="AdamW", lr=1e-3, weight_decay=0.05)))
    groups = decay_of(model, wrapper)
    assert groups.keys() == dict(model.named_parameters()).keys()
    assert {n for n, (wd, _) in groups.items() if wd == 0} == declared, f"seed {torch.initial_seed()}"
    assert all(wd == 0.05 for n, (wd, _) in groups.items() if n not in declared)


def test_on_top_of_the_configs_paramwise_settings(detector):
    cfg, model = detector
    declared = set(no_weight_decay_parameters(model))
    optim = dict(cfg.optim_wrapper, paramwise_cfg=dict(custom_keys={
        "norm": dict(decay_mult=0.0), "mixer.decay": dict(lr_mult=0.1)}))
    groups = decay_of(model, build_optim_wrapper(model, optim))
    norms = {n for n in groups if "norm" in n}
    assert {n for n, (wd, _) in groups.items() if wd == 0} == declared | norms
    base_lr = cfg.optim_wrapper.optimizer.lr
    for name in declared:  # their custom key still sets their lr
        assert groups[name] == (0.0, pytest.approx(0.1 * base_lr)), name


class Scaled(nn.Module):
    def __init__(self, bad=False):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.bad = bad

    def no_weight_decay(self):
        return {"shift" if self.bad else "scale"}


def test_any_submodule_may_declare_and_bad_names_are_errors():
    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(Scaled()))
    wrapper = build_optim_wrapper(model, dict(constructor=NAME, optimizer=dict(type="SGD", lr=0.1, weight_decay=0.01)))
    assert {n for n, (wd, _) in decay_of(model, wrapper).items() if wd == 0} == {"1.0.scale"}
    with pytest.raises(ValueError, match="'shift', which is not one of its parameters"):
        build_optim_wrapper(nn.Sequential(Scaled(bad=True)),
                            dict(constructor=NAME, optimizer=dict(type="SGD", lr=0.1, weight_decay=0.01)))


LAYER_DECAY = "LayerDecayOptimWrapperConstructor"


def with_head(features_model):
    """An mm-like model: ``backbone.model`` (our timm backbone) and a head outside it."""
    model = nn.Module()
    model.backbone = nn.Module()
    model.backbone.model = features_model.model
    model.head = nn.Linear(3, 3)
    return model


def test_layer_decay_over_the_blocks_of_a_plain_model():
    import timm

    model = with_head(timm.create_model("test_vim", features_only=True))  # 4 blocks
    cfg = dict(constructor=LAYER_DECAY, optimizer=dict(type="AdamW", lr=1.0, weight_decay=0.05),
               paramwise_cfg=dict(layer_decay_rate=0.5, flat_decay_mult=0.0))
    groups = decay_of(model, build_optim_wrapper(model, cfg))
    assert groups["backbone.model.stem.proj.weight"] == (0.05, 0.5**5)
    assert groups["backbone.model.stem.pos_embed"] == (0.0, 0.5**5)  # declared in no_weight_decay()
    for i in range(4):  # the last block: rate**1, as the release's BEiT-style constructor
        assert groups[f"backbone.model.blocks.{i}.mixer.in_proj.weight"] == (0.05, 0.5 ** (4 - i))
        assert groups[f"backbone.model.blocks.{i}.mixer.A_log"] == (0.0, 0.5 ** (4 - i))
        assert groups[f"backbone.model.blocks.{i}.norm.weight"][0] == 0.0  # flat: no decay
    assert groups["backbone.model.pyramid.0.weight"] == (0.05, 1.0)  # the adapter (patch 8: a deconv)
    assert groups["head.weight"] == (0.05, 1.0) and groups["head.bias"] == (0.0, 1.0)


def test_layer_decay_counts_blocks_across_stages():
    import timm

    model = with_head(timm.create_model("test_vim_hier", features_only=True, depths=(1, 2, 1, 1)))  # 5 blocks
    cfg = dict(constructor=LAYER_DECAY, optimizer=dict(type="SGD", lr=2.0, weight_decay=0.01),
               paramwise_cfg=dict(layer_decay_rate=0.5, custom_keys={"head": dict(lr_mult=0.1)}))
    lrs = {n: lr for n, (_, lr) in decay_of(model, build_optim_wrapper(model, cfg)).items()}
    assert lrs["backbone.model.stem.conv1.weight"] == 2.0 * 0.5**6
    assert lrs["backbone.model.stages.0.blocks.0.mixer.in_proj.weight"] == 2.0 * 0.5**5
    assert lrs["backbone.model.stages.1.downsample.conv.weight"] == 2.0 * 0.5**4  # with its first block
    assert lrs["backbone.model.stages.1.blocks.1.mixer.in_proj.weight"] == 2.0 * 0.5**3
    assert lrs["backbone.model.stages.3.blocks.0.norm.weight"] == 2.0 * 0.5
    assert lrs["backbone.model.out_norms.3.weight"] == 2.0
    assert lrs["head.weight"] == pytest.approx(0.2)  # custom keys first, then the layer scale (1 here)


def test_layer_decay_needs_a_rate_and_one_of_our_backbones():
    cfg = dict(constructor=LAYER_DECAY, optimizer=dict(type="SGD", lr=0.1))
    with pytest.raises(ValueError, match="layer_decay_rate"):
        build_optim_wrapper(nn.Linear(2, 2), dict(cfg, paramwise_cfg=dict(layer_decay_rate=1.5)))
    with pytest.raises(ValueError, match="no backbone of this package"):
        build_optim_wrapper(nn.Linear(2, 2), dict(cfg, paramwise_cfg=dict(layer_decay_rate=0.9)))


def test_one_group_per_setting_for_multi_tensor_updates():
    import timm

    model = with_head(timm.create_model("test_vim", features_only=True))  # 4 blocks: 6 layer ids
    cfg = dict(constructor=LAYER_DECAY, optimizer=dict(type="AdamW", lr=1.0, weight_decay=0.05, foreach=True),
               paramwise_cfg=dict(layer_decay_rate=0.5, flat_decay_mult=0.0))
    wrapper = build_optim_wrapper(model, cfg)
    settings = [(g["lr"], g["weight_decay"]) for g in wrapper.optimizer.param_groups]
    assert len(settings) == len(set(settings)) == 12  # decay / no decay at each of the 6 layer ids
    params = [p for g in wrapper.optimizer.param_groups for p in g["params"]]
    assert sorted(map(id, params)) == sorted(id(p) for p in model.parameters())  # each once
    model.head.weight.grad = torch.ones_like(model.head.weight)
    wrapper.step()  # the multi-tensor update runs over the merged groups
    assert wrapper.optimizer.state[model.head.weight]["step"] == 1
