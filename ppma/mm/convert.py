"""Whole official dense-prediction checkpoints -> weights of a detector/segmentor built from our configs.

The PPMA release publishes Mask R-CNN (mmdet 2.28) and UPerNet (mmseg 0.30) checkpoints::

    {'state_dict': {'backbone.*': official PPMA names (with the output norms 'outnorm{i}'),
                    'neck.*', 'rpn_head.*', 'roi_head.*'  |  'decode_head.*', 'auxiliary_head.*'},
     'meta': {'CLASSES': ..., 'PALETTE': ..., ...}}

:func:`convert_dense_state_dict` maps them onto ``model`` (built from one of ``mm_configs/``):

- ``backbone.*``: the backbone family's ``checkpoint_filter_fn`` (found by the backbone's model
  name) renames them, then they get our adapter's prefix ``backbone.model.``;
- the other keys keep their names: the modules of these recipes (FPN; RPNHead; StandardRoIHead
  with Shared2FCBBoxHead and FCNMaskHead; UPerHead; FCNHead; mmcv's ConvModule inside them)
  name their parameters the same way in mmdet 2.28 and 3.3 and in mmseg 0.30 and 1.2.

Nothing is dropped silently: a source key without a counterpart in ``model``, a key of ``model``
that the checkpoint does not fill, or a shape that differs is a ``ValueError`` naming them. The
only tensors not carried over are the backbone's RoPE angle buffers, which the filter checks
against the model's and the model recomputes.
"""
from __future__ import annotations

import torch
from torch import nn

from ppma.models.checkpoint import model_state_dict
from ppma.models.family import family_of

BACKBONE = "backbone."
OURS = "backbone.model."  # the adapter keeps the timm model's keys under backbone.model


def convert_dense_state_dict(checkpoint: dict, model: nn.Module) -> dict[str, torch.Tensor]:
    """``checkpoint`` (a dense-prediction checkpoint or its ``state_dict``) in ``model``'s keys.

    ``model``: a detector/segmentor whose ``backbone`` is a :class:`ppma.mm.PyramidBackbone`.
    Returns a state dict that ``model.load_state_dict(..., strict=True)`` accepts.
    """
    state = checkpoint.get("state_dict", checkpoint)
    if not isinstance(state, dict) or not any(k.startswith(BACKBONE) for k in state):
        raise ValueError("not a detector/segmentor checkpoint: no 'backbone.*' keys in its state_dict")
    backbone = model.backbone
    converted = {OURS + k: v for k, v in _convert_backbone(state, backbone.model, backbone.model_name).items()}
    converted.update({k: v for k, v in state.items() if not k.startswith(BACKBONE)})
    _check_against(converted, model.state_dict())
    return converted


def _convert_backbone(state: dict, backbone: nn.Module, model_name: str) -> dict[str, torch.Tensor]:
    """The ``backbone.*`` tensors renamed by the family's filter; every model key must come from them."""
    try:
        converted = family_of(model_name).checkpoint_filter_fn(model_state_dict({"state_dict": state}), backbone)
    except ValueError as err:
        raise ValueError(f"the backbone does not fit {model_name!r}: {err}") from err
    # a dense-prediction checkpoint has the output norms that a classification one may lack
    if converted.kept:
        raise ValueError(f"backbone keys of the model missing from the checkpoint: {[OURS + k for k in converted.kept]}")
    return converted


def _check_against(converted: dict, own: dict) -> None:
    unexpected = [k for k in converted if k not in own]
    missing = [k for k in own if k not in converted]
    shapes = [f"{k}: {tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} in the model"
              for k, v in converted.items() if k in own and v.shape != own[k].shape]
    if unexpected or missing or shapes:
        raise ValueError("the checkpoint does not fit the model: "
                         + "; ".join(f"{what}: {keys}" for what, keys in (
                             ("keys without a counterpart in the model", unexpected),
                             ("model keys missing from the checkpoint", missing),
                             ("different shapes", shapes)) if keys))


def dataset_meta(meta: dict | None) -> dict:
    """mmengine's ``dataset_meta`` (``classes``, ``palette``) from an mmdet 2 / mmseg 0 ``meta``."""
    meta = meta or {}
    names = {"CLASSES": "classes", "PALETTE": "palette"}
    return {ours: meta[theirs] for theirs, ours in names.items() if meta.get(theirs) is not None}
