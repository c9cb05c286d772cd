"""ppma: vision backbones with Polyline Path Masked Attention.

Importing ppma registers its presets with timm (``timm.create_model('ppma_tiny')``).
"""
from . import models, ops

__version__ = "0.1.0"
__all__ = ["models", "ops"]
