"""VMamba's four scan routes over a 2-D map, and their adjoint (written for clarity).

Routes over a ``(B, C, H, W)`` map, each a sequence of the ``L = H * W`` positions:
0: row-major (``(0,0), (0,1), ...``), 1: column-major (``(0,0), (1,0), ...``), 2: route 0
reversed, 3: route 1 reversed.
"""
from __future__ import annotations

import torch


def cross_scan_reference(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, 4, C, H*W)``: the map read along the four routes."""
    rows = x.flatten(2)
    cols = x.transpose(2, 3).flatten(2)
    return torch.stack([rows, cols, rows.flip(-1), cols.flip(-1)], dim=1)


def cross_merge_reference(y: torch.Tensor) -> torch.Tensor:
    """``(B, 4, C, H, W)`` -> ``(B, C, H, W)``: every route's sequence put back on the map, summed.

    ``y[:, k]`` holds route ``k``'s sequence (length ``H*W``) viewed as ``(H, W)``, i.e. the
    ``(B, 4, C, H*W)`` scan output ``.view(B, 4, C, H, W)``. This is the adjoint of
    :func:`cross_scan_reference`: ``<cross_scan(x), y> = <x, cross_merge(y)>``.
    """
    batch, _, channels, height, width = y.shape
    seq = y.flatten(3)
    rows = seq[:, 0] + seq[:, 2].flip(-1)
    cols = seq[:, 1] + seq[:, 3].flip(-1)
    return rows.view(batch, channels, height, width) + cols.view(batch, channels, width, height).transpose(2, 3)
