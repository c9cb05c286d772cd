"""The hierarchical skeleton and the model families; importing registers the timm presets."""
from . import ppma
from .checkpoint import model_state_dict, read_checkpoint
from .ppma import PPMA, checkpoint_filter_fn
from .skeleton import HierarchicalBackbone, MixerFactory, Stage

__all__ = ["PPMA", "HierarchicalBackbone", "MixerFactory", "Stage", "checkpoint_filter_fn", "model_state_dict", "ppma", "read_checkpoint"]
