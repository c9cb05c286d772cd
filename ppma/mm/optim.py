"""No weight decay where the model says so: an optimizer-wrapper constructor for mmengine.

Configs name it in their ``optim_wrapper``::

    optim_wrapper = dict(
        type='OptimWrapper',
        constructor='NoDecayOptimWrapperConstructor',
        optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05),
        paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}))

It is registered in mmengine's ``OPTIM_WRAPPER_CONSTRUCTORS``, which the registries of mmdet
and mmseg fall back on.
"""
from __future__ import annotations

from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS
from torch import nn


def no_weight_decay_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters that some submodule of ``model`` names in its ``no_weight_decay()``.

    Names are relative to that submodule (timm's convention); the result is keyed by the full
    name in ``model`` (e.g. ``backbone.model.stages.0.blocks.0.mixer.decay.A_log``). A name that
    is not a parameter of its submodule is a ``ValueError``.
    """
    found = {}
    for prefix, module in model.named_modules():
        declare = getattr(module, "no_weight_decay", None)
        if not callable(declare):
            continue
        for name in declare():
            try:
                param = module.get_parameter(name)
            except AttributeError as err:
                raise ValueError(f"{type(module).__name__} at {prefix or 'the top'!r} declares "
                                 f"no_weight_decay {name!r}, which is not one of its parameters") from err
            found[f"{prefix}.{name}" if prefix else name] = param
    return found


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class NoDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor, then weight decay 0 for :func:`no_weight_decay_parameters`.

    ``paramwise_cfg`` works as in :class:`~mmengine.optim.DefaultOptimWrapperConstructor`
    (``custom_keys``, ``norm_decay_mult``, ...), learning-rate settings included; the declared
    parameters then get ``weight_decay=0`` (``decay_mult=0``) whatever matched them. Every
    parameter gets its own group, also without ``paramwise_cfg``.
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: dict | None = None):
        super().__init__(optim_wrapper_cfg, paramwise_cfg or dict(custom_keys={}))

    def add_params(self, params: list[dict], module: nn.Module, prefix: str = "", is_dcn_module=None) -> None:
        super().add_params(params, module, prefix, is_dcn_module)
        if prefix or self.base_wd is None:  # a recursive call (the top-level one finishes), or no decay at all
            return
        no_decay = {id(p) for p in no_weight_decay_parameters(module).values()}
        for group in params:
            if any(id(p) in no_decay for p in group["params"]):
                group["weight_decay"] = 0.0
