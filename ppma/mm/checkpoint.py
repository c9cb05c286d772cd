"""Reading backbone weights: official classification checkpoints and our own.

A backbone checkpoint may be

- an official PPMA classification checkpoint (``{'model': state_dict, 'args': ...}``, official
  module names);
- one of ours: a timm state dict, a converted ``.safetensors`` file, or a detector/segmentor
  checkpoint written by training (``{'state_dict': {'backbone.model.*': ...}}``).

:func:`backbone_state_dict` extracts the backbone's tensors; the family's
``checkpoint_filter_fn`` (e.g. :func:`ppma.models.ppma.checkpoint_filter_fn`) then converts
them to the model's layout and checks them strictly (see :class:`ppma.mm.PyramidBackbone`).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch


def read_checkpoint(path: str) -> dict:
    """Read a checkpoint file or URL: ``.safetensors`` or anything ``torch.load`` reads.

    ``torch.load`` runs with ``weights_only=True`` (the default of torch >= 2.6); the globals
    that our checkpoints and the official ones need are allowed by :mod:`ppma.mm.serialization`.
    """
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file

        if not Path(path).is_file():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        return load_file(str(path), device="cpu")
    from mmengine.runner import CheckpointLoader

    return CheckpointLoader.load_checkpoint(str(path), map_location="cpu")


def backbone_state_dict(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The backbone's own state dict inside any of the accepted checkpoint layouts.

    Unwraps ``{'state_dict': ...}`` / ``{'model': ...}``, strips DDP's ``module.``, keeps only
    ``backbone.*`` of a detector/segmentor checkpoint and strips the adapter's ``model.``.
    """
    for key in ("state_dict", "model"):
        if isinstance(checkpoint.get(key), dict):
            checkpoint = checkpoint[key]
            break
    state = {k.removeprefix("module."): v for k, v in checkpoint.items() if torch.is_tensor(v)}
    if not state:
        raise ValueError("the checkpoint holds no tensors (expected a state dict, or one under "
                         "'state_dict' or 'model')")
    if any(k.startswith("backbone.") for k in state):
        state = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
    if all(k.startswith("model.") for k in state):
        state = {k.removeprefix("model."): v for k, v in state.items()}
    return state


def filter_fn_of(model_name: str):
    """The ``checkpoint_filter_fn`` of the timm module defining ``model_name`` (None if none)."""
    from timm.models import model_entrypoint

    module = sys.modules[model_entrypoint(model_name).__module__]
    return getattr(module, "checkpoint_filter_fn", None)
