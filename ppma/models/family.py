"""Model families as declared records, so that code outside a family never imports it.

A family module (e.g. :mod:`ppma.models.ppma`) declares itself once, at its bottom, with
:func:`register_family` and a :class:`Family`: its model class, its timm presets, its checkpoint
conversion and its test preset. Tools (checkpoint conversion, visualization, the OpenMMLab
adapters, the generic model tests) find the record by a preset's name with :func:`family_of`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import timm
from timm.models import model_entrypoint
from torch import nn

_FAMILIES: dict[str, "Family"] = {}


@dataclass(frozen=True)
class Family:
    """One model family.

    Fields:
        name: the family's name (``'ppma'``).
        model_class: the ``nn.Module`` its presets build.
        presets: the timm model names it registers, ``test_preset`` included.
        checkpoint_filter_fn: ``(state_dict, model) -> state_dict``, official or our layout ->
            ``model``'s keys, checked strictly (also timm's ``pretrained_filter_fn``).
        checkpoint_model_kwargs: ``(state_dict) -> dict``, the ``timm.create_model`` keywords
            (head or not, ``num_classes``, output norms) under which a checkpoint's keys load.
        test_preset: a tiny preset for fast generic tests (timm's ``test_*`` convention).
        default_input_size: ``(C, H, W)`` of its full-size presets.
    """

    name: str
    model_class: type[nn.Module]
    presets: tuple[str, ...]
    checkpoint_filter_fn: Callable[[dict, nn.Module], dict]
    checkpoint_model_kwargs: Callable[[dict], dict]
    test_preset: str
    default_input_size: tuple[int, ...] = (3, 224, 224)

    def __post_init__(self):
        if self.test_preset not in self.presets:
            raise ValueError(f"family {self.name!r}: test_preset {self.test_preset!r} is not one of its presets")


def register_family(family: Family) -> Family:
    """Declare ``family``; ``ValueError`` for a taken family name or a preset another family has."""
    if family.name in _FAMILIES:
        raise ValueError(f"family {family.name!r} is already registered")
    taken = {p for other in _FAMILIES.values() for p in other.presets} & set(family.presets)
    if taken:
        raise ValueError(f"family {family.name!r}: presets {sorted(taken)} belong to another family")
    _FAMILIES[family.name] = family
    return family


def families() -> tuple[Family, ...]:
    """The registered families, in registration order."""
    return tuple(_FAMILIES.values())


def package_models() -> list[str]:
    """The timm presets of all families, sorted."""
    return sorted(p for family in _FAMILIES.values() for p in family.presets)


def family_of(model_name: str) -> Family:
    """The family of the preset ``model_name``; ``ValueError`` for any other name (naming ours)."""
    for family in _FAMILIES.values():
        if model_name in family.presets:
            return family
    ours = ", ".join(package_models())
    if not timm.is_model(model_name):
        raise ValueError(f"unknown model {model_name!r}; the models of this package: {ours}")
    raise ValueError(f"{model_name!r} is a timm model of {model_entrypoint(model_name).__module__}, not a model "
                     f"of this package: {ours}")


def create_from_checkpoint(model_name: str, state_dict: dict, **kwargs) -> nn.Module:
    """``timm.create_model(model_name)`` built as ``state_dict``'s keys say, with them loaded strictly.

    ``state_dict``: official or our layout (the family's ``checkpoint_model_kwargs`` decides head
    and output norms, its ``checkpoint_filter_fn`` converts); ``kwargs`` go to ``timm.create_model``.
    With ``features_only=True`` the weights load into the backbone inside timm's feature wrapper
    (its ``model``): a classifier checkpoint's head keys are dropped (logged by name), the rest
    loads strictly. ``ValueError`` naming the keys (or shapes) that do not fit.
    """
    family = family_of(model_name)
    model = timm.create_model(model_name, **family.checkpoint_model_kwargs(state_dict), **kwargs)
    backbone = model.model if kwargs.get("features_only") else model  # timm's FeatureGetterNet
    try:
        backbone.load_state_dict(family.checkpoint_filter_fn(state_dict, backbone), strict=True)
    except (KeyError, RuntimeError) as err:  # RuntimeError: load_state_dict's key and shape checks
        raise ValueError(str(err)) from err
    return model
