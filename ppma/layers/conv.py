"""Depthwise convolution on channels-last token grids (PPMA's positional conv, LePE, FFN conv)."""
from __future__ import annotations

import torch
from torch import nn


class GridDepthwiseConv(nn.Conv2d):
    """``k x k`` depthwise conv (stride 1, 'same' padding, bias) on a channels-last grid.

    Forward: ``(B, H, W, C)`` -> ``(B, H, W, C)``; a 3-D grid ``(B, T, H, W, C)`` is convolved
    frame by frame with the same 2-D kernel (so 2-D weights carry over to 3-D models).
    Parameters are those of ``nn.Conv2d(C, C, k, padding=k // 2, groups=C)``.
    """

    def __init__(self, dim: int, kernel_size: int):
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        super().__init__(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.flatten(0, -4)  # (B*T, H, W, C); a no-op for (B, H, W, C)
        y = self._conv_forward(frames.permute(0, 3, 1, 2), self.weight, self.bias).permute(0, 2, 3, 1)
        return y.reshape(x.shape)
