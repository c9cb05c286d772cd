"""Triton kernels of ``polyline_decays``: PPMA's per-head log-decays from the tokens, one launch forward
and one (with sums of its partial sums) backward.

For token ``t`` of image ``b``, head ``h`` and axis ``a``::

    u[a, b, h, t] = sum_j x[b, t, h*d + j] W[a, j] + dt_bias[h]
    out[a, b, h, t] = -softplus(u) * exp(A_log[h])

``x``: ``(B, N, C)`` with ``C = heads * d`` contiguous (``N`` the grid's tokens); ``W``: ``(n_axes,
d)``; ``out``: ``(n_axes, B, heads, N)``, fp32 (fp64 for fp64 ``x``). One program takes ``BLOCK_T``
tokens of one image, all heads: a ``(BLOCK_T, heads, d)`` tile of ``x`` read once (rows of ``C``
contiguous elements), each axis' ``u`` a reduction over ``d`` in registers, the outputs stored
along the tokens. Where PyTorch ran a GEMM, a layout copy and four elementwise passes forward (and
about a dozen kernels backward), the backward here recomputes ``u`` from ``x``, writes ``dx`` and
each program's partial sums of ``dW``, ``d dt_bias`` and ``d A_log`` (no atomics), which three
PyTorch sums reduce.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.strided import cdiv, pow2

# Elements of the (BLOCK_T, heads, d) tile of x a program holds: 4,096 forward (32 fp32 values a
# thread on 4 warps); 2,048 backward, which also holds dx and the products for dW.
FORWARD_TILE, BACKWARD_TILE = 4096, 2048
FORWARD_CONFIGS = [triton.Config({}, num_warps=4, num_stages=1), triton.Config({}, num_warps=8, num_stages=1)]
# The backward: 106-127 registers on 8 warps, 158-190 on 4, no spills (sm_80 and sm_90, by the resource
# table); launches keep the configurations that spill least.
BACKWARD_CONFIGS = FORWARD_CONFIGS[::-1]


@triton.jit
def _softplus_sigmoid(u):
    """``softplus(u)`` and its derivative ``sigmoid(u)``, from ``e = exp(-|u|)`` (no overflow);
    ``log(1 + e)`` by its series below 1e-4, where ``1 + e`` would round ``e`` away."""
    e = tl.exp(-tl.abs(u))
    log1p = tl.where(e < 1e-4, e * (1.0 - 0.5 * e), tl.log(1.0 + e))
    softplus = tl.maximum(u, 0.0) + log1p
    sigmoid = tl.where(u >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return softplus, sigmoid


@triton.jit
def _tile(X, DT, ALOG, N, HEADS, D, ACC: tl.constexpr, BLOCK_T: tl.constexpr, HP: tl.constexpr,
          DP: tl.constexpr):
    """This program's tokens ``t`` (``BLOCK_T``), heads ``h`` (``HP``) and channels ``j`` (``DP``)
    with their masks, the ``x`` tile ``(BLOCK_T, HP, DP)`` in ``ACC``, its offsets, ``dt_bias`` and
    ``exp(A_log)`` per head."""
    b = tl.program_id(1).to(tl.int64)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.arange(0, HP)
    j = tl.arange(0, DP)
    t_ok, h_ok = t < N, h < HEADS
    offsets = (b * N + t.to(tl.int64))[:, None, None] * (HEADS * D) + (h * D)[None, :, None] + j[None, None, :]
    mask = t_ok[:, None, None] & h_ok[None, :, None] & (j < D)[None, None, :]
    x = tl.load(X + offsets, mask=mask, other=0.0).to(ACC)
    dt = tl.load(DT + h, mask=h_ok, other=0.0).to(ACC)
    a = tl.exp(tl.load(ALOG + h, mask=h_ok, other=0.0).to(ACC))
    return b, t, h, j, t_ok, h_ok, x, offsets, mask, dt, a


def _variant(args: dict) -> str:
    """The resource table's variant: the tokens' dtype (``dx``'s too; the parameters' do not change
    the tile) and the tile's constexprs."""
    return f"{args['X'][1:]} ACC={args['ACC']} BLOCK_T={args['BLOCK_T']} HP={args['HP']} DP={args['DP']}"


@tuning.autotune(FORWARD_CONFIGS, key=["HEADS", "D"], variant=_variant)
@triton.jit(do_not_specialize=["N"])
def _forward_kernel(X, W, DT, ALOG, OUT, N, HEADS, D, AXES, ACC: tl.constexpr, BLOCK_T: tl.constexpr,
                    HP: tl.constexpr, DP: tl.constexpr):
    """``OUT[a, b, h, t]`` for every axis ``a < AXES`` (module doc); program ``(token block, b)``."""
    b, t, h, j, t_ok, h_ok, x, _offsets, _mask, dt, a = _tile(X, DT, ALOG, N, HEADS, D, ACC, BLOCK_T, HP, DP)
    out_offsets = (b * HEADS + h.to(tl.int64))[None, :] * N + t[:, None]
    out_mask = t_ok[:, None] & h_ok[None, :]
    plane = tl.num_programs(1).to(tl.int64) * HEADS * N  # (B, heads, N) values an axis
    for axis in range(0, AXES):
        w = tl.load(W + axis * D + j, mask=j < D, other=0.0).to(ACC)
        u = tl.sum(x * w[None, None, :], axis=2) + dt[None, :]
        softplus, _sigmoid = _softplus_sigmoid(u)
        tl.store(OUT + axis * plane + out_offsets, -softplus * a[None, :], mask=out_mask)


@tuning.autotune(BACKWARD_CONFIGS, key=["HEADS", "D"], variant=_variant, spill_free=True)
@triton.jit(do_not_specialize=["N"])
def _backward_kernel(X, W, DT, ALOG, G, DX, PARTIAL, N, HEADS, D, AXES, ACC: tl.constexpr,
                     BLOCK_T: tl.constexpr, HP: tl.constexpr, DP: tl.constexpr):
    """``DX`` (like ``X``) and this program's row of ``PARTIAL``: ``[dW (AXES, D), d dt_bias (HEADS),
    d A_log (HEADS)]`` summed over its tokens; ``G``: the gradient of ``OUT``."""
    b, t, h, j, t_ok, h_ok, x, offsets, mask, dt, a = _tile(X, DT, ALOG, N, HEADS, D, ACC, BLOCK_T, HP, DP)
    g_offsets = (b * HEADS + h.to(tl.int64))[None, :] * N + t[:, None]
    g_mask = t_ok[:, None] & h_ok[None, :]
    plane = tl.num_programs(1).to(tl.int64) * HEADS * N  # (B, heads, N) values an axis
    row = PARTIAL + (tl.program_id(1).to(tl.int64) * tl.num_programs(0) + tl.program_id(0)) * (AXES * D + 2 * HEADS)
    dx = tl.zeros([BLOCK_T, HP, DP], dtype=ACC)
    d_dt = tl.zeros([HP], dtype=ACC)
    d_alog = tl.zeros([HP], dtype=ACC)
    for axis in range(0, AXES):
        w = tl.load(W + axis * D + j, mask=j < D, other=0.0).to(ACC)
        u = tl.sum(x * w[None, None, :], axis=2) + dt[None, :]
        softplus, sigmoid = _softplus_sigmoid(u)
        g = tl.load(G + axis * plane + g_offsets, mask=g_mask, other=0.0).to(ACC)
        du = -g * a[None, :] * sigmoid  # zero off the tile (g is)
        d_alog += tl.sum(-g * softplus * a[None, :], axis=0)
        d_dt += tl.sum(du, axis=0)
        tl.store(row + axis * D + j, tl.sum(tl.sum(du[:, :, None] * x, axis=0), axis=0), mask=j < D)
        dx += du[:, :, None] * w[None, None, :]
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(row + AXES * D + h, d_dt, mask=h_ok)
    tl.store(row + AXES * D + HEADS + h, d_alog, mask=h_ok)


def block_tokens(tile: int, heads: int, d: int) -> int:
    """``BLOCK_T``: the tokens of a tile of ``tile`` elements, heads and head dim each padded to a power of two."""
    return max(1, tile // (pow2(heads) * pow2(d)))


def _shape(x: torch.Tensor, weight: torch.Tensor, dt_bias: torch.Tensor, tile: int) -> dict:
    """The launch's sizes and constexprs (``x`` ``(B, *grid, C)``)."""
    heads, (axes, d) = dt_bias.shape[0], weight.shape
    return dict(HEADS=heads, D=d, AXES=axes, HP=pow2(heads),
                DP=pow2(d), BLOCK_T=block_tokens(tile, heads, d),
                ACC=tl.float64 if x.dtype == torch.float64 else tl.float32)


def _grid(batch: int, tokens: int):
    return lambda meta: (cdiv(tokens, meta["BLOCK_T"]), batch)


def forward(x: torch.Tensor, weight: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor) -> torch.Tensor:
    """``(n_axes, B, heads, *grid)`` log-decays (fp32; fp64 for fp64 ``x``) of ``x`` ``(B, *grid, C)``,
    ``weight`` ``(n_axes, d)``, ``dt_bias`` and ``A_log`` ``(heads,)``."""
    shape, batch, grid = _shape(x, weight, dt_bias, FORWARD_TILE), x.shape[0], x.shape[1:-1]
    tokens = math.prod(grid)
    out = torch.empty(shape["AXES"], batch, shape["HEADS"], *grid, device=x.device,
                      dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    _forward_kernel[_grid(batch, tokens)](x.contiguous(), weight.contiguous(), dt_bias, A_log, out, tokens, **shape)
    return out


def backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, dt_bias: torch.Tensor,
             A_log: torch.Tensor) -> list[torch.Tensor]:
    """``[dx, dweight, d dt_bias, d A_log]`` (each like its tensor) for ``grad`` like the output."""
    shape, batch, tokens = _shape(x, weight, dt_bias, BACKWARD_TILE), x.shape[0], math.prod(x.shape[1:-1])
    x = x.contiguous()
    dx = torch.empty_like(x)
    blocks = cdiv(tokens, shape["BLOCK_T"])
    width = shape["AXES"] * shape["D"] + 2 * shape["HEADS"]
    partial = torch.empty(batch * blocks, width, device=x.device, dtype=torch.float64 if x.dtype == torch.float64
                          else torch.float32)
    _backward_kernel[_grid(batch, tokens)](x, weight.contiguous(), dt_bias, A_log, grad.contiguous(), dx, partial,
                                           tokens, **shape)
    # one sum per parameter: a custom op's gradients may not be views of one tensor
    d_weight, d_dt, d_alog = (part.sum(0) for part in partial.split([width - 2 * shape["HEADS"], shape["HEADS"],
                                                                      shape["HEADS"]], dim=1))
    return [dx, d_weight.view(weight.shape).to(weight.dtype), d_dt.to(dt_bias.dtype), d_alog.to(A_log.dtype)]


def compile_cases() -> list[tuning.CompileCase]:
    """Both kernels for ``tools/kernel_resources.py``: fp32 and bf16 tokens (fp16 as bf16), the
    presets' heads x head dims (4 x 16 to 16 x 32) and a 64-channel head, two axes."""
    cases = []
    for dtype in ("fp32", "bf16", "fp16"):
        for heads, d in ((4, 16), (4, 32), (8, 32), (16, 32), (8, 64)):
            pads = dict(ACC=tl.float32, HP=pow2(heads), DP=pow2(d))
            params = {"X": f"*{dtype}", "W": "*fp32", "DT": "*fp32", "ALOG": "*fp32", "OUT": "*fp32"}
            cases += tuning.cases_of(_forward_kernel, tuning.signature(_forward_kernel, params),
                                     {**pads, "BLOCK_T": block_tokens(FORWARD_TILE, heads, d)}, fp16_as_bf16=True)
            params = {**params, "G": "*fp32", "DX": f"*{dtype}", "PARTIAL": "*fp32"}
            cases += tuning.cases_of(_backward_kernel, tuning.signature(_backward_kernel, params),
                                     {**pads, "BLOCK_T": block_tokens(BACKWARD_TILE, heads, d)}, fp16_as_bf16=True)
    return cases
