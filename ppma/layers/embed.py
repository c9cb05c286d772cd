"""Stems and downsampler: the PPMA release's (convolutional, BatchNorm) and a patch stem for token sequences."""
from __future__ import annotations

import torch
from timm.layers import resample_abs_pos_embed, trunc_normal_
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


class PatchStem(nn.Module):
    """Non-overlapping patches -> token sequence, with an optional class token and position embedding.

    ``proj`` is a ``patch_size`` x ``patch_size`` conv of stride ``patch_size``; the class token
    ``cls_token`` ``(1, 1, dim)`` is prepended; the learned absolute position embedding
    ``pos_embed`` ``(1, num_prefix_tokens + g*g, dim)``, ``g = img_size // patch_size``, is added
    to all tokens, resampled (bicubic, timm's ``resample_abs_pos_embed``) for other grids.

    Forward: ``(B, in_chans, H, W)`` -> ``(B, num_prefix_tokens + h*w, dim)``,
    ``h, w = H // patch_size, W // patch_size``.
    """

    def __init__(
        self, in_chans: int, dim: int, patch_size: int = 16, img_size: int = 224,
        class_token: bool = True, pos_embed: bool = True,
    ):
        super().__init__()
        self.patch_size = patch_size
        self.num_prefix_tokens = int(class_token)
        self.proj = nn.Conv2d(in_chans, dim, patch_size, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if class_token else None
        grid = img_size // patch_size
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + grid * grid, dim)) if pos_embed else None
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        grid = x.shape[2:]
        x = x.flatten(2).transpose(1, 2)  # (B, h*w, dim)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_embed is not None:
            x = x + resample_abs_pos_embed(self.pos_embed, grid, num_prefix_tokens=self.num_prefix_tokens)
        return x
