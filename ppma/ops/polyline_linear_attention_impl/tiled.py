"""Linear polyline attention in row strips: matmuls inside a strip, ``d x dv'`` states per column
carried between strips (the chunked form of linear attention, on a 2-D grid). PyTorch, any device.

With ``v' = [v, 1]``, ``num'_n = sum_m L2D[n, m] (q_n . k_m) v'_m`` and ``out = num'[:dv] /
(num'[dv] + eps)``; ``L2D = V2H + H2V``. The H2V path from key ``m = (i', j')`` to query ``n = (i,
j)`` runs along row ``i'`` to column ``j``, then down column ``j``: ``H2V[n, m] = A^H_j[i, i']
A^W_{i'}[j, j']`` (1-D masks of the column's and the row's decays). Cut the grid into strips of
``rows`` whole rows. For a query in strip ``s``:

- keys in the strip: ``((q k^T) * M) v'`` with the strip's ``T x T`` H2V mask ``M`` (``T = rows *
  W`` tokens), two batched matmuls;
- keys above the strip reach ``n`` down column ``j`` through the strip's top edge, so they are
  one ``d x dv'`` state per column, ``C_top[s, j] = sum_{i' < r0} A^H_j[r0 - 1, i'] sum_{j'}
  A^W_{i'}[j, j'] k_m v'_m^T``, times the decay from the edge to the query, ``prod_{r0 <= r <= i}
  b_{r, j}``; keys below likewise with ``C_bot[s, j]``.

The states follow strip by strip, ``C_top[s + 1] = (prod of the strip's b) C_top[s] + E_s`` with
``E_s[j] = sum_{m in s} A^H_j[r1 - 1, i'] A^W_{i'}[j, j'] k_m v'_m^T`` (one batched matmul), and
``C_bot`` from the last strip up. V2H is H2V on the transposed grid (rows and columns swapped,
with them ``alpha`` and ``beta``). Per token: ``T (d + dv')`` multiply-adds inside the strip,
``2 W d dv'`` for the states (matmuls: tensor cores on a GPU) and ``2 d dv'`` to read them; no
per-token state is formed. Every factor is a product of decays ``<= 1`` or ``exp`` of a segment
sum of log decays (nothing overflows or cancels). Gradients by autograd through these operations.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..polyline_attention_impl.reference import _at_least_fp32
from ..polyline_mask_impl.reference import log_mask_1d
from .chunked import _with_ones, output_from_numerator

# Tokens of one strip: ``max(1, TOKENS_PER_STRIP // W)`` rows.
TOKENS_PER_STRIP = 128


def _h2v_numerator(q, k, vp, log_alpha, log_beta, rows: int) -> torch.Tensor:
    """``num'`` of the H2V path: ``q``, ``k`` ``(R, H, W, d)``, ``vp`` ``(R, H, W, e)``, decays ``(R,
    H, W)`` (``alpha`` along the rows, ``beta`` down the columns) -> ``(R, H, W, e)``."""
    n_rows, width = q.shape[1:3]
    strips = -(-n_rows // rows)
    pad = strips * rows - n_rows  # zero tokens and decay 1 below the grid: no query reads them
    q, k, vp = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, vp))
    log_alpha, log_beta = (F.pad(t, (0, 0, 0, pad)) for t in (log_alpha, log_beta))
    r, tokens = q.shape[0], rows * width
    along_row = log_mask_1d(log_alpha).exp().view(r, strips, rows, width, width)  # [i', j, j'] = A^W_{i'}[j, j']
    b = log_beta.exp()
    b_strips = b.view(r, strips, rows, width)
    down_col = log_mask_1d(log_beta.view(r, strips, rows, width).transpose(-1, -2)).exp()  # (r, strips, j, i, i')
    # M[i, j, i', j'] = A^H_j[i, i'] A^W_{i'}[j, j']
    inside = down_col.permute(0, 1, 3, 2, 4)[..., None] * along_row.permute(0, 1, 3, 2, 4).unsqueeze(2)
    qs, ks, vs = (t.reshape(r, strips, tokens, -1) for t in (q, k, vp))
    num = ((qs @ ks.mT) * inside.reshape(r, strips, tokens, tokens)) @ vs

    def edge_sums(edge_row: int) -> torch.Tensor:
        """``(r, strips, W, d, e)``: per column ``j``, the strip's ``k v'^T`` seen from ``edge_row``
        of column ``j`` (``A^H_j[edge, i'] A^W_{i'}[j, j']``)."""
        weights = down_col[..., edge_row, :, None] * along_row.transpose(2, 3)  # (r, strips, j, i', j')
        return (weights.reshape(r, strips, width, tokens, 1) * ks.unsqueeze(2)).mT @ vs.unsqueeze(2)

    into = b_strips.cumprod(2)  # prod_{r0 <= r <= i} b: from the top edge to row i
    b_next = F.pad(b[:, 1:], (0, 0, 0, 1)).view(r, strips, rows, width)  # b of the row below (0 at the end)
    out_of = b_next.flip(2).cumprod(2).flip(2)  # prod_{i < r <= r1} b: from the bottom edge to row i
    from_top, from_bottom = edge_sums(rows - 1), edge_sums(0)
    top = [torch.zeros_like(from_top[:, 0])]
    for s in range(strips - 1):
        top.append(into[:, s, -1, :, None, None] * top[-1] + from_top[:, s])
    bottom = [torch.zeros_like(from_bottom[:, 0])]
    for s in range(strips - 1, 0, -1):
        bottom.append(out_of[:, s, 0, :, None, None] * bottom[-1] + from_bottom[:, s])
    states = torch.stack(top, 1).unsqueeze(2) * into[..., None, None] \
        + torch.stack(bottom[::-1], 1).unsqueeze(2) * out_of[..., None, None]  # (r, strips, rows, W, d, e)
    num = num.view(r, strips, rows, width, -1) + (q.view(r, strips, rows, width, 1, -1) @ states).squeeze(-2)
    return num.view(r, strips * rows, width, -1)[:, :n_rows]


def polyline_linear_attention_tiled(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    log_gamma: torch.Tensor | None = None,
    eps: float = 1e-6,
    rows: int | None = None,
) -> torch.Tensor:
    """Same contract as :func:`~.reference.polyline_linear_attention_reference` on 2-D grids;
    strips of ``rows`` rows (default ``max(1, TOKENS_PER_STRIP // W)``; V2H's strips, on the
    transposed grid, of as many columns). State and sums in fp32 (fp64 for fp64 inputs)."""
    if log_gamma is not None:
        raise ValueError("polyline_linear_attention_tiled runs 2-D grids only, got log_gamma")
    acc = _at_least_fp32(v).dtype
    q, k = (t.flatten(0, 1).to(acc) for t in (q, k))
    vp = _with_ones(v.flatten(0, 1), acc)
    log_alpha, log_beta = (t.flatten(0, 1).to(acc) for t in (log_alpha, log_beta))
    height, width = q.shape[1:3]
    h2v = _h2v_numerator(q, k, vp, log_alpha, log_beta, rows or max(1, TOKENS_PER_STRIP // width))

    def t(x):
        return x.transpose(1, 2)

    v2h = t(_h2v_numerator(t(q), t(k), t(vp), t(log_beta), t(log_alpha), rows or max(1, TOKENS_PER_STRIP // height)))
    num = h2v + v2h
    return output_from_numerator(num, eps, v.dtype).unflatten(0, v.shape[:2])
