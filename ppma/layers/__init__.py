"""nn.Modules built from :mod:`ppma.ops`: token mixers and the blocks around them.

Top level: the pieces the skeletons share and PPMA's mixer under its own name
(:class:`PolylineAttention`); a family's other pieces and constants stay in its module
(``ppma.layers.polyline_attention.ATTENTION_KINDS``, ``ppma.layers.vmamba``, ``ppma.layers.vim``, ...)."""
from ppma._deprecation import renamed_attributes

from .block import MixerBlock, SequenceBlock
from .conv import GridDepthwiseConv
from .decay import DecayGenerator
from .embed import ConvDownsample, ConvStem, PatchStem
from .ffn import ConvFFN
from .head import NormPoolHead, ProjectionHead, TokenPoolHead
from .layout import GRID_2D, GRID_3D, GRID_LAYOUTS, LAYOUTS, SEQUENCE, check_mixer_layout
from .polyline_attention import PolylineAttention
from .rope import RasterRotaryEmbedding

__all__ = [
    "GRID_2D",
    "GRID_3D",
    "GRID_LAYOUTS",
    "LAYOUTS",
    "SEQUENCE",
    "ConvDownsample",
    "ConvFFN",
    "ConvStem",
    "DecayGenerator",
    "GridDepthwiseConv",
    "MixerBlock",
    "NormPoolHead",
    "PatchStem",
    "PolylineAttention",
    "ProjectionHead",
    "RasterRotaryEmbedding",
    "SequenceBlock",
    "TokenPoolHead",
    "check_mixer_layout",
]

__getattr__ = renamed_attributes(__name__, globals(), {"GRIDS": "GRID_LAYOUTS"})
