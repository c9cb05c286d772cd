"""The skeletons and the model families; importing registers the timm presets and the family
records (:mod:`ppma.models.family`)."""
from . import mila, ppma, vim, vmamba
from .backbone import TimmBackbone, take_indices
from .checkpoint import model_state_dict, read_checkpoint
from .family import Family, families, family_of
from .plain import PlainBackbone
from .skeleton import HierarchicalBackbone, MixerFactory, Stage

__all__ = [
    "Family", "HierarchicalBackbone", "MixerFactory", "PlainBackbone", "Stage", "TimmBackbone", "families",
    "family_of", "mila", "model_state_dict", "ppma", "read_checkpoint", "take_indices", "vim", "vmamba",
]
