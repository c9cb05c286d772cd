"""Stem and downsampler of the PPMA release (convolutional, BatchNorm)."""
from __future__ import annotations

import torch
from torch import nn


class ConvStem(nn.Module):
    """Four 3x3 convs (strides 2, 1, 2, 1) with BatchNorm, GELU between: stride 4.

    Forward: ``(B, in_chans, H, W)`` -> channels-last ``(B, ceil(H/4), ceil(W/4), dim)``;
    widths ``dim // 2, dim // 2, dim, dim``.
    """

    def __init__(self, in_chans: int, dim: int):
        super().__init__()
        half = dim // 2
        self.conv1 = nn.Conv2d(in_chans, half, 3, 2, 1)
        self.norm1 = nn.BatchNorm2d(half)
        self.conv2 = nn.Conv2d(half, half, 3, 1, 1)
        self.norm2 = nn.BatchNorm2d(half)
        self.conv3 = nn.Conv2d(half, dim, 3, 2, 1)
        self.norm3 = nn.BatchNorm2d(dim)
        self.conv4 = nn.Conv2d(dim, dim, 3, 1, 1)
        self.norm4 = nn.BatchNorm2d(dim)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm1(self.conv1(x)))
        x = self.act(self.norm2(self.conv2(x)))
        x = self.act(self.norm3(self.conv3(x)))
        return self.norm4(self.conv4(x)).permute(0, 2, 3, 1)


class ConvDownsample(nn.Module):
    """3x3 stride-2 conv + BatchNorm between stages.

    Forward: channels-last ``(B, H, W, in_dim)`` -> ``(B, ceil(H/2), ceil(W/2), out_dim)``.
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, 3, 2, 1)
        self.norm = nn.BatchNorm2d(out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x.permute(0, 3, 1, 2))).permute(0, 2, 3, 1)
