"""Stems and downsampler: the PPMA release's (convolutional, BatchNorm) and a patch stem for token sequences."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.fx
from timm.layers import resample_abs_pos_embed, trunc_normal_
from torch import nn

from .conv import channels_last_weight


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
        self.conv = channels_last_weight(nn.Conv2d(in_dim, out_dim, 3, 2, 1))
        self.norm = nn.BatchNorm2d(out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x.permute(0, 3, 1, 2))).permute(0, 2, 3, 1)


CLASS_TOKEN_POSITIONS = ("first", "middle")


class PatchStem(nn.Module):
    """Patches -> token sequence, with an optional class token and position embedding.

    ``proj`` is a ``patch_size`` x ``patch_size`` conv of stride ``stride`` (default
    ``patch_size``: non-overlapping; Vim's stride-8 models overlap 16-pixel patches); the class
    token ``cls_token`` ``(1, 1, dim)`` is inserted at ``class_token_position``: ``'first'``
    (ViT) or ``'middle'`` (Vim: index ``h*w // 2``, between the first and second half of the
    raster patches); the learned absolute position embedding ``pos_embed``
    ``(1, num_prefix_tokens + g*g, dim)`` (class token entry at the same position), ``g`` the
    patch grid of ``img_size``, is added to all tokens, its patch part resampled (bicubic, timm's
    ``resample_abs_pos_embed``) for other grids (:func:`resample_pos_embed`).

    Forward: ``(B, in_chans, H, W)`` -> ``(B, num_prefix_tokens + h*w, dim)``,
    ``h, w = grid(H, W) = ((H - patch_size) // stride + 1, (W - patch_size) // stride + 1)``.
    """

    def __init__(
        self, in_chans: int, dim: int, patch_size: int = 16, img_size: int = 224,
        class_token: bool = True, pos_embed: bool = True, stride: int | None = None,
        class_token_position: str = "first",
    ):
        super().__init__()
        if class_token_position not in CLASS_TOKEN_POSITIONS:
            raise ValueError(
                f"class_token_position must be one of {CLASS_TOKEN_POSITIONS}, got {class_token_position!r}")
        self.patch_size = patch_size
        self.stride = stride or patch_size
        self.num_prefix_tokens = int(class_token)
        self.class_token_position = class_token_position
        self.proj = nn.Conv2d(in_chans, dim, patch_size, self.stride)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if class_token else None
        self.pos_grid = self.grid(img_size, img_size)
        num_pos = self.num_prefix_tokens + self.pos_grid[0] * self.pos_grid[1]
        self.pos_embed = nn.Parameter(torch.zeros(1, num_pos, dim)) if pos_embed else None
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=0.02)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid ``(h, w)`` of an ``height x width`` input."""
        return (height - self.patch_size) // self.stride + 1, (width - self.patch_size) // self.stride + 1

    def class_index(self, num_tokens: int) -> int:
        """Index of the class token in a sequence of ``num_tokens`` tokens (class token included)."""
        return (num_tokens - 1) // 2 if self.class_token_position == "middle" else 0

    def patch_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, num_prefix_tokens + h*w, C)`` -> the patch tokens ``(B, h*w, C)``, in raster order."""
        if self.cls_token is None:
            return x
        i = self.class_index(x.shape[1])
        return torch.cat([x[:, :i], x[:, i + 1 :]], dim=1)

    def class_token_first(self, x: torch.Tensor) -> torch.Tensor:
        """The same tokens with the class token (wherever it sits) moved to the front (timm's layout)."""
        if self.cls_token is None or self.class_token_position == "first":
            return x
        i = self.class_index(x.shape[1])
        return torch.cat([x[:, i : i + 1], x[:, :i], x[:, i + 1 :]], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        grid = x.shape[2:]
        x = x.flatten(2).transpose(1, 2)  # (B, h*w, dim)
        if self.cls_token is not None:
            i = self.class_index(x.shape[1] + 1)
            x = torch.cat([x[:, :i], self.cls_token.expand(x.shape[0], -1, -1), x[:, i:]], dim=1)
        if self.pos_embed is not None:
            x = x + resample_pos_embed(self.pos_embed, grid, self.pos_grid, self.num_prefix_tokens,
                                       self.class_token_position)
        return x


def resample_pos_embed(
    pos_embed: torch.Tensor, grid: Sequence[int], old_grid: Sequence[int], num_prefix_tokens: int = 1,
    class_token_position: str = "first",
) -> torch.Tensor:
    """Position embedding ``(1, num_prefix_tokens + old_h*old_w, C)`` of an ``old_grid`` for ``grid``.

    The patch entries are resampled bicubically on the grid (timm's ``resample_abs_pos_embed``);
    the class token entry (``num_prefix_tokens`` 0 or 1) stays where it sits: first, or in the
    middle (``old_h*old_w // 2`` -> ``h*w // 2``). Returned as is when the grids are equal, except
    while exporting (the resize to the same grid is exact and keeps the exported grid dynamic).
    """
    grid, old_grid = tuple(grid), tuple(old_grid)
    # under torch.export the grid is symbolic: comparing it would fix it to the example's (checked first)
    if not torch.compiler.is_exporting() and grid == old_grid:
        return pos_embed
    if num_prefix_tokens and class_token_position == "middle":
        i = (pos_embed.shape[1] - 1) // 2
        cls, patches = pos_embed[:, i : i + 1], torch.cat([pos_embed[:, :i], pos_embed[:, i + 1 :]], dim=1)
        patches = resample_abs_pos_embed(patches, list(grid), list(old_grid), num_prefix_tokens=0)
        j = patches.shape[1] // 2
        return torch.cat([patches[:, :j], cls, patches[:, j:]], dim=1)
    return resample_abs_pos_embed(pos_embed, list(grid), list(old_grid), num_prefix_tokens=num_prefix_tokens)


torch.fx.wrap("resample_pos_embed")  # traced models call it with the real grid
