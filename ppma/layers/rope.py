"""Rotary position embedding over the raster index of a 2-D (or 3-D) token grid, as in the PPMA release."""
from __future__ import annotations

import math

import torch
from torch import nn

from ppma.ops import rotary_qk
from ppma.ops.rotary_qk_impl import rotate_pairs

from .grid_tables import cached_per_grid


def frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """fp32 ``(head_dim // 2,)``: ``theta_m = base ** (-m / (d/2 - 1))`` (CPU; the release's)."""
    return base ** -torch.linspace(0, 1, head_dim // 2)


@cached_per_grid
def raster_rotation(grid: tuple[int, ...], head_dim: int, base: float, device: torch.device) -> torch.Tensor:
    """complex64 ``(*grid, head_dim // 2)``: ``cos(p theta_m) + i sin(p theta_m)`` at raster index
    ``p``; cached per grid in eager calls (:func:`~ppma.layers.grid_tables.cached_per_grid`)."""
    index = torch.arange(math.prod(grid), device=device, dtype=torch.float32)
    angle = index[:, None] * frequencies(head_dim, base).to(device)[None, :]
    return torch.complex(angle.cos(), angle.sin()).reshape(*grid, -1)


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
        self.base = base
        self.register_buffer("theta", frequencies(head_dim, base).repeat_interleave(2), persistent=False)

    def rotation(self, grid: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """``cos(p theta_m) + i sin(p theta_m)``, complex64 ``(*grid, head_dim // 2)`` (:func:`raster_rotation`)."""
        return raster_rotation(tuple(grid), self.head_dim, self.base, torch.device(device))

    def forward(self, *xs: torch.Tensor, inplace: bool = False) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Rotate each of ``xs`` (same grid); the angles are computed once for all of them.

        ``inplace``: rotate contiguous fp32/fp64 tensors in place and return them (for tensors the
        caller owns, e.g. a layer's fresh copies of ``q`` and ``k``); other tensors (half, bf16,
        strided) are rotated into new ones as without it.
        """
        grid = tuple(xs[0].shape[-1 - self.grid_rank : -1])
        rotation = self.rotation(grid, xs[0].device)
        out = tuple(self._rotate(x, rotation, inplace) for x in xs)
        return out[0] if len(out) == 1 else out

    @staticmethod
    def _rotate(x: torch.Tensor, rotation: torch.Tensor, inplace: bool) -> torch.Tensor:
        """Channel pairs ``(2m, 2m+1)`` of ``x`` as complex numbers times ``rotation``: one pass
        over ``x`` (in fp32 for half and bf16, fp64 kept), the result in ``x``'s dtype."""
        if inplace and x.dtype in (torch.float32, torch.float64) and x.is_contiguous():
            torch.view_as_complex(x.unflatten(-1, (-1, 2))).mul_(rotation)
            return x
        return rotate_pairs(x, rotation)

    def rotate_qk(self, q: torch.Tensor, k: torch.Tensor, k_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rope(q), rope(k * k_scale))`` of ``q``, ``k`` ``(B, heads, *grid, head_dim)``, contiguous,
        through one op (:func:`ppma.ops.rotary_qk`; on a GPU one Triton launch each way, where the
        forward above dispatches about seven kernels and its backward about nine)."""
        grid = tuple(q.shape[-1 - self.grid_rank : -1])
        return rotary_qk(q, k, torch.view_as_real(self.rotation(grid, q.device)), k_scale)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, grid_rank={self.grid_rank}"
