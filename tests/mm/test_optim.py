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
