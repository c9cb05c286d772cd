"""The skeletons and the model families; importing registers the timm presets."""
from . import ppma
from . import mila
from . import vim
from . import vmamba
from .backbone import TimmBackbone, take_indices
from .checkpoint import model_state_dict, read_checkpoint
from .plain import PlainBackbone
from .ppma import PPMA, checkpoint_filter_fn
from .skeleton import HierarchicalBackbone, MixerFactory, Stage

__all__ = [
    "PPMA", "HierarchicalBackbone", "MixerFactory", "PlainBackbone", "Stage", "TimmBackbone", "checkpoint_filter_fn",
    "model_state_dict", "ppma", "read_checkpoint", "take_indices",
]
