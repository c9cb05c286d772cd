"""Rotary position embedding over the raster index of a 2-D (or 3-D) token grid, as in the PPMA release."""
from __future__ import annotations

import math

import torch
from torch import nn


class RasterRotaryEmbedding(nn.Module):
    """Rotary embedding (RoPE) of the released PPMA models: 1-D RoPE over the raster index.

    Position of token ``(i, j)`` on an ``H x W`` grid is its raster index ``p = i * W + j``
    (3-D: ``p = (t * H + i) * W + j``); channel pair ``(2m, 2m+1)`` of a head is rotated by
    ``p * theta_m`` with ``theta_m = 10000 ** (-m / (d/2 - 1))``, ``m = 0 .. d/2 - 1``
    (``d = head_dim``)::

        rope(x)[2m]   = x[2m] cos(p theta_m) - x[2m+1] sin(p theta_m)
        rope(x)[2m+1] = x[2m+1] cos(p theta_m) + x[2m] sin(p theta_m)

    No parameters. Forward: ``x`` ``(..., *grid, head_dim)`` -> same shape (several tensors on
    the same grid -> a tuple, e.g. ``q, k = rope(q, k)``); the angles are computed once, in
    fp32, for the grid ``x.shape[-1 - len(grid):-1]``.
    """

    def __init__(self, head_dim: int, grid_rank: int = 2, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for the rotary embedding, got {head_dim}")
        self.head_dim = head_dim
        self.grid_rank = grid_rank
        theta = base ** -torch.linspace(0, 1, head_dim // 2)
        self.register_buffer("theta", theta.repeat_interleave(2), persistent=False)

    def sin_cos(self, grid: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sin, cos)``, each fp32 ``(*grid, head_dim)``."""
        index = torch.arange(math.prod(grid), device=device, dtype=torch.float32)
        angle = index[:, None] * self.theta.to(device=device, dtype=torch.float32)[None, :]
        return angle.sin().reshape(*grid, -1), angle.cos().reshape(*grid, -1)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Rotate each of ``xs`` (same grid); the angles are computed once for all of them."""
        grid = tuple(xs[0].shape[-1 - self.grid_rank : -1])
        sin, cos = self.sin_cos(grid, xs[0].device)
        out = tuple(self._rotate(x, sin, cos) for x in xs)
        return out[0] if len(out) == 1 else out

    @staticmethod
    def _rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
        pairs = x.unflatten(-1, (-1, 2))
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        return (x * cos + rotated * sin).to(x.dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, grid_rank={self.grid_rank}"
