"""Strided addressing and dtype helpers shared by the Triton kernels.

A kernel that walks "lines" (all positions along one dim of a strided tensor, for every index
of four other dims) computes each line's start with :func:`line_offsets` and a block of
``(lines, channels)`` pointers with :func:`block_ptrs`; any strides work, including stride 0
(broadcast) and permuted views.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def line_offsets(line, D1, D2, D3, s0, s1, s2, s3):
    """Memory offsets (int64) of flattened line indices over four dims of sizes ``(., D1, D2, D3)``."""
    line = line.to(tl.int64)
    i3 = line % D3
    rest = line // D3
    i2 = rest % D2
    rest = rest // D2
    i1 = rest % D1
    i0 = rest // D1
    return i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3


@triton.jit
def block_ptrs(ptr, line, chan, D1, D2, D3, s0, s1, s2, s3, sc):
    """``(BLOCK_L, BLOCK_C)`` pointers to position 0 of the program's lines and channels."""
    return ptr + (line_offsets(line, D1, D2, D3, s0, s1, s2, s3)[:, None] + chan[None, :] * sc)


def pow2(v: int) -> int:
    """The smallest power of two >= ``max(v, 1)``. Plain integer arithmetic for the launchers:
    ``triton.next_power_of_2`` and ``triton.cdiv`` are constexpr functions, whose wrapper costs
    the host far more than the arithmetic."""
    return 1 << (max(int(v), 1) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` of integers (``triton.cdiv`` on the host, without its constexpr wrapper)."""
    return -(-a // b)


def accumulation_dtype(t: torch.Tensor) -> torch.dtype:
    """fp64 for fp64 tensors, fp32 otherwise."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


_TL_DTYPES = {torch.float32: tl.float32, torch.float64: tl.float64, torch.float16: tl.float16,
              torch.bfloat16: tl.bfloat16}


def tl_dtype(dtype: torch.dtype):
    """The Triton type of a floating dtype (fp32, fp64, fp16, bf16), e.g. an accumulation dtype."""
    return _TL_DTYPES[dtype]
