"""Triton kernels of the linear polyline attention on 2-D grids, in row strips (the chunked form of
linear attention on the grid; the PyTorch form is ``ppma.ops.polyline_linear_attention_impl.tiled``).

With ``v' = [v, 1]``, ``num'_n = sum_m L2D[n, m] (q_n . k_m) v'_m`` and ``out = num'[:dv] /
(num'[dv] + eps)``, ``L2D = H2V + V2H``. With ``Ga = cumsum(-log_alpha)`` along W and ``Gb =
cumsum(-log_beta)`` along H (fp32 ``(B*heads, H, W)``), the H2V mask from key ``m = (i', j')`` to
query ``n = (i, j)`` (along row ``i'`` to column ``j``, then down column ``j``) is

    H2V[n, m] = exp(-|Gb[i, j] - Gb[i', j]| - |Ga[i', j] - Ga[i', j']|).

V2H is H2V on the transposed grid: the launcher runs every kernel twice, the second time on
transposed strides with the two decays swapped. Cut the grid into strips of ``STRIP`` rows:

- :func:`_intra_kernel`, keys in the query's strip: a program owns a query tile of ``BLOCK //
  COLS`` rows by ``COLS`` columns and walks the strip's rows, each row in segments of ``COLS``
  keys: ``((q k^T) * M) v'`` by two ``tl.dot``. The mask of a segment is a broadcast of
  vectors: ``Gb``, ``Ga`` at (key row, query column), loaded once per key row, and ``Ga`` at the
  keys. No ``N x N`` tensor exists.
- :func:`_edge_kernel`, what a strip hands on: per column ``j`` and edge row ``e`` (the strip's
  last row for the strips below it, its first for those above), ``E[j] = sum_{m in strip}
  H2V[(e, j), m] k_m v'_m^T``, one ``d x dv'`` matrix, as ``tl.dot((k * w)^T, v)`` over tiles of
  the strip's keys (``w`` from vectors gathered at the keys' rows in column ``j``).
- :func:`strip_states` (PyTorch): the states entering each strip, ``C[s, j] = sum_{s'} (decay
  from the edge of s' to the edge of s) E[s', j]`` (a batched ``strips x strips`` matmul per
  column), and their contraction with the queries, ``(q * decay from the edge) @ C`` per column
  (a batched matmul over the strip's rows). No per-token ``d x dv'`` state is formed.

Per token and path: ``STRIP * W * (d + dv')`` multiply-adds inside the strip (tensor cores),
``2 W d dv'`` for the edge states (tensor cores), ``2 d dv'`` to read them. Every mask factor is
``exp`` of minus a non-negative difference of cumulative sums (nothing overflows). fp32, fp16,
bf16 inputs: ``tl.dot`` on the inputs' dtype with fp32 accumulation (fp32: ``'ieee'``); states,
sums and the output numerator in fp32 (returned: the op's backward, in ``ppma.ops``, starts from it).
"""
from __future__ import annotations

import dataclasses
import itertools

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.strided import cdiv, pow2

# Query tiles (intra-strip) and key tiles (edge states) of BLOCK tokens: the autotuner's choice,
# the interpreter runs the first. Accumulators (BLOCK x dv fp32) and the score tile live in
# registers; ptxas spills none of these at head dims up to 32 on sm_80 and sm_90. fp32 inputs
# (``'ieee'`` dots on CUDA cores, twice the registers) run the first configuration alone
# (:func:`_fp32_first`): the others spill there.
INTRA_CONFIGS = [
    triton.Config({"BLOCK": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK": 128}, num_warps=8, num_stages=2),
]
EDGE_CONFIGS = [  # STATE_ROWS: columns x channels of a program's states (the dot's rows)
    triton.Config({"BLOCK": 32, "STATE_ROWS": 32}, num_warps=4, num_stages=1),
    triton.Config({"BLOCK": 32, "STATE_ROWS": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK": 64, "STATE_ROWS": 128}, num_warps=8, num_stages=2),
]
TILE_COLS = (16, 32)  # query tiles' and key segments' widths (tl.dot's smallest tile side is 16)
# The resource table's head-dim blocks (d and dv padded to powers of two; larger: untuned).
HEAD_BLOCKS = (16, 32)
STRIP_ROWS = (16, 32)  # strip heights: the intra-strip work (STRIP * W * (d + dv')) against the edge states' (2 W d dv')
MIN_STRIP = max(c.kwargs["BLOCK"] for c in INTRA_CONFIGS) // min(TILE_COLS)  # query tiles never straddle strips


def strip_rows(d: int) -> int:
    """``STRIP``: rows of a strip for head dim ``d``, the one of :data:`STRIP_ROWS` nearest ``d``
    (intra-strip and edge-state work balance there; both are at least every tile's rows)."""
    return min(STRIP_ROWS, key=lambda rows: (abs(rows - d), rows))


def columns(width: int, dtype: torch.dtype) -> int:
    """``COLS``: of :data:`TILE_COLS`, the width that pads a grid ``width`` wide least (wider on a
    tie); fp32 inputs: the narrowest (the wider spill there)."""
    if dtype == torch.float32:
        return TILE_COLS[0]
    return min(TILE_COLS, key=lambda cols: (cdiv(width, cols) * cols, -cols))


def _fp32_first(configs, nargs, **launch):
    """The kernels' ``early_config_prune``: fp32 inputs (``'ieee'`` dots) the first configuration alone."""
    return configs[:1] if launch.get("PRECISION", nargs.get("PRECISION")) == "ieee" else configs


def _variant(args) -> str:
    """``'bf16 d<=32 strip16 cols16'``: the resource table's name of a launch (:mod:`..common.tuning`)."""
    head = tuning.bucket(max(args["BLOCK_D"], args["BLOCK_DV"]), HEAD_BLOCKS)
    cols = f" cols{args['COLS']}" if "COLS" in args else ""
    return f"{args['K'][1:]} d{head} strip{args['STRIP']}{cols}"


@triton.jit
def _row_tile(ptr, rows, cols, ok, s_i, s_j, c, C):
    """``(len(rows), BLOCK_C)``: the channels ``c < C`` of the tokens ``(rows, cols)`` (zeros where not ``ok``)."""
    off = rows.to(tl.int64)[:, None] * s_i + cols[:, None] * s_j + c[None, :]
    return tl.load(ptr + off, mask=ok[:, None] & (c[None, :] < C), other=0.0)


@tuning.autotune(INTRA_CONFIGS, key=["H", "W"], variant=_variant, prune=_fp32_first)
@triton.jit(do_not_specialize=["H", "W"])
def _intra_kernel(
    Q, K, V, Ga, Gb, NUM,
    sq_b, sq_h, sq_i, sq_j, sk_b, sk_h, sk_i, sk_j, sv_b, sv_h, sv_i, sv_j,
    heads, H, W, D, DV,
    STRIP: tl.constexpr, COLS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr,
):
    """``NUM``: contiguous fp32 ``(B*heads, H, W, DV + 1)``, the strip's part of ``num'``."""
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    plane = bh.to(tl.int64) * H * W
    Ga += plane
    Gb += plane
    Q += b * sq_b + h * sq_h
    K += b * sk_b + h * sk_h
    V += b * sv_b + h * sv_h
    tile = tl.program_id(0)
    col_blocks = tl.cdiv(W, COLS)
    row0 = tile // col_blocks * (BLOCK // COLS)
    m = tl.arange(0, BLOCK)
    i = row0 + m // COLS
    j = tile % col_blocks * COLS + m % COLS
    ok = (i < H) & (j < W)
    c = tl.arange(0, BLOCK_D)
    cv = tl.arange(0, BLOCK_DV)
    col = tl.arange(0, COLS)
    q = _row_tile(Q, i, j, ok, sq_i, sq_j, c, D)
    gb_q = tl.load(Gb + i * W + j, mask=ok, other=0.0)
    acc = tl.zeros((BLOCK, BLOCK_DV), tl.float32)
    den = tl.zeros((BLOCK,), tl.float32)
    first = row0 // STRIP * STRIP
    for r in range(first, tl.minimum(first + STRIP, H)):
        # down column j from row r to row i; along row r from the key's column to column j
        down = -tl.abs(gb_q - tl.load(Gb + r * W + j, mask=ok, other=0.0))
        ga_corner = tl.load(Ga + r * W + j, mask=ok, other=0.0)
        for cb in range(0, col_blocks):
            l_j = cb * COLS + col
            l_ok = l_j < W
            l_i = tl.zeros((COLS,), tl.int32) + r
            k = _row_tile(K, l_i, l_j, l_ok, sk_i, sk_j, c, D)
            v = _row_tile(V, l_i, l_j, l_ok, sv_i, sv_j, cv, DV)
            ga_k = tl.load(Ga + r * W + l_j, mask=l_ok, other=0.0)
            mask = tl.exp(down[:, None] - tl.abs(ga_corner[:, None] - ga_k[None, :]))
            p = tl.dot(q, tl.trans(k), input_precision=PRECISION) * mask  # zero at padded keys (k = 0)
            acc += tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            den += tl.sum(p, 1)
    out = NUM + (plane + i * W + j) * (DV + 1)
    tl.store(out[:, None] + cv[None, :], acc, mask=ok[:, None] & (cv[None, :] < DV))
    tl.store(out + DV, den, mask=ok)


@tuning.autotune(EDGE_CONFIGS, key=["H", "W"], variant=_variant, prune=_fp32_first)
@triton.jit(do_not_specialize=["H", "W"])
def _edge_kernel(
    K, V, Ga, Gb, E,
    sk_b, sk_h, sk_i, sk_j, sv_b, sv_h, sv_i, sv_j,
    heads, H, W, D, DV,
    STRIP: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr, STATE_ROWS: tl.constexpr,
):
    """``E``: contiguous fp32 ``(2, B*heads, strips, W, D, DV + 1)``: per strip and column, the
    strip's keys seen from its last row (plane 0) and from its first row (plane 1). A program
    owns ``JC = STATE_ROWS / BLOCK_D`` columns: one ``(JC * BLOCK_D, BLOCK) @ (BLOCK, BLOCK_DV)``
    dot per tile of ``BLOCK`` keys and edge, the rows ``(column, channel)`` of ``w[j, m] k[m, c]``."""
    JC: tl.constexpr = (STATE_ROWS + BLOCK_D - 1) // BLOCK_D
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    plane = bh.to(tl.int64) * H * W
    Ga += plane
    Gb += plane
    K += b * sk_b + h * sk_h
    V += b * sv_b + h * sv_h
    col_blocks = tl.cdiv(W, JC)
    strip = tl.program_id(0) // col_blocks
    j = tl.program_id(0) % col_blocks * JC + tl.arange(0, JC)
    j_ok = j < W
    first = strip * STRIP
    rows = tl.minimum(STRIP, H - first)
    gb_last = tl.load(Gb + (first + rows - 1) * W + j, mask=j_ok, other=0.0)[:, None]
    gb_first = tl.load(Gb + first * W + j, mask=j_ok, other=0.0)[:, None]
    c = tl.arange(0, BLOCK_D)
    cv = tl.arange(0, BLOCK_DV)
    acc_last = tl.zeros((JC * BLOCK_D, BLOCK_DV), tl.float32)
    acc_first = tl.zeros((JC * BLOCK_D, BLOCK_DV), tl.float32)
    ks_last = tl.zeros((JC, BLOCK_D), tl.float32)
    ks_first = tl.zeros((JC, BLOCK_D), tl.float32)
    for t0 in range(0, rows * W, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        ok = t < rows * W
        i = first + t // W
        jj = t % W
        kt = tl.trans(_row_tile(K, i, jj, ok, sk_i, sk_j, c, D).to(tl.float32))[None, :, :]  # (1, BLOCK_D, BLOCK)
        v = _row_tile(V, i, jj, ok, sv_i, sv_j, cv, DV)
        corner = i[None, :] * W + j[:, None]  # (JC, BLOCK): the key's row, the program's columns
        both = j_ok[:, None] & ok[None, :]
        gb_corner = tl.load(Gb + corner, mask=both, other=0.0)
        along = -tl.abs(tl.load(Ga + corner, mask=both, other=0.0) - tl.load(Ga + i * W + jj, mask=ok, other=0.0)[None, :])
        a = kt * tl.exp(along - tl.abs(gb_last - gb_corner))[:, None, :]  # (JC, BLOCK_D, BLOCK)
        acc_last += tl.dot(tl.reshape(a, (JC * BLOCK_D, BLOCK)).to(v.dtype), v, input_precision=PRECISION)
        ks_last += tl.sum(a, 2)
        a = kt * tl.exp(along - tl.abs(gb_first - gb_corner))[:, None, :]
        acc_first += tl.dot(tl.reshape(a, (JC * BLOCK_D, BLOCK)).to(v.dtype), v, input_precision=PRECISION)
        ks_first += tl.sum(a, 2)
    strips = tl.cdiv(H, STRIP)
    at = E + ((bh.to(tl.int64) * strips + strip) * W) * D * (DV + 1)
    other = tl.num_programs(1).to(tl.int64) * strips * W * D * (DV + 1)  # plane 1
    r = tl.arange(0, JC * BLOCK_D)
    rj = tl.program_id(0) % col_blocks * JC + r // BLOCK_D
    rc = r % BLOCK_D
    off = (rj * D + rc)[:, None] * (DV + 1) + cv[None, :]
    ok2 = ((rj < W) & (rc < D))[:, None] & (cv[None, :] < DV)
    tl.store(at + off, acc_last, mask=ok2)
    tl.store(at + other + off, acc_first, mask=ok2)
    off = (j[:, None] * D + c[None, :]) * (DV + 1) + DV
    ok2 = j_ok[:, None] & (c[None, :] < D)
    tl.store(at + off, ks_last, mask=ok2)
    tl.store(at + other + off, ks_first, mask=ok2)


def _check_dtype(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"the Triton polyline_linear_attention kernel takes fp32, fp16 or bf16 {name}, got {t.dtype}")


def _channels_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def strip_states(q, edges, gb, strip: int) -> torch.Tensor:
    """``(B*heads, H, W, dv + 1)`` fp32: what the keys outside its strip add to each query's
    ``num'``. ``q`` ``(B*heads, H, W, d)``; ``edges`` :func:`_edge_kernel`'s ``E``; ``gb`` the
    cumulative ``-log_beta`` down the columns ``(B*heads, H, W)``; ``strip`` rows a strip.

    Strip ``s`` (rows ``r0 .. r1 - 1``) receives from above ``C[s] = sum_{s' < s} exp(-(Gb[r0 - 1]
    - Gb[last row of s'])) E_last[s']`` and from below ``sum_{s' > s} exp(-(Gb[first row of s'] -
    Gb[r1])) E_first[s']``, per column; query ``(i, j)`` reads them with ``exp(-(Gb[i] - Gb[r0 -
    1]))`` and ``exp(-(Gb[r1] - Gb[i]))``."""
    bh, height, width, d = q.shape
    strips = edges.shape[2]
    starts = torch.arange(strips, device=q.device) * strip
    lasts = (starts + strip).clamp(max=height) - 1
    g_last, g_first = gb[:, lasts], gb[:, starts]  # (bh, strips, W)
    g_above = torch.cat([g_first[:, :1], g_last[:, :-1]], 1)  # Gb[r0 - 1] (row 0 for the first strip)
    g_below = torch.cat([g_first[:, 1:], g_last[:, -1:]], 1)  # Gb[r1] (the last row for the last strip)
    s = torch.arange(strips, device=q.device)
    above, below = (s[:, None] > s[None, :]), (s[:, None] < s[None, :])  # [s, s']

    def carried(exponent, reach, plane):
        """``(bh, strips, W, d * (dv + 1))``: per strip, the sum over ``reach`` of ``exp(-exponent) E``."""
        weights = torch.where(reach[:, :, None], torch.exp(-exponent.clamp(min=0)), 0.0)  # (bh, s, s', W)
        return torch.einsum("bstw,btwx->bswx", weights, edges[plane].flatten(-2))

    top = carried(g_above[:, :, None] - g_last[:, None], above, 0)
    bottom = carried(g_first[:, None] - g_below[:, :, None], below, 1)
    pad = strips * strip - height
    rows = torch.nn.functional.pad(gb, (0, 0, 0, pad)).view(bh, strips, strip, width)
    into = torch.exp(-(rows - g_above[:, :, None]).clamp(min=0)) * (s > 0).view(1, -1, 1, 1)
    out_of = torch.exp(-(g_below[:, :, None] - rows).clamp(min=0)) * (s < strips - 1).view(1, -1, 1, 1)
    qs = torch.nn.functional.pad(q.float(), (0, 0, 0, 0, 0, pad)).view(bh, strips, strip, width, d)

    def read(factor, states):  # (bh, strips, W, strip, d) @ (bh, strips, W, d, dv + 1)
        return (qs * factor[..., None]).transpose(2, 3) @ states.unflatten(-1, (d, -1))

    num = (read(into, top) + read(out_of, bottom)).transpose(2, 3)  # (bh, strips, strip, W, dv + 1)
    return num.reshape(bh, strips * strip, width, -1)[:, :height]


def _path_numerator(q, k, v, ga, gb, strip: int | None) -> torch.Tensor:
    """``num'`` ``(B*heads, H, W, dv + 1)`` fp32 of the H2V path for ``(B, heads, H, W, .)`` views
    and contiguous fp32 cumulative decays ``(B*heads, H, W)``; strips of ``strip`` rows (default
    :func:`strip_rows`)."""
    bsz, heads, height, width, d = q.shape
    dv = v.shape[-1]
    consts = dict(STRIP=strip or strip_rows(max(16, pow2(d))), PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                  BLOCK_D=max(16, pow2(d)), BLOCK_DV=max(16, pow2(dv)))
    strip = consts["STRIP"]
    strides = (*q.stride()[:4], *k.stride()[:4], *v.stride()[:4])
    sizes = (heads, height, width, d, dv)
    cols = columns(width, q.dtype)
    num = torch.empty(bsz * heads, height, width, dv + 1, dtype=torch.float32, device=q.device)
    _intra_kernel[lambda meta: (cdiv(height, meta["BLOCK"] // cols) * cdiv(width, cols), bsz * heads)](
        q, k, v, ga, gb, num, *strides, *sizes, COLS=cols, **consts)
    strips = cdiv(height, strip)
    if strips == 1:
        return num
    edges = torch.empty(2, bsz * heads, strips, width, d, dv + 1, dtype=torch.float32, device=q.device)
    edge_grid = lambda meta: (strips * cdiv(width, cdiv(meta["STATE_ROWS"], consts["BLOCK_D"])), bsz * heads)  # noqa: E731
    _edge_kernel[edge_grid](k, v, ga, gb, edges, *strides[4:], *sizes, **consts)
    return num + strip_states(q.flatten(0, 1), edges, gb, strip)


def linear_attention_tiled_fwd(q, k, v, log_alpha, log_beta, eps: float,
                               strip: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear polyline attention (``ppma.ops.polyline_linear_attention``) on a 2-D grid.

    ``q``, ``k`` ``(B, heads, H, W, d)`` non-negative features, ``v`` ``(B, heads, H, W, dv)``
    (any strides; channels are made contiguous; of mixed dtypes, all run in the promoted one),
    fp32 log-decays ``(B, heads, H, W)`` -> ``(out, num')``: ``out`` ``(B, heads, H, W, dv)`` in
    ``v.dtype`` and the numerator ``num'`` fp32 ``(B*heads, H, W, dv + 1)`` (the op's backward
    takes it). ``strip``: rows (V2H: columns) of a strip, a power of two >= :data:`MIN_STRIP`
    (default :func:`strip_rows` of the head dim).
    """
    _check_dtype(q, k, v)
    if strip is not None and (strip < MIN_STRIP or strip & (strip - 1)):
        raise ValueError(f"strip must be a power of two >= {MIN_STRIP} (the tallest query tile), got {strip}")
    out_dtype = v.dtype
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    q, k, v = (_channels_contiguous(t.to(dtype)) for t in (q, k, v))
    ga = (-log_alpha.float()).cumsum(-1).flatten(0, 1).contiguous()
    gb = (-log_beta.float()).cumsum(-2).flatten(0, 1).contiguous()
    h2v = _path_numerator(q, k, v, ga, gb, strip)

    def t(x):
        return x.transpose(-2, -3) if x.dim() == 5 else x.transpose(-1, -2).contiguous()

    v2h = _path_numerator(t(q), t(k), t(v), t(gb), t(ga), strip).transpose(1, 2)
    num = h2v + v2h
    return (num[..., :-1] / (num[..., -1:] + eps)).to(out_dtype).view(v.shape), num


def compile_cases() -> list[tuning.CompileCase]:
    """Both kernels' configurations for fp32, fp16 and bf16 inputs, the head-dim blocks of
    :data:`HEAD_BLOCKS` with the strip each gets (:func:`strip_rows`) and (intra-strip kernel) the
    tile widths :func:`columns` gives: fp32 its first configuration and narrowest tiles only
    (:func:`_fp32_first`), fp16 rows with bf16's numbers (``same_as``: the same layout)
    (``tools/kernel_resources.py``)."""
    cases = []
    for dtype, head in itertools.product(("fp32", "fp16", "bf16"), HEAD_BLOCKS):
        pointers = {"Q": f"*{dtype}", "K": f"*{dtype}", "V": f"*{dtype}"}
        pointers.update({name: "*fp32" for name in ("Ga", "Gb", "NUM", "E")})
        consts = dict(STRIP=strip_rows(head), PRECISION="ieee" if dtype == "fp32" else "tf32", BLOCK_D=head,
                      BLOCK_DV=head)
        launches = [(_intra_kernel, {**consts, "COLS": cols}) for cols in TILE_COLS[:1 if dtype == "fp32" else None]]
        for kernel, constexprs in launches + [(_edge_kernel, consts)]:
            built = tuning.cases_of(kernel, tuning.signature(kernel, pointers), constexprs)
            cases += built[:1] if dtype == "fp32" else built
    return [dataclasses.replace(c, same_as=c.name.replace(" | fp16 ", " | bf16 ", 1)) if " | fp16 " in c.name else c
            for c in cases]
