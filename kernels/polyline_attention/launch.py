"""What the launchers of the polyline attention kernels (:mod:`.vanilla`, :mod:`.whole_line`,
:mod:`.line`) share: the precision of their products, the channel blocks of a head dim, and the
head-dim part of a launch's name in the resource table (:mod:`..common.tuning`)."""
from __future__ import annotations

import torch

from ..common import tuning
from ..common.strided import pow2


def precision(dtype: torch.dtype | str) -> str:
    """``tl.dot``'s ``input_precision`` for inputs of ``dtype`` (a torch dtype or a Triton type
    name such as ``'fp32'``): ``'ieee'`` for fp32 (full fp32 products), else ``'tf32'`` (fp16 and
    bf16 products ignore it)."""
    return "ieee" if dtype in (torch.float32, "fp32") else "tf32"


def channel_blocks(d: int, dv: int) -> dict[str, int]:
    """``BLOCK_D``, ``BLOCK_DV``: the channel blocks of head dims ``d`` (``q``, ``k``) and ``dv``
    (``v``), powers of two, at least 16 (``tl.dot``'s smallest tile side)."""
    return dict(BLOCK_D=max(16, pow2(d)), BLOCK_DV=max(16, pow2(dv)))


def head_bucket(args: dict, bounds: tuple[int, ...]) -> str:
    """``'d<=32'``: the head-dim part of a launch's variant name, the smallest of ``bounds`` at
    least the launch's larger channel block (``'d>128'`` past the last)."""
    return "d" + tuning.bucket(max(args["BLOCK_D"], args["BLOCK_DV"]), bounds)
