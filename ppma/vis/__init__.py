"""Visualization of PPMA: decay factors, polyline path masks and attention maps (paper Figure 8).

``capture_attention`` records what the attention layers compute (hooks, no model changes);
:mod:`ppma.vis.maps` turns a record into per-query maps in O(N); :mod:`ppma.vis.render` draws
figures and GIFs (needs the ``vis`` extra: matplotlib, pillow; imported on first use, so capture
and maps work without it); :mod:`ppma.vis.loading` reads images and checkpoints for the demo and
the tools.
"""
import importlib

from .capture import AttentionRecord, attention_layers, capture_attention, last_per_stage, select_layers
from .maps import attention_row, check_point, grid_query, mask_row

_RENDER = (
    "attention_figure",
    "decay_figure",
    "figure8_panels",
    "figure_to_image",
    "mask_figure",
    "query_gif",
    "raster_queries",
)


def __getattr__(name):
    if name in _RENDER:
        return getattr(importlib.import_module(".render", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AttentionRecord",
    "attention_layers",
    "attention_row",
    "capture_attention",
    "check_point",
    "grid_query",
    "last_per_stage",
    "mask_row",
    "select_layers",
    *_RENDER,
]
