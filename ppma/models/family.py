"""Finding a model family by a preset's name, so that code outside the family never imports it.

A family is the module that registers its timm presets (e.g. :mod:`ppma.models.ppma`); its
checkpoint section defines

- ``checkpoint_filter_fn(state_dict, model) -> state_dict``: official or our layout -> ``model``'s
  keys, checked strictly;
- ``checkpoint_model_kwargs(state_dict) -> dict``: the ``timm.create_model`` keywords (head or
  not, ``num_classes``, output norms) under which a checkpoint's keys load.

Tools (checkpoint conversion, visualization, the OpenMMLab adapter) look these up here by the
model name, through timm's registry.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Callable

import timm
from timm.models import model_entrypoint
from torch import nn

PACKAGE = __name__.split(".")[0]  # 'ppma'


def _is_ours(model_name: str) -> bool:
    return model_entrypoint(model_name).__module__.startswith(f"{PACKAGE}.")


def package_models() -> list[str]:
    """The timm presets that this package registers, sorted."""
    return [name for name in timm.list_models() if _is_ours(name)]


def family_module(model_name: str) -> ModuleType:
    """The module defining the timm entrypoint of ``model_name`` (a preset of this package).

    ``ValueError`` for a name timm does not know or a model of another library.
    """
    if not timm.is_model(model_name):
        raise ValueError(f"unknown model {model_name!r}; the models of this package: {', '.join(package_models())}")
    if not _is_ours(model_name):
        raise ValueError(f"{model_name!r} is a timm model of {model_entrypoint(model_name).__module__}, not a "
                         f"model of this package: {', '.join(package_models())}")
    return sys.modules[model_entrypoint(model_name).__module__]


def _family_function(model_name: str, attribute: str) -> Callable:
    module = family_module(model_name)
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ValueError(f"the family of {model_name!r} ({module.__name__}) defines no {attribute}")
    return function


def checkpoint_filter_of(model_name: str) -> Callable[[dict, nn.Module], dict]:
    """The family's ``checkpoint_filter_fn(state_dict, model) -> state_dict``."""
    return _family_function(model_name, "checkpoint_filter_fn")


def checkpoint_model_kwargs_of(model_name: str) -> Callable[[dict], dict]:
    """The family's ``checkpoint_model_kwargs(state_dict) -> dict`` (keywords for ``timm.create_model``)."""
    return _family_function(model_name, "checkpoint_model_kwargs")


def create_from_checkpoint(model_name: str, state_dict: dict, **kwargs) -> nn.Module:
    """``timm.create_model(model_name)`` built as ``state_dict``'s keys say, with them loaded strictly.

    ``state_dict``: official or our layout (:func:`checkpoint_model_kwargs_of` decides head and
    output norms, :func:`checkpoint_filter_of` converts); ``kwargs`` go to ``timm.create_model``.
    ``ValueError`` naming the keys (or shapes) that do not fit.
    """
    model = timm.create_model(model_name, **checkpoint_model_kwargs_of(model_name)(state_dict), **kwargs)
    try:
        model.load_state_dict(checkpoint_filter_of(model_name)(state_dict, model), strict=True)
    except (KeyError, RuntimeError) as err:  # RuntimeError: load_state_dict's key and shape checks
        raise ValueError(str(err)) from err
    return model
