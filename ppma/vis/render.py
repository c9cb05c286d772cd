"""Figures and GIFs of captured PPMA layers (matplotlib, Agg canvas; no pyplot, no global state).

Images are ``uint8`` arrays ``(h, w, 3)``; clips for 3-D models ``(T, h, w, 3)`` with ``T`` the
grid's depth. Grid maps are upsampled (bilinear) to the image and overlaid on it. Queries are image
points ``(x, y)`` in pixels of that image (plus a frame index for clips).

- :func:`decay_figure`: alpha and beta (gamma for 3-D) per layer (rows) and head (columns);
- :func:`mask_figure`: the mask row of a query for ``'v2h'``, ``'h2v'`` and ``'both'``;
- :func:`attention_figure`: the paper's Figure 8 per layer: input, alpha, beta,
  ``softmax(QK^T)``, mask row, masked attention (3-D: gamma too, one row per frame);
- :func:`query_gif`: input, mask row, plain and masked attention while the query moves.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError("ppma.vis renders with matplotlib: pip install 'ppma[vis]'") from err
from PIL import Image

from .capture import AttentionRecord
from .maps import attention_row, grid_query, mask_row

PANEL_INCHES = 2.0
DPI = 100
_MARKER = dict(marker="*", color="white", markeredgecolor="black", markersize=11, markeredgewidth=0.8)


def _frames(image: np.ndarray, rec: AttentionRecord, side: int) -> tuple[np.ndarray, float]:
    """``image`` as ``(T, h', w', 3)`` (``T = 1`` for a 2-D layer) shrunk to at most ``side`` px.

    Returns the frames and the factor from image to display pixels.
    """
    image = np.asarray(image)
    if rec.log_gamma is None:
        if image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"image must be a (h, w, 3) array for the 2-D layer {rec.name}, got shape {image.shape}")
        image = image[None]
    elif image.ndim != 4 or image.shape[0] != rec.grid_shape[0] or image.shape[-1] != 3:
        raise ValueError(
            f"image must be a (T={rec.grid_shape[0]}, h, w, 3) clip for the 3-D layer {rec.name}, "
            f"got shape {image.shape}"
        )
    scale = min(1.0, side / max(image.shape[1:3]))
    if scale == 1.0:
        return image, scale
    size = (max(1, round(image.shape[2] * scale)), max(1, round(image.shape[1] * scale)))
    return np.stack([np.asarray(Image.fromarray(f).resize(size, Image.BILINEAR)) for f in image]), scale


def _display_side(panel_inches: float, dpi: int) -> int:
    """Longest side, in pixels, of the images drawn in a panel (twice the panel's pixels)."""
    return int(2 * panel_inches * dpi)


def upsample(grid_map: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """Bilinear upsampling of a ``(H, W)`` map to ``size = (h, w)``; returns a float array."""
    up = F.interpolate(grid_map[None, None].float().cpu(), size=size, mode="bilinear", align_corners=False)
    return up[0, 0].numpy()


def _style(ax, title: str | None = None, ylabel: str | None = None) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    if title:
        ax.set_title(title, fontsize=8)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=7)


def _overlay(ax, frame: np.ndarray, grid_map: torch.Tensor, cmap: str, vmin=None, vmax=None) -> None:
    ax.imshow(frame)
    ax.imshow(upsample(grid_map, frame.shape[:2]), cmap=cmap, alpha=0.6, vmin=vmin, vmax=vmax)


def _new_figure(rows: int, cols: int, panel_inches: float, dpi: int):
    fig = Figure(figsize=(cols * panel_inches, rows * panel_inches), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def _range(t: torch.Tensor) -> str:
    return f"[{t.min().item():.3g}, {t.max().item():.3g}]"


def _decay_maps(rec: AttentionRecord, batch: int, head: int) -> dict[str, torch.Tensor]:
    """Decays in (0, 1] by name, each ``(H, W)`` or ``(T, H, W)``."""
    decays = {"alpha": rec.log_alpha, "beta": rec.log_beta}
    if rec.log_gamma is not None:
        decays["gamma"] = rec.log_gamma
    return {name: d[batch, head].exp().cpu() for name, d in decays.items()}


def _check_head(rec: AttentionRecord, head: int) -> None:
    if not 0 <= head < rec.num_heads:
        raise ValueError(f"head {head} is out of range: layer {rec.name} has {rec.num_heads} heads")


def _grid_cell(rec: AttentionRecord, query_xy, image: np.ndarray, frame: int) -> tuple[int, ...]:
    """The grid cell of the query ``(x, y)`` in pixels of ``image`` (plus ``frame`` for 3-D)."""
    cell = grid_query(query_xy, np.asarray(image).shape[-3:-1], rec.grid_shape)
    if rec.log_gamma is None:
        return cell
    if not 0 <= frame < rec.grid_shape[0]:
        raise ValueError(f"frame {frame} is out of range: layer {rec.name} has {rec.grid_shape[0]} frames")
    return (frame,) + cell


def _row_label(rec: AttentionRecord, t: int) -> str:
    return rec.name if rec.log_gamma is None else f"{rec.name}, t={t}"


def decay_figure(
    image: np.ndarray,
    records: Sequence[AttentionRecord],
    heads: Sequence[int] | None = None,
    batch: int = 0,
    frame: int = 0,
    panel_inches: float = PANEL_INCHES,
    dpi: int = DPI,
) -> Figure:
    """Decay maps overlaid on the image: one row per layer, ``len(decays) * len(heads)`` columns.

    ``heads``: which heads (default: all heads of the layer with the most). ``frame``: which
    frame of a 3-D layer's clip to show. Layers with fewer heads leave their extra panels empty.
    """
    if not records:
        raise ValueError("records is empty: capture at least one layer")
    heads = list(range(max(r.num_heads for r in records))) if heads is None else list(heads)
    n_decays = max(3 if r.log_gamma is not None else 2 for r in records)
    fig, axes = _new_figure(len(records), n_decays * len(heads), panel_inches, dpi)
    for row, rec in zip(axes, records):
        frames, _ = _frames(image, rec, _display_side(panel_inches, dpi))
        t = frame if rec.log_gamma is not None else 0
        for col, head in enumerate(heads):
            decays = list(_decay_maps(rec, batch, head).items()) if head < rec.num_heads else []
            for d, ax in enumerate(row[col * n_decays : (col + 1) * n_decays]):
                _style(ax, ylabel=rec.name if col == 0 and d == 0 else None)
                if d >= len(decays):
                    ax.set_visible(False)
                    continue
                name, decay = decays[d]
                decay = decay[t] if rec.log_gamma is not None else decay
                _overlay(ax, frames[t], decay, "viridis")
                _style(ax, title=f"head {head}: {name} {_range(decay)}")
    return fig


def mask_figure(
    image: np.ndarray,
    rec: AttentionRecord,
    query_xy: tuple[float, float],
    head: int = 0,
    batch: int = 0,
    frame: int = 0,
    panel_inches: float = PANEL_INCHES,
    dpi: int = DPI,
) -> Figure:
    """Mask row of the query for ``'v2h'``, ``'h2v'`` and ``'both'`` (3-D: one row per frame).

    Each colour scale spans the row's range (in the panel title).
    """
    _check_head(rec, head)
    query = _grid_cell(rec, query_xy, image, frame)
    frames, scale = _frames(image, rec, _display_side(panel_inches, dpi))
    rows = {
        order: mask_row(rec.log_alpha, rec.log_beta, query, order, rec.log_gamma)[batch, head].cpu()
        for order in ("v2h", "h2v", "both")
    }
    fig, axes = _new_figure(len(frames), 3, panel_inches, dpi)
    for t, row in enumerate(axes):
        for ax, (order, values) in zip(row, rows.items()):
            frame_values = values[t] if rec.log_gamma is not None else values
            _overlay(ax, frames[t], frame_values, "inferno", values.min().item(), values.max().item())
            ylabel = _row_label(rec, t) if order == "v2h" else None
            _style(ax, title=f"{order} mask row {_range(values)}", ylabel=ylabel)
            if t == frame or rec.log_gamma is None:
                ax.plot(query_xy[0] * scale, query_xy[1] * scale, **_MARKER)
    return fig


def figure8_panels(rec: AttentionRecord) -> list[str]:
    """Column titles of :func:`attention_figure` for this layer."""
    decays = ["alpha", "beta"] + (["gamma"] if rec.log_gamma is not None else [])
    return ["input"] + decays + [_plain_title(rec), "mask row", "masked attention"]


def _plain_title(rec: AttentionRecord) -> str:
    return "phi(Q)phi(K)^T" if rec.kind == "linear" else "softmax(QK^T)"


def _record_maps(rec: AttentionRecord, query, head: int, batch: int, order: str) -> dict[str, torch.Tensor]:
    """Per-head maps by panel key: decays, ``'plain'``, ``'mask'``, ``'masked'``; grid-shaped, on the CPU."""
    return {
        **_decay_maps(rec, batch, head),
        "plain": attention_row(rec, query, masked=False)[batch, head].cpu(),
        "mask": mask_row(rec.log_alpha, rec.log_beta, query, order, rec.log_gamma)[batch, head].cpu(),
        "masked": attention_row(rec, query, masked=True)[batch, head].cpu(),
    }


def _draw_row(axes, keys, frame_img, t, rec, maps, marker_xy, order, ylabel) -> None:
    """One row of panels: ``keys`` from ``'input'``, decay names, ``'plain'``, ``'mask'``, ``'masked'``.

    Attention panels are scaled from 0 to their maximum, the mask from its minimum to its maximum
    (the title gives the range); scales are shared over a 3-D layer's frames. ``marker_xy``
    (display pixels, or None) marks the query.
    """
    titles = {"plain": _plain_title(rec), "mask": f"mask row ({order})", "masked": "masked attention"}
    for ax, key in zip(axes, keys):
        if key == "input":
            ax.imshow(frame_img)
            _style(ax, title="input", ylabel=ylabel)
        else:
            values = maps[key][t] if rec.log_gamma is not None else maps[key]
            if key == "mask":  # stretched to its range, which the title gives
                _overlay(ax, frame_img, values, "inferno", maps[key].min().item(), maps[key].max().item())
                _style(ax, title=f"{titles[key]} {_range(maps[key])}")
            elif key in titles:
                _overlay(ax, frame_img, values, "jet", 0.0, maps[key].max().item())
                _style(ax, title=titles[key])
            else:
                _overlay(ax, frame_img, values, "viridis")
                _style(ax, title=f"{key} {_range(values)}")
                continue
        if marker_xy is not None:
            ax.plot(*marker_xy, **_MARKER)


def attention_figure(
    image: np.ndarray,
    records: Sequence[AttentionRecord],
    query_xy: tuple[float, float],
    head: int = 0,
    order: str = "both",
    batch: int = 0,
    frame: int = 0,
    panel_inches: float = PANEL_INCHES,
    dpi: int = DPI,
) -> Figure:
    """The paper's Figure 8 for one query: one row per layer (per layer and frame for 3-D).

    Columns (:func:`figure8_panels`): input with the query, alpha, beta (and gamma for 3-D),
    attention without the mask, the mask row of ``order``, the masked attention (see
    :mod:`ppma.vis.maps` for each kind's formula). Colour scales of a layer's attention and mask
    panels are shared across its frames.
    """
    if not records:
        raise ValueError("records is empty: capture at least one layer")
    side = _display_side(panel_inches, dpi)
    layers = []
    for rec in records:
        _check_head(rec, head)
        query = _grid_cell(rec, query_xy, image, frame)
        layers.append((rec, *_frames(image, rec, side), _record_maps(rec, query, head, batch, order)))
    n_rows = sum(len(frames) for _, frames, _, _ in layers)
    fig, axes = _new_figure(n_rows, max(len(figure8_panels(rec)) for rec in records), panel_inches, dpi)
    row_axes = iter(axes)
    for rec, frames, scale, maps in layers:
        keys = ["input", *_decay_maps(rec, batch, head), "plain", "mask", "masked"]
        for t, frame_img in enumerate(frames):
            row = next(row_axes)
            for ax in row[len(keys) :]:
                ax.set_visible(False)
            marker = (query_xy[0] * scale, query_xy[1] * scale) if rec.log_gamma is None or t == frame else None
            _draw_row(row, keys, frame_img, t, rec, maps, marker, order, f"{_row_label(rec, t)}, head {head}")
    return fig


def figure_to_image(fig: Figure) -> Image.Image:
    """Render a figure to an RGB PIL image of ``figsize * dpi`` pixels."""
    fig.canvas.draw()
    return Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy())


def raster_queries(image_size: tuple[int, int], steps: tuple[int, int] = (4, 4)) -> list[tuple[float, float]]:
    """Query points ``(x, y)`` on a serpentine ``steps = (rows, cols)`` raster over ``(h, w)``."""
    height, width = image_size
    rows, cols = steps
    if rows < 1 or cols < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    points = []
    for r in range(rows):
        y = (r + 0.5) * height / rows
        xs = [(c + 0.5) * width / cols for c in range(cols)]
        points += [(x, y) for x in (xs if r % 2 == 0 else xs[::-1])]
    return points


def query_gif(
    image: np.ndarray,
    rec: AttentionRecord,
    queries_xy: Sequence[tuple[float, float]],
    path: str | Path,
    head: int = 0,
    order: str = "both",
    batch: int = 0,
    frame: int = 0,
    duration_ms: int = 400,
    panel_inches: float = PANEL_INCHES,
    dpi: int = 60,
) -> Path:
    """Write a GIF, one frame per query: input with the query, mask row, plain and masked attention.

    3-D layers show one row per clip frame. Returns ``path``.
    """
    if not queries_xy:
        raise ValueError("queries_xy is empty: give at least one query point")
    _check_head(rec, head)
    frames, scale = _frames(image, rec, _display_side(panel_inches, dpi))
    images = []
    for query_xy in queries_xy:
        maps = _record_maps(rec, _grid_cell(rec, query_xy, image, frame), head, batch, order)
        fig, axes = _new_figure(len(frames), 4, panel_inches, dpi)
        for t, row in enumerate(axes):
            marker = (query_xy[0] * scale, query_xy[1] * scale) if rec.log_gamma is None or t == frame else None
            keys = ("input", "mask", "plain", "masked")
            _draw_row(row, keys, frames[t], t, rec, maps, marker, order, _row_label(rec, t))
        images.append(figure_to_image(fig).quantize(colors=128))
    path = Path(path)
    images[0].save(path, save_all=True, append_images=images[1:], duration=duration_ms, loop=0)
    return path
