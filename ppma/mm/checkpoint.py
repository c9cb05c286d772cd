"""Reading backbone weights: official classification checkpoints and our own.

A backbone checkpoint may be

- an official PPMA classification checkpoint (``{'model': state_dict, 'args': ...}``, official
  module names);
- one of ours: a timm state dict, a converted ``.safetensors`` file, or a detector/segmentor
  checkpoint written by training (``{'state_dict': {'backbone.model.*': ...}}``).

:func:`ppma.models.model_state_dict` extracts the backbone's tensors; the family's
``checkpoint_filter_fn`` (its record found by the model name, :func:`ppma.models.family.family_of`)
then converts them to the model's layout and checks them strictly (see
:class:`ppma.mm.PyramidBackbone`).
"""
from __future__ import annotations

from ppma._deprecation import renamed_attributes
from ppma.models.checkpoint import allow_official_globals
from ppma.models.checkpoint import read_checkpoint as ppma_read_checkpoint


def read_checkpoint_or_url(path: str) -> dict:
    """Read a local checkpoint (:func:`ppma.models.read_checkpoint`) or a URL (mmengine's loader).

    Both load with ``weights_only=True`` (the default of torch >= 2.6), allowing the official
    checkpoints' ``args`` and config (:func:`ppma.models.checkpoint.allow_official_globals`); what
    our training checkpoints hold is allowed by :mod:`ppma.mm.serialization`.
    """
    if "://" not in str(path):
        return ppma_read_checkpoint(path)
    from mmengine.runner import CheckpointLoader

    with allow_official_globals():
        return CheckpointLoader.load_checkpoint(str(path), map_location="cpu")


# this module's read_checkpoint was two functions' name: it is read_checkpoint_or_url
__getattr__ = renamed_attributes(__name__, globals(), {"read_checkpoint": "read_checkpoint_or_url"})
