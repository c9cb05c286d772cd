"""The vanilla polyline attention through FlexAttention (``torch.nn.attention.flex_attention``).

The log mask is a ``score_mod`` computed from the cumulative log decays (``Ga`` along W, ``Gb``
along H, ``Gc`` along T, as in ``ppma.kernels.polyline_attention.vanilla``): for query
``(t, i, j)`` and key ``(s, k, l)`` the V2H term is
``-|Ga[t,i,j] - Ga[t,i,l]| - |Gb[t,i,l] - Gb[t,k,l]| - |Gc[t,k,l] - Gc[s,k,l]|``; H2V swaps the
two tokens. Each cumulative sum is read at two tokens, and Inductor's FlexAttention backward
takes the gradient of a captured tensor only when the ``score_mod`` indexes it once: so each
read has its own copy of the table (:func:`_tables`, six ``(B, heads, N)`` tensors, two on a 2-D
grid per sum). ``form='official'``: two calls, ``0.5 * (flex(V2H) + flex(H2V))``.
``form='paper'``: ``softmax(s) * exp(m) = softmax(s + m) * exp(lse(s + m) - lse(s))``, so three
calls (V2H, H2V, unmasked) with their log-sum-exps. A benchmark column and a cross-check of the
kernels, not a registry backend; compile it (``torch.compile``) for speed: eager FlexAttention
materializes the scores. FlexAttention has no backward for CPU tensors that require grad.
"""
from __future__ import annotations

from torch.nn.attention.flex_attention import AuxRequest, flex_attention


def _tables(log_alpha, log_beta, log_gamma):
    """``(ga_to, ga_corner, gb_corner, gb_across, gc_across, gc_from)``: fp32 ``(B, heads, N)``
    cumulative sums, one tensor per read of :func:`_log_masks` (copies of ``Ga``, ``Gb``, ``Gc``;
    the last two None on a 2-D grid, where ``gb_across`` is read at ``from`` itself)."""
    ga = (-log_alpha.float()).cumsum(-1).flatten(2)
    gb = (-log_beta.float()).cumsum(-2).flatten(2)
    gc = None if log_gamma is None else (-log_gamma.float()).cumsum(-3).flatten(2)
    return ga, ga.clone(), gb, gb.clone(), gc, None if gc is None else gc.clone()


def _log_masks(log_alpha, log_beta, log_gamma):
    """``(v2h, h2v)`` score_mods for decays ``(B, heads, *grid)`` (fp32); each indexes each
    captured tensor once (:func:`_tables`)."""
    grid = log_alpha.shape[2:]
    hw, w = grid[-2] * grid[-1], grid[-1]
    ga_to, ga_corner, gb_corner, gb_across, gc_across, gc_from = _tables(log_alpha, log_beta, log_gamma)

    def log_mask(b, h, to, fr):
        """V2H log mask from token ``fr`` to token ``to`` (flattened indices)."""
        to_row = to - to % w  # (t, i, 0) of ``to``
        corner = to_row + fr % w  # (t_to, i_to, j_fr)
        across = to - to % hw + fr % hw  # (t_to, i_fr, j_fr)
        mask = -(ga_to[b, h, to] - ga_corner[b, h, corner]).abs()
        mask = mask - (gb_corner[b, h, corner] - gb_across[b, h, across]).abs()
        if gc_from is not None:
            mask = mask - (gc_across[b, h, across] - gc_from[b, h, fr]).abs()
        return mask

    def v2h(score, b, h, q_idx, kv_idx):
        return score + log_mask(b, h, q_idx, kv_idx)

    def h2v(score, b, h, q_idx, kv_idx):
        return score + log_mask(b, h, kv_idx, q_idx)

    return v2h, h2v


def polyline_attention_flex(q, k, v, log_alpha, log_beta, log_gamma=None, form="official", attend=flex_attention):
    """Vanilla :func:`ppma.ops.polyline_attention` with FlexAttention (same shapes and logits).

    ``attend``: ``flex_attention`` or a compiled version of it. Returns ``v.dtype`` (fp32 softmax
    statistics inside FlexAttention).
    """
    grid = q.shape[2:-1]
    qf, kf, vf = (t.flatten(2, -2) for t in (q, k, v))
    v2h, h2v = _log_masks(log_alpha, log_beta, log_gamma)
    if form == "official":
        out = 0.5 * attend(qf, kf, vf, score_mod=v2h, scale=1.0) + 0.5 * attend(qf, kf, vf, score_mod=h2v, scale=1.0)
    else:
        lse = attend(qf, kf, vf, scale=1.0, return_aux=AuxRequest(lse=True))[1].lse
        out = 0
        for mod in (v2h, h2v):
            o, aux = attend(qf, kf, vf, score_mod=mod, scale=1.0, return_aux=AuxRequest(lse=True))
            out = out + o.float() * (aux.lse - lse).exp()[..., None]
    return out.to(v.dtype).unflatten(2, grid)
