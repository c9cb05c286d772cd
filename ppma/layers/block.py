"""Residual blocks around a token mixer: on a grid (PPMA release layout) and on a sequence."""
from __future__ import annotations

import torch
from timm.layers import DropPath, LayerScale, Mlp
from torch import nn

from .conv import GridDepthwiseConv
from .ffn import ConvFFN


class MixerBlock(nn.Module):
    """``x += pos(x); x += drop(ls1(mixer(norm1(x)))); x += drop(ls2(mlp(norm2(x))))``.

    ``pos`` is a 3x3 depthwise conv, norms are LayerNorm (eps 1e-6), ``mlp`` the
    :class:`ConvFFN` with ``int(mlp_ratio * dim)`` hidden channels, ``ls1``/``ls2`` layer scale
    (initialised to ``layerscale_init``) when ``layerscale`` else identity.

    Args:
        dim: channels ``C``.
        mixer: token mixer ``(B, *grid, C) -> (B, *grid, C)``, e.g. :class:`PolylineAttention`.

    Forward: ``(B, H, W, C)`` (3-D: ``(B, T, H, W, C)``) -> same shape.
    """

    def __init__(
        self,
        dim: int,
        mixer: nn.Module,
        mlp_ratio: float = 3.0,
        drop_path: float = 0.0,
        layerscale: bool = False,
        layerscale_init: float = 1e-6,
    ):
        super().__init__()
        self.pos_conv = GridDepthwiseConv(dim, 3)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.mixer = mixer
        self.ls1 = LayerScale(dim, layerscale_init) if layerscale else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ConvFFN(dim, int(mlp_ratio * dim))
        self.ls2 = LayerScale(dim, layerscale_init) if layerscale else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the residuals of pos_conv (GridDepthwiseConv.plus_input) and mlp are added into their fresh
        # outputs (which their backward does not need); the mixer's output is any module's, so its sum is a new tensor
        x = self.pos_conv.plus_input(x)
        x = x + self.drop_path1(self.ls1(self.mixer(self.norm1(x))))
        return self.drop_path2(self.ls2(self.mlp(self.norm2(x)))).add_(x)



class SequenceBlock(nn.Module):
    """``x += drop(ls1(mixer(norm1(x)))); x += drop(ls2(mlp(norm2(x))))`` on a token sequence.

    Pre-norm transformer block: LayerNorm (eps 1e-6), timm ``Mlp`` (GELU) with
    ``int(mlp_ratio * dim)`` hidden channels, layer scale when ``layerscale``.

    Forward: ``(B, N, C)`` -> ``(B, N, C)``; the mixer sees all ``N`` tokens (prefix tokens first).
    """

    def __init__(
        self,
        dim: int,
        mixer: nn.Module,
        mlp_ratio: float = 4.0,
        drop_path: float = 0.0,
        layerscale: bool = False,
        layerscale_init: float = 1e-6,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.mixer = mixer
        self.ls1 = LayerScale(dim, layerscale_init) if layerscale else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(mlp_ratio * dim))
        self.ls2 = LayerScale(dim, layerscale_init) if layerscale else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.mixer(self.norm1(x))))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
