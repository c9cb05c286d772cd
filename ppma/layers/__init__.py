"""nn.Modules built from :mod:`ppma.ops`: token mixers and the blocks around them."""
from .block import MixerBlock, SequenceBlock
from .conv import GridDepthwiseConv
from .decay import DecayGenerator
from .embed import ConvDownsample, ConvStem, PatchStem
from .ffn import ConvFFN
from .head import NormPoolHead, ProjectionHead, TokenPoolHead
from .layout import GRID_2D, GRID_3D, GRIDS, LAYOUTS, SEQUENCE, check_mixer_layout
from .polyline_attention import KINDS, MASK_FORMS, PolylineAttention, elu_feature_map
from .rope import RasterRotaryEmbedding

__all__ = [
    "GRID_2D",
    "GRID_3D",
    "GRIDS",
    "KINDS",
    "LAYOUTS",
    "SEQUENCE",
    "MASK_FORMS",
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
    "elu_feature_map",
]
