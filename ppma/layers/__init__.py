"""nn.Modules built from :mod:`ppma.ops`: token mixers and the blocks around them."""
from .block import MixerBlock
from .conv import GridDepthwiseConv
from .decay import DecayGenerator
from .embed import ConvDownsample, ConvStem
from .ffn import ConvFFN
from .head import ProjectionHead
from .polyline_attention import KINDS, MASK_FORMS, PolylineAttention, elu_feature_map
from .rope import GridRotaryEmbedding

__all__ = [
    "KINDS",
    "MASK_FORMS",
    "ConvDownsample",
    "ConvFFN",
    "ConvStem",
    "DecayGenerator",
    "GridDepthwiseConv",
    "GridRotaryEmbedding",
    "MixerBlock",
    "PolylineAttention",
    "ProjectionHead",
    "elu_feature_map",
]
