"""Convolutional feed-forward network of the PPMA release."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .conv import GridDepthwiseConv


class ConvFFN(nn.Module):
    """``fc2(h + dwconv3x3(h))`` with ``h = gelu(fc1(x))``.

    Forward: ``(B, H, W, C)`` (3-D: ``(B, T, H, W, C)``) -> same shape; hidden width
    ``hidden_dim``. ``h + dwconv(h)`` is :meth:`GridDepthwiseConv.plus_input` (in CPU inference ``h``
    is added into the conv's own output: no third hidden-size tensor).
    """

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.dwconv = GridDepthwiseConv(hidden_dim, 3)
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        return self.fc2(self.dwconv.plus_input(h))
