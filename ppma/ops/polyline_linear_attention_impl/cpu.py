"""CPU kernel of ``ppma::polyline_linear_attention``: linear polyline attention in chunks, the
state kept per chunk boundary and the products inside a chunk as batched matmuls.

With ``v' = [v, 1]``, ``num' = q^T L2D (k (x) v')`` and ``out = num'[:dv] / (num'[dv] + eps)``.
``L2D = V2H + H2V``: V2H scans along H, then W (3-D: T, H, W), H2V along W, then H (3-D: W, H,
T); a scan along an axis multiplies every line by its 1-D mask ``A[p, q] = exp(-|G_p - G_q|)``
(:func:`decay_mask`). Two forms, whichever costs less (:func:`quadratic_is_cheaper`):

- small grids, :func:`_quadratic`: the whole grid is one chunk, ``((q k^T) * L2D) v'`` with its
  ``N x N`` mask (no state at all);
- larger grids, :func:`_scanned`: the state ``S = k (x) v'`` (``c * (dv + 1)`` channels for a
  chunk of ``c`` key features). Each axis of ``n`` tokens is cut into ``nb`` blocks of ``T``
  (:func:`blocks`; the grid padded to ``nb * T`` with zero ``q``, ``k``, ``v'`` and decay 1, which
  no valid token reads); a scan is one ``T x T`` matmul a block, the blocks carried after the
  matmuls by ``y += A[:, 0] H + A[:, -1] J``, ``H`` (``J``) the state carried into a block from
  the blocks before (after) it, combined from the first and last rows of ``y``. When one row's
  whole state does not fit in a buffer, a path runs strip by strip: block ``b`` of its first
  axis, all of the other axes (where lines are whole). The states carried into the strip along
  the first axis then come from the sums of every block as seen from its ends, ``sum_q A[0 or
  T-1, q] k_q (x) v'_q`` (one matmul a block, from ``k`` and ``v'``), as ``H = K @ ends``, ``J =
  K^T @ starts``: ``K[b, b']`` is the decay from the end of block ``b'`` to the start of block
  ``b``, the 1-D mask of the sequence ``[link into block b, product over block b]``. They are
  added to the strip's state at its first and last tokens along the axis, so one matmul a line
  is the whole scan there. Each path's result is contracted with ``q`` at once.

Layout: a scan along an axis reads a buffer laid out ``(rows, *other axes, axis, c, dv')``
(:func:`_buffer`), so that its lines ``(T, c * dv')`` are contiguous and one :func:`torch.bmm`
(one batched GEMM of MKL, whose output must be contiguous) does them all; one copy moves the
axis between two scans. Buffers are per-thread scratch (:mod:`ppma.ops._scratch`) of at most
:data:`CHUNK_ELEMENTS` elements, so no more of the per-token state exists at a time (a path's
second scan needs it at every token it runs over: the V2H path turns at the query's row and
the key's column, so unlike a product of two 1-D masks, states at block boundaries alone cannot
stand for it). The factors depend on the decays only and serve every chunk; each is a product
of decays (``<= 1``), so nothing overflows or cancels. State and sums in fp32 (fp64 for fp64 inputs).

The forward keeps the numerator ``num'``; the backward starts from it (no forward runs again),
on the grids where the quadratic form is cheaper through that form (:mod:`.quadratic`), else
the chunked path's (:func:`.chunked.chunked_backward`, which also holds one chunk's state at a
time: the decay gradients need each scan's carried states in both directions, which its
autograd through the blocked scans gives; the in-place matmuls here have no autograd formula).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._autocast import autocast_off
from .._scratch import scratch
from ..polyline_attention_impl.reference import _at_least_fp32
from .chunked import _chunks, _with_ones, output_from_numerator

# Lines up to this many tokens are one block (one n x n matmul a line).
WHOLE_LINE = 16
# Longer lines: blocks of at most this many tokens.
BLOCK = 8
# Elements of one buffer (fp32: 4 MB). On 2 threads PPMA-linear-T's stage 1 ran 1.4-1.8x slower at 224 bs8
# and 1.1-1.3x at 1024 bs1 with 2^19 or 2^21-2^23 (the op alone at the stage's shape, interleaved medians).
CHUNK_ELEMENTS = 1 << 20
# One pass over a buffer costs about as much as this many multiply-adds per element (in cache).
PASS_COST = 10


def blocks(n: int) -> tuple[int, int]:
    """``(nb, T)``: a line of ``n`` tokens as ``nb`` blocks of ``T`` (``nb * T >= n``, padding < nb)."""
    nb = 1 if n <= WHOLE_LINE else -(-n // BLOCK)
    return nb, -(-n // nb)


def _order(axis: int, dims: int) -> list[int]:
    """The grid axes as a buffer that scans along ``axis`` lays them out: the others, then ``axis``."""
    return [a for a in range(dims) if a != axis] + [axis]


def _laid_out(t: torch.Tensor, axis: int, dims: int) -> torch.Tensor:
    """``t`` ``(rows, *grid, *rest)`` permuted to the layout of scans along grid ``axis``."""
    return t.permute(0, *[1 + a for a in _order(axis, dims)], *range(1 + dims, t.dim()))


def _buffer(slot: str, shape: tuple[int, ...], dims: int, axis: int, dtype: torch.dtype):
    """``(memory, logical)``: scratch ``slot`` laid out for scans along grid ``axis``, and the same
    tensor viewed as ``shape`` ``(rows, *grid, *rest)``."""
    order = _order(axis, dims)
    memory = scratch(slot, (shape[0], *[shape[1 + a] for a in order], *shape[1 + dims:]), dtype)
    return memory, memory.permute(0, *[1 + order.index(a) for a in range(dims)], *range(1 + dims, len(shape)))


def decay_mask(decay: torch.Tensor) -> torch.Tensor:
    """The 1-D decay mask ``(..., n) -> (..., n, n)`` of the decays ``a = exp(log_decay)``, as
    :func:`~ppma.ops.polyline_mask_impl.reference.polyline_mask_1d` (``exp(-|G_j - G_l|)``), from
    products: ``P[l, j] = prod_{l < p <= j} a[p]`` (1 for ``j <= l``) by one cumulative product,
    and the mask is ``P * P^T``. Each entry multiplies only the decays between its two ends (a
    relative error of a few roundings a token, nothing cancels) and no ``n x n`` tensor goes
    through ``exp``."""
    n = decay.shape[-1]
    above = torch.ones(n, n, dtype=torch.bool).triu(1)
    steps = decay.new_empty(*decay.shape, n)
    torch.where(above, decay[..., None, :], decay.new_ones(()), out=steps).cumprod_(-1)
    return torch.mul(steps, steps.mT, out=torch.empty_like(steps))


class AxisScan:
    """The scans along grid ``axis``, with their factors from the log decays ``(rows, *padded
    grid)`` along it. Lines run through the other axes' positions (``others``, in order), each
    cut into ``nb`` blocks of ``T``: ``mask (rows, *others, nb, T, T)``; with several blocks also
    ``carry (rows, *others, nb, nb)`` (``K``) and ``weights (rows, *others, nb, T, 2)`` (the mask's
    first and last columns)."""

    def __init__(self, log_decay: torch.Tensor, axis: int, nb: int):
        dims = log_decay.dim() - 1
        self.axis, self.nb, self.t = axis, nb, log_decay.shape[1 + axis] // nb
        self.others = _order(axis, dims)[:-1]
        lines = _laid_out(log_decay, axis, dims).unflatten(-1, (nb, self.t)).exp()  # decays
        self.mask = decay_mask(lines)
        self.carry = self.weights = None
        if nb > 1:  # K[b, b'] from entry 2 b' + 1 (block b' over) to entry 2 b (into block b)
            steps = torch.stack([lines[..., 0], self.mask[..., -1, 0]], dim=-1).flatten(-2)
            self.carry = decay_mask(steps)[..., 0::2, 1::2].tril(-1)
            self.weights = torch.stack([self.mask[..., 0], self.mask[..., -1]], dim=-1)

    def _factors(self, rows: slice, strip):
        """``(mask, carry, weights)`` of the lines of ``rows``; with ``strip = (axis, positions)``,
        of those through these positions of another axis only."""
        index = [rows] + [slice(None)] * len(self.others)
        if strip is not None:
            index[1 + self.others.index(strip[0])] = strip[1]
        return [None if f is None else f[tuple(index)] for f in (self.mask, self.carry, self.weights)]

    def __call__(self, x: torch.Tensor, out: torch.Tensor, rows: slice, strip=None) -> torch.Tensor:
        """``out = A x`` along whole lines for buffers laid out for this axis (lines as in
        :meth:`_factors`)."""
        mask, carry, weights = self._factors(rows, strip)
        t = self.t
        mask = mask.reshape(-1, t, t)
        blocks = mask.shape[0]
        torch.bmm(mask, x.view(blocks, t, -1), out=out.view(blocks, t, -1))
        if carry is not None:
            y = out.view(blocks // self.nb, self.nb, t, -1)
            carry = carry.reshape(-1, self.nb, self.nb)
            carried = scratch("polyline_linear_attention.carried", (2, *y.shape[:2], y.shape[-1]), out.dtype)
            torch.bmm(carry, y[:, :, -1], out=carried[0])
            torch.bmm(carry.mT, y[:, :, 0], out=carried[1])
            out.view(blocks, t, -1).baddbmm_(weights.reshape(blocks, t, 2), carried.view(2, blocks, -1).transpose(0, 1))
        return out

    def block(self, x: torch.Tensor, out: torch.Tensor, rows: slice, b: int) -> torch.Tensor:
        """``out = A_b x`` for block ``b`` of every line of ``rows``: ``x``, ``out`` laid out for
        this axis with ``T`` tokens along it (a strip)."""
        mask = self.mask[rows, ..., b, :, :].flatten(0, -3)
        return torch.bmm(mask, x.view(mask.shape[0], self.t, -1), out=out.view(mask.shape[0], self.t, -1))

    def carried(self, rows: slice, k: torch.Tensor, vp: torch.Tensor) -> torch.Tensor:
        """``(2, rows, *others, nb, c, dv')``: for the state ``k (x) v'`` of ``rows`` (``k``
        ``(rows, *grid, c)``, ``vp`` ``(rows, *grid, dv')``), the states carried into each block
        from the blocks before it (``[0]``, at its first token) and after it (``[1]``, at its last)."""
        dims = k.dim() - 2
        k, vp = (_laid_out(t, self.axis, dims).unflatten(dims, (self.nb, self.t)) for t in (k, vp))
        # sum_q A[q, 0 or T-1] k_q (x) v'_q: each block's sums seen from its start and its end
        sums = (self.weights[rows].unsqueeze(-1) * k.unsqueeze(-2)).flatten(-2).mT @ vp  # (..., nb, 2 c, dv')
        sums = sums.view(-1, self.nb, 2, k.shape[-1] * vp.shape[-1])
        carry = self.carry[rows].reshape(-1, self.nb, self.nb)
        out = torch.empty(2, *sums.shape[:2], sums.shape[-1], dtype=sums.dtype)
        torch.bmm(carry, sums[:, :, 1], out=out[0])
        torch.bmm(carry.mT, sums[:, :, 0], out=out[1])
        return out.view(2, *k.shape[:-2], k.shape[-1], vp.shape[-1])


def quadratic_is_cheaper(grid: tuple[int, ...], d: int, dv1: int) -> bool:
    """Whether :func:`_quadratic` costs less than :func:`_scanned` for one ``(batch, head)``
    (``d`` key features, ``dv1 = dv + 1``): per token, ``N (d + dv1)`` multiply-adds and about
    :data:`PASS_COST` for each of its passes over the mask against ``d * dv1`` channels times the
    scans' ``2 (T + carry)`` multiply-adds and about :data:`PASS_COST` for each of their passes."""
    scans = sum(2 * (t + (4 if nb > 1 else 0)) for nb, t in map(blocks, grid))
    return math.prod(grid) * (d + dv1 + 6 * PASS_COST) <= d * dv1 * (scans + 8 * PASS_COST)


def _padded(t: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
    """``t`` ``(rows, *valid grid, C)`` zero-padded at the end of each grid axis to ``grid``."""
    pad = [0, 0]
    for n, m in zip(reversed(grid), reversed(t.shape[1:-1])):
        pad += [0, n - m]
    return F.pad(t, pad) if any(pad) else t


def _path(scans: list[AxisScan], path: list[int], rows: slice, k, vp, q, num, strips: bool) -> None:
    """Adds ``q^T`` (the scans along the grid axes of ``path``, in order, of ``k (x) v'``) to
    ``num``; ``k``, ``q`` ``(rows, *grid, c)``, ``vp``, ``num`` ``(rows, *grid, dv')``. With
    ``strips``, strip by strip along ``path[0]`` (module docstring), else on the whole grid at once
    (the blocks of ``path[0]`` then carried after the matmuls, as those of the other axes)."""
    dims, first = k.dim() - 2, scans[path[0]]
    carried = first.carried(rows, k, vp) if strips else None
    for b in range(first.nb) if strips else [None]:
        part = slice(None) if b is None else slice(b * first.t, (b + 1) * first.t)
        ks, vs, qs, ns = (t[(slice(None),) * (1 + first.axis) + (part,)] for t in (k, vp, q, num))
        shape = (*ks.shape, vp.shape[-1])
        x, _ = _buffer("polyline_linear_attention.x", shape, dims, first.axis, k.dtype)
        ks, vs = (_laid_out(t, first.axis, dims).contiguous() for t in (ks, vs))
        torch.mul(ks[..., None], vs[..., None, :], out=x)
        y, y_logical = _buffer("polyline_linear_attention.y", shape, dims, first.axis, k.dtype)
        if b is None:
            first(x, y, rows)
        else:
            x[..., 0, :, :] += carried[0, ..., b, :, :]
            x[..., -1, :, :] += carried[1, ..., b, :, :]
            first.block(x, y, rows, b)
        for axis in path[1:]:
            x, x_logical = _buffer("polyline_linear_attention.x", shape, dims, axis, k.dtype)
            x_logical.copy_(y_logical)
            y, y_logical = _buffer("polyline_linear_attention.y", shape, dims, axis, k.dtype)
            scans[axis](x, y, rows, None if b is None else (first.axis, part))
        ns += y_logical.mul_(qs[..., None]).sum(-2)


def _scanned(q, k, vp, decays, budget):
    """``num' (rows, *grid, dv')`` by the scans of the state (module docstring); ``q``, ``k``
    ``(rows, *grid, d)``, ``vp`` ``(rows, *grid, dv')``, ``decays[a]`` ``(rows, *grid)`` along grid
    axis ``a``; buffers of at most ``budget`` elements. Strips when the whole grid's state of one
    row exceeds ``budget``."""
    valid = q.shape[1:-1]
    plan = [blocks(n) for n in valid]
    grid = tuple(nb * t for nb, t in plan)
    axes = list(range(len(grid)))
    decays = [_padded(ld.unsqueeze(-1), grid).squeeze(-1) for ld in decays]  # decay 1 in the padding
    q, k, vp = (_padded(t, grid) for t in (q, k, vp))
    scans = [AxisScan(ld, a, nb) for a, (ld, (nb, _)) in enumerate(zip(decays, plan))]
    num = vp.new_zeros(vp.shape)
    tokens, d, dv1 = math.prod(grid), q.shape[-1], vp.shape[-1]
    strips = tokens * d * dv1 > budget
    if strips:  # the tokens of the largest strip
        tokens = max(tokens // plan[a][0] for a in (axes[0], axes[-1]))
    for rows, feature_chunks in _chunks(q.shape[0], tokens, d, dv1, budget):
        for features in feature_chunks:
            for path in (axes, axes[::-1]):  # V2H: (T,) H, W; H2V: W, H(, T)
                _path(scans, path, rows, k[rows, ..., features], vp[rows], q[rows, ..., features], num[rows],
                      strips and scans[path[0]].nb > 1)
    return num[(slice(None),) + tuple(slice(0, n) for n in valid)]


def _path_factor(mask: torch.Tensor, axis: int, dims: int, h2v: bool) -> torch.Tensor:
    """The 1-D masks along ``axis`` ``(rows, *other axes, n, n)`` as a factor of the V2H mask
    ``(rows, *query grid, *key grid)`` (its product over the axes): V2H runs the axes in order,
    so its step along ``axis`` runs on the line through the query's coordinates before ``axis``
    and the key's after it; with ``h2v``, of the H2V mask (query and key swapped; the 1-D masks
    are symmetric)."""
    rows, lo, hi, n = mask.shape[0], mask.shape[1:1 + axis], mask.shape[1 + axis:dims], mask.shape[-1]
    if h2v:  # (rows, query, *hi, *lo, key)
        mask = mask.permute(0, dims, *range(1 + axis, dims), *range(1, 1 + axis), dims + 1)
        return mask.reshape(rows, *[1] * axis, n, *hi, *lo, n, *[1] * (dims - 1 - axis))
    mask = mask.movedim((-2, -1), (1 + axis, 2 + axis))  # (rows, *lo, query, key, *hi)
    return mask.reshape(rows, *lo, n, *[1] * (dims - 1), n, *hi)


def _product(factors: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """The broadcast product of ``factors`` written to ``out``."""
    torch.mul(factors[0].expand(out.shape), factors[1], out=out)
    for factor in factors[2:]:
        out.mul_(factor)
    return out


def _quadratic(q, k, vp, decays, budget):
    """``num'`` as :func:`_scanned` gives it, by ``((q k^T) * L2D) v'`` with the whole grid's
    ``N x N`` mask ``L2D = V2H + H2V``, each the product of the 1-D masks: for small grids (the
    whole grid as one chunk of a chunked form, no state at all). At most ``budget`` mask elements
    a chunk (one row at least)."""
    grid, dv1 = q.shape[1:-1], vp.shape[-1]
    dims, n = len(grid), math.prod(grid)
    masks = [decay_mask(_laid_out(ld, a, dims).exp()) for a, ld in enumerate(decays)]
    q, k, vp = (t.flatten(1, -2) for t in (q, k, vp))
    num = vp.new_empty(vp.shape)
    step = max(1, budget // (n * n))
    for start in range(0, q.shape[0], step):
        rows = slice(start, start + step)
        v2h, h2v = ([_path_factor(m[rows], a, dims, swap) for a, m in enumerate(masks)] for swap in (False, True))
        shape = (v2h[0].shape[0], *grid, *grid)
        weights = _product(v2h, scratch("polyline_linear_attention.l2d", shape, q.dtype))
        other = scratch("polyline_linear_attention.other", shape, q.dtype)
        if dims == 2:
            weights.addcmul_(*h2v)
        else:
            weights.add_(_product(h2v, other))
        weights, other = weights.view(-1, n, n), other.view(-1, n, n)
        weights.mul_(torch.bmm(q[rows], k[rows].mT, out=other))
        torch.bmm(weights, vp[rows], out=num[rows])
    return num.view(-1, *grid, dv1)


def numerator(q, k, v, log_alpha, log_beta, log_gamma=None, budget=CHUNK_ELEMENTS, quadratic=None) -> torch.Tensor:
    """``num'`` ``(B * heads, *grid, dv + 1)`` (fp32; fp64 for fp64 ``v``) of
    :func:`linear_attention_cpu` (same arguments, no ``eps``)."""
    acc = _at_least_fp32(v).dtype
    decays = [log_alpha, log_beta] + ([log_gamma] if log_gamma is not None else [])
    decays = [ld.flatten(0, 1).to(acc) for ld in decays[::-1]]  # per grid axis (T,) H, W
    q, k = (t.flatten(0, 1).to(acc) for t in (q, k))
    vp = _with_ones(v.flatten(0, 1), acc)
    if quadratic is None:
        quadratic = quadratic_is_cheaper(q.shape[1:-1], q.shape[-1], vp.shape[-1])
    return (_quadratic if quadratic else _scanned)(q, k, vp, decays, budget)


def _output(num: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    """``out`` ``(B, heads, *grid, dv)`` in ``v``'s dtype from ``num'`` ``(B * heads, *grid, dv + 1)``."""
    return output_from_numerator(num, eps, v.dtype).unflatten(0, v.shape[:2])


def linear_attention_cpu(q, k, v, log_alpha, log_beta, log_gamma=None, eps=1e-6, budget=CHUNK_ELEMENTS,
                         quadratic=None):
    """Same contract as :func:`~.reference.polyline_linear_attention_reference`; buffers of at
    most ``budget`` elements (one key feature of one ``(batch, head)`` at least). ``quadratic``:
    the quadratic form (True), the scans (False), or whichever costs less (None)."""
    return _output(numerator(q, k, v, log_alpha, log_beta, log_gamma, budget, quadratic), v, eps)


def forward(q, k, v, log_alpha, log_beta, log_gamma, eps):
    """The CPU :class:`~ppma.ops.registry.Impl`'s forward: ``(out, (num',))``, the numerator kept
    for the backward (which :mod:`.op` chooses)."""
    with autocast_off("cpu"):
        num = numerator(q, k, v, log_alpha, log_beta, log_gamma).contiguous()  # not a view of padded lines
        return _output(num, v, eps), (num,)
