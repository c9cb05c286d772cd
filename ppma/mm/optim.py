"""Optimizer-wrapper constructors for mmengine: no weight decay where the model says so, and
layer-wise learning-rate decay over the blocks of our backbones.

Configs name them in their ``optim_wrapper``::

    optim_wrapper = dict(
        type='OptimWrapper',
        constructor='NoDecayOptimWrapperConstructor',
        optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05),
        paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}))

    optim_wrapper = dict(
        type='OptimWrapper',
        constructor='LayerDecayOptimWrapperConstructor',
        optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05),
        paramwise_cfg=dict(layer_decay_rate=0.92, flat_decay_mult=0.0))

They are registered in mmengine's ``OPTIM_WRAPPER_CONSTRUCTORS``, which the registries of mmdet
and mmseg fall back on.

Both hand the optimizer one parameter group per distinct setting (:func:`merge_param_groups`), not
mmengine's one group per parameter: ``torch.optim``'s multi-tensor (``foreach``, the CUDA default)
and ``fused`` updates batch the tensors of one group, so a group per parameter costs a dozen
kernel launches per parameter and step. (An optimizer state saved with one group per parameter,
before this, does not load into the merged groups: resume such a run from its weights.)
"""
from __future__ import annotations

from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS
from timm.models._manipulate import MATCH_PREV_GROUP, group_with_matcher
from torch import nn

from ppma.models.backbone import TimmBackbone
from ppma.models.skeleton import HierarchicalBackbone


def merge_param_groups(groups: list[dict]) -> list[dict]:
    """The parameter groups of ``groups`` with equal settings (every key but ``params``) merged,
    in the order of their first group; the parameters keep their order."""
    merged = {}
    for group in groups:
        key = repr(sorted((k, v) for k, v in group.items() if k != "params"))
        if key in merged:
            merged[key]["params"].extend(group["params"])
        else:
            merged[key] = dict(group, params=list(group["params"]))
    return list(merged.values())


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
    parameters then get ``weight_decay=0`` (``decay_mult=0``) whatever matched them. The
    parameters of equal settings then share a group (:func:`merge_param_groups`).
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: dict | None = None):
        super().__init__(optim_wrapper_cfg, paramwise_cfg or dict(custom_keys={}))

    def add_params(self, params: list[dict], module: nn.Module, prefix: str = "", is_dcn_module=None) -> None:
        super().add_params(params, module, prefix, is_dcn_module)
        if prefix:  # a recursive call: the top-level one finishes
            return
        self.adjust_groups(params, module)
        params[:] = merge_param_groups(params)

    def adjust_groups(self, params: list[dict], module: nn.Module) -> None:
        """Set the settings of the one-parameter groups of ``module`` (before they are merged)."""
        if self.base_wd is None:  # no decay at all
            return
        no_decay = {id(p) for p in no_weight_decay_parameters(module).values()}
        for group in params:
            if any(id(p) in no_decay for p in group["params"]):
                group["weight_decay"] = 0.0


def block_layer_ids(backbone: TimmBackbone) -> tuple[dict[str, int], int]:
    """Layer id of each parameter of one of our backbones, and the number ``n`` of blocks.

    The stem is layer 0, the ``k``-th block (counted over all stages of a hierarchical model; a
    stage's downsampler goes with its first block) layer ``k + 1``, everything after the blocks
    (final or output norms, a dense-prediction adapter, the head) layer ``n + 1``: the layer ids
    of the BEiT-style constructor the Vim release trains its segmentation models with.

    The groups are the model's own ``group_matcher()`` read by timm's ``group_with_matcher``;
    the one difference from timm's layer ids: the parameters timm merges into the previous
    block (``MATCH_PREV_GROUP``: final and output norms) count after the blocks here.
    """
    matcher = backbone.group_matcher()
    rules = matcher["blocks"] if isinstance(matcher["blocks"], (list, tuple)) else [(matcher["blocks"], None)]
    blocks = [(pattern, ordinal) for pattern, ordinal in rules if ordinal != MATCH_PREV_GROUP]
    groups = group_with_matcher(backbone.named_parameters(), {"stem": matcher["stem"], "blocks": blocks})
    total = sum(len(stage.blocks) for stage in backbone.stages) if isinstance(backbone, HierarchicalBackbone) \
        else len(backbone.units())
    return {name: min(lid, total + 1) for lid, names in groups.items() for name in names}, total


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(NoDecayOptimWrapperConstructor):
    """:class:`NoDecayOptimWrapperConstructor`, then layer-wise learning-rate decay.

    ``paramwise_cfg['layer_decay_rate']`` (``0 < rate <= 1``, required): every parameter of one
    of our backbones (a :class:`~ppma.models.backbone.TimmBackbone` anywhere in the model, e.g.
    ``backbone.model``) in layer ``i`` of :func:`block_layer_ids` gets its lr (after
    ``paramwise_cfg``'s multipliers) times ``rate ** (n + 1 - i)``: the stem ``rate ** (n + 1)``,
    the last block ``rate``, what follows the blocks and everything outside the backbone (necks,
    heads) 1. The rest of ``paramwise_cfg`` works as in the parent.
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: dict | None = None):
        paramwise_cfg = dict(paramwise_cfg or {})
        rate = paramwise_cfg.pop("layer_decay_rate", None)
        if not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise ValueError(f"paramwise_cfg['layer_decay_rate'] must be a number in (0, 1], got {rate!r}")
        self.layer_decay_rate = float(rate)
        super().__init__(optim_wrapper_cfg, paramwise_cfg or None)

    def adjust_groups(self, params: list[dict], module: nn.Module) -> None:
        super().adjust_groups(params, module)
        scales = {}
        backbones = [m for m in module.modules() if isinstance(m, TimmBackbone)]
        if not backbones:
            raise ValueError(f"{type(self).__name__}: the model has no backbone of this package to decay layer-wise")
        for backbone in backbones:
            ids, num_blocks = block_layer_ids(backbone)
            for name, param in backbone.named_parameters():
                scales[id(param)] = self.layer_decay_rate ** (num_blocks + 1 - ids[name])
        for group in params:
            scale = scales.get(id(group["params"][0]), 1.0)
            group["lr"] = group.get("lr", self.base_lr) * scale
