"""Token layouts: the tensor shape a token mixer works on, declared by the mixer.

Every mixer a backbone builds has an attribute ``token_layout``, one of:

- ``GRID_2D`` (``'2d'``): channels-last image grid ``(B, H, W, C)``;
- ``GRID_3D`` (``'3d'``): channels-last clip/volume grid ``(B, T, H, W, C)``;
- ``SEQUENCE`` (``'sequence'``): token sequence ``(B, N, C)``; prefix tokens (a class token)
  come first, ``N = num_prefix_tokens + number of patches``.

:class:`~ppma.models.HierarchicalBackbone` takes grid mixers, :class:`~ppma.models.PlainBackbone`
sequence mixers; both check the declaration when they build a block.
"""
from __future__ import annotations

from torch import nn

from ppma._deprecation import renamed_attributes

GRID_2D = "2d"
GRID_3D = "3d"
SEQUENCE = "sequence"
GRID_LAYOUTS = (GRID_2D, GRID_3D)
LAYOUTS = (GRID_2D, GRID_3D, SEQUENCE)
SHAPES = {GRID_2D: "(B, H, W, C)", GRID_3D: "(B, T, H, W, C)", SEQUENCE: "(B, N, C)"}


def check_mixer_layout(mixer: nn.Module, expected: str) -> None:
    """Raise ``ValueError`` unless ``mixer.token_layout == expected``."""
    layout = getattr(mixer, "token_layout", None)
    if layout not in LAYOUTS:
        raise ValueError(
            f"{type(mixer).__name__} must declare token_layout, one of {LAYOUTS} (ppma.layers.layout), got {layout!r}"
        )
    if layout != expected:
        raise ValueError(
            f"{type(mixer).__name__} works on {layout!r} tokens {SHAPES[layout]}, "
            f"but this backbone feeds {expected!r} tokens {SHAPES[expected]}"
        )


__getattr__ = renamed_attributes(__name__, globals(), {"GRIDS": "GRID_LAYOUTS"})
