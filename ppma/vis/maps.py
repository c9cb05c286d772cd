"""The maps the figures show, computed for one query at a time in O(N) memory.

A query is a grid cell: ``(i, j)`` on a 2-D grid, ``(t, i, j)`` on a 3-D grid. Every map has the
grid's shape, ``(B, heads, H, W)`` (3-D: ``(B, heads, T, H, W)``), and is row ``query`` of an
``N x N`` matrix that is never formed:

- :func:`mask_row`: row of the polyline path mask (``'v2h'``, ``'h2v'`` or ``'both'``), from
  :func:`ppma.ops.polyline_scan` on a one-hot input (``L^T e_q`` is row ``q`` of ``L``);
- :func:`attention_row`: the attention weights the layer gives each key, without the mask
  (``softmax(QK^T)``; for the linear kind its normalised kernel) or with it, for every kind:

  - ``'vanilla'``, ``form='official'``:
    ``0.5*softmax(s + log L_v2h[q]) + 0.5*softmax(s + log L_h2v[q])`` with ``s = q_q . k``;
    ``form='paper'``: ``softmax(s) * L2D[q]``;
  - ``'criss_cross'`` (1-D attentions along each axis with their 1-D masks, output
    ``0.5 * A_W A_H V + 0.5 * A_H A_W V``): the implied weight of key ``(k, l)`` for query
    ``(i, j)`` is ``0.5*(Aw_i[j,l] Ah_l[i,k] + Ah_j[i,k] Aw_k[j,l])``, ``Aw_r`` the row
    attention of row ``r`` and ``Ah_c`` the column attention of column ``c`` (3-D: the same
    with three factors, ``A_W A_H A_T`` and ``A_T A_H A_W``);
  - ``'linear'``: ``L2D[q,m] phi(q_q).phi(k_m) / sum_m' L2D[q,m'] phi(q_q).phi(k_m')``.
"""
from __future__ import annotations

import torch

from ppma.ops import decay_scan_1d, polyline_scan

from .capture import AttentionRecord


def check_point(xy: tuple[float, float], image_size: tuple[int, int]) -> None:
    """Raise ``ValueError`` unless the point ``(x, y)`` lies inside an image of ``(height, width)``."""
    x, y = xy
    height, width = image_size
    if not (0 <= x < width and 0 <= y < height):
        raise ValueError(f"query (x={x:g}, y={y:g}) lies outside the image of width {width} and height {height}")


def grid_query(xy: tuple[float, float], image_size: tuple[int, int], grid_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Map an image point ``(x, y)`` in pixels to the grid cell ``(i, j)`` that covers it.

    ``image_size``: ``(height, width)`` of the image the point lives in; ``grid_shape``: ``(H, W)``
    or ``(T, H, W)`` (then the result is ``(i, j)`` and the caller adds ``t``).
    Raises ``ValueError`` when the point lies outside the image.
    """
    check_point(xy, image_size)
    x, y = xy
    height, width = image_size
    grid_h, grid_w = grid_shape[-2:]
    return min(int(y * grid_h / height), grid_h - 1), min(int(x * grid_w / width), grid_w - 1)


def _check_query(query: tuple[int, ...], grid_shape: tuple[int, ...]) -> None:
    if len(query) != len(grid_shape) or not all(0 <= q < n for q, n in zip(query, grid_shape)):
        raise ValueError(f"query {tuple(query)} is not a cell of the grid {tuple(grid_shape)}")


def _one_hot(grid_shape: tuple[int, ...], query: tuple[int, ...], batch: int, heads: int, device=None) -> torch.Tensor:
    """``(batch, heads, *grid_shape, 1)`` fp32 zeros with a one at ``query``."""
    _check_query(query, grid_shape)
    x = torch.zeros(batch, heads, *grid_shape, 1, device=device)
    x[(slice(None), slice(None)) + tuple(query)] = 1.0
    return x


def mask_row(
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    query: tuple[int, ...],
    order: str = "both",
    log_gamma: torch.Tensor | None = None,
) -> torch.Tensor:
    """Row ``query`` of the polyline mask of ``order``: decays' shape ``(B, heads, [T,] H, W)``.

    Row ``q`` of ``L`` is ``L^T e_q``; ``L_v2h^T = L_h2v`` and ``L2D`` is symmetric.
    """
    transposed = {"v2h": "h2v", "h2v": "v2h", "both": "both"}
    if order not in transposed:
        raise ValueError(f"order must be one of {tuple(transposed)}, got {order!r}")
    b, heads = log_alpha.shape[:2]
    e = _one_hot(tuple(log_alpha.shape[2:]), query, b, heads, log_alpha.device)
    return polyline_scan(e, log_alpha, log_beta, order=transposed[order], log_gamma=log_gamma)[..., 0]


def _log_mask_row(rec: AttentionRecord, query, order: str) -> torch.Tensor:
    # A mask entry below fp32's range becomes -inf: a weight that is zero at this precision anyway.
    return mask_row(rec.log_alpha, rec.log_beta, query, order, rec.log_gamma).log()


def _query_vector(t: torch.Tensor, query) -> torch.Tensor:
    """``t`` ``(B, heads, *grid, d)`` -> ``(B, heads, d)`` at ``query``."""
    return t[(slice(None), slice(None)) + tuple(query)]


def _scores(rec: AttentionRecord, query) -> torch.Tensor:
    """Logits ``q_query . k_m`` for every key ``m``: ``(B, heads, *grid)`` in fp32."""
    q = _query_vector(rec.q, query).float()
    return torch.einsum("bhd,bh...d->bh...", q, rec.k.float())


def _grid_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over all grid dims of ``(B, heads, *grid)``."""
    return x.flatten(2).softmax(-1).view_as(x)


def _vanilla_row(rec: AttentionRecord, query, masked: bool) -> torch.Tensor:
    s = _scores(rec, query)
    if not masked:
        return _grid_softmax(s)
    if rec.form == "official":
        return 0.5 * _grid_softmax(s + _log_mask_row(rec, query, "v2h")) + 0.5 * _grid_softmax(
            s + _log_mask_row(rec, query, "h2v")
        )
    if rec.form == "paper":
        return _grid_softmax(s) * mask_row(rec.log_alpha, rec.log_beta, query, "both", rec.log_gamma)
    raise ValueError(f"{rec.name}: unknown form {rec.form!r}, expected 'official' or 'paper'")


def _fix(t: torch.Tensor, query, axes) -> torch.Tensor:
    """Select ``query``'s index along each grid axis in ``axes`` of ``t`` ``(B, heads, *grid, ...)``, keeping dims."""
    for a in axes:
        t = t.narrow(2 + a, query[a], 1)
    return t


def _path_weights(rec: AttentionRecord, query, order, masked: bool) -> torch.Tensor:
    """Weight of every key for ``query`` under ``A_{a_r} ... A_{a_1}`` (``order = (a_1, ..., a_r)``).

    The path from key ``m`` runs along ``a_1`` to the query's coordinate, then along ``a_2``, ...;
    at step ``p`` the 1-D attention of axis ``a_p`` is taken on the line through ``m`` with
    coordinates ``a_1 .. a_{p-1}`` already set to the query's: its query is that line's point at
    the query's ``a_p`` coordinate. Returns ``(B, heads, *grid)``.
    """
    decays = (rec.log_gamma, rec.log_beta, rec.log_alpha)[-len(rec.grid_shape) :]  # per grid axis
    q, k = rec.q.float(), rec.k.float()
    weight = None
    for p, a in enumerate(order):
        logits = (_fix(q, query, order[: p + 1]) * _fix(k, query, order[:p])).sum(-1)
        if masked:
            log_decay = _fix(decays[a], query, order[:p])
            e = torch.zeros(*log_decay.shape, 1, device=log_decay.device)
            e.narrow(2 + a, query[a], 1).fill_(1.0)
            mask = decay_scan_1d(e, log_decay, dim=2 + a)[..., 0]  # row query[a] of each line's mask
            if rec.form == "official":
                step = (logits + mask.log()).softmax(2 + a)
            else:
                step = logits.softmax(2 + a) * mask
        else:
            step = logits.softmax(2 + a)
        weight = step if weight is None else weight * step
    return weight


def _criss_cross_row(rec: AttentionRecord, query, masked: bool) -> torch.Tensor:
    if rec.form not in ("official", "paper"):
        raise ValueError(f"{rec.name}: unknown form {rec.form!r}, expected 'official' or 'paper'")
    order = tuple(range(len(rec.grid_shape)))  # T (3-D), H, W: the layer applies A_T first
    return 0.5 * (_path_weights(rec, query, order, masked) + _path_weights(rec, query, order[::-1], masked))


def _linear_row(rec: AttentionRecord, query, masked: bool) -> torch.Tensor:
    if rec.feature_map is None:
        raise ValueError(f"{rec.name}: a linear attention record needs its feature_map")
    phi_q = _query_vector(rec.feature_map(rec.q.float()), query)
    kernel = torch.einsum("bhd,bh...d->bh...", phi_q, rec.feature_map(rec.k.float()))
    if masked:
        kernel = kernel * mask_row(rec.log_alpha, rec.log_beta, query, "both", rec.log_gamma)
    return kernel / kernel.flatten(2).sum(-1).view(*kernel.shape[:2], *([1] * (kernel.dim() - 2)))


_ROWS = {"vanilla": _vanilla_row, "criss_cross": _criss_cross_row, "linear": _linear_row}


def attention_row(rec: AttentionRecord, query: tuple[int, ...], masked: bool = True) -> torch.Tensor:
    """Attention weights of ``query`` over all keys, ``(B, heads, *grid)`` fp32 (see module doc)."""
    _check_query(query, rec.grid_shape)
    if rec.kind not in _ROWS:
        raise ValueError(f"{rec.name}: unknown attention kind {rec.kind!r}, expected one of {tuple(_ROWS)}")
    with torch.no_grad():
        return _ROWS[rec.kind](rec, tuple(query), masked)
