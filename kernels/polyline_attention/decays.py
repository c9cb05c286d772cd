"""Triton line scans of the log-decays along the grid axes, for the launchers of :mod:`.vanilla`:
the cumulative decays its kernels read, and the decay gradients from the sums they write.

Layout: fp32 planes ``(B*heads, T, H, W)``, contiguous (``T = 1`` on a 2-D grid). Plane 0 runs
along W, plane 1 along H, plane 2 along T: a plane's axis has ``S`` steps (W, H or T) ``I``
elements apart (1, W or H*W), and its lines are the ``B*heads*T*H*W / S`` runs along it. One
program owns ``BLOCK_L`` lines and walks them ``BLOCK_S`` steps at a time with ``tl.cumsum``,
carrying each line's sum from block to block. One launch serves every plane (program axis 1),
where PyTorch took a negation, a cumulative sum and a copy per plane (forward), and the slot
sums, two flips, a cumulative sum, a negation and a fill per plane (backward).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import tuning
from ..common.strided import cdiv

# Tiny fp32 tiles (a few hundred kB per launch at PPMA-T's shapes): one configuration.
CONFIGS = [triton.Config({"BLOCK_L": 32, "BLOCK_S": 32}, num_warps=4, num_stages=1)]


@triton.jit
def _plane_lines(plane, T, H, W, total, BLOCK_L: tl.constexpr):
    """The axis of ``plane``: its ``steps`` and their distance ``inner``, and the int64 offsets of
    the first element of this program's lines with their mask."""
    steps = tl.where(plane == 0, W, tl.where(plane == 1, H, T))
    inner = tl.where(plane == 0, 1, tl.where(plane == 1, W, H * W)).to(tl.int64)
    line = tl.program_id(0).to(tl.int64) * BLOCK_L + tl.arange(0, BLOCK_L)
    start = (line // inner) * steps * inner + line % inner
    return steps, inner, start, line < total // steps


@triton.jit
def _of_plane(plane, A, B, C):
    """``A``, ``B`` or ``C``: the pointer of plane 0, 1 or 2."""
    ptr = A
    if plane == 1:
        ptr = B
    if plane == 2:
        ptr = C
    return ptr


@tuning.autotune(CONFIGS, key=["T", "H", "W"])
@triton.jit(do_not_specialize=["T", "H", "W", "total"])
def _cumulative_kernel(LA, LB, LC, G, T, H, W, total, BLOCK_L: tl.constexpr, BLOCK_S: tl.constexpr):
    """``G[p] = cumsum(-log_decay_p)`` along plane ``p``'s axis; ``LA``, ``LB``, ``LC``: the
    log-decays along W, H, T, each ``total`` fp32 values (``LC`` unread on a 2-D grid)."""
    plane = tl.program_id(1)
    steps, inner, start, ok = _plane_lines(plane, T, H, W, total, BLOCK_L)
    src = _of_plane(plane, LA, LB, LC)
    carry = tl.zeros([BLOCK_L], dtype=tl.float32)
    for s0 in range(0, steps, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        offsets = start[:, None] + s[None, :].to(tl.int64) * inner
        mask = ok[:, None] & (s < steps)[None, :]
        x = -tl.load(src + offsets, mask=mask, other=0.0)
        tl.store(G + plane.to(tl.int64) * total + offsets, tl.cumsum(x, axis=1) + carry[:, None], mask=mask)
        carry += tl.sum(x, axis=1)


@tuning.autotune(CONFIGS, key=["T", "H", "W"])
@triton.jit(do_not_specialize=["T", "H", "W", "slots", "total"])
def _gradient_kernel(DG, OA, OB, OC, slots, T, H, W, total, BLOCK_L: tl.constexpr, BLOCK_S: tl.constexpr):
    """The gradient of the log-decay of plane ``p`` (into ``OA``, ``OB``, ``OC``, ``total`` fp32
    values each): ``-`` the reverse cumulative sum along its axis of ``sum_k DG[k, p]``, zero at
    step 0; ``DG``: ``slots`` sets of 3 planes (``d loss / d G``, in parts)."""
    plane = tl.program_id(1)
    steps, inner, start, ok = _plane_lines(plane, T, H, W, total, BLOCK_L)
    dst = _of_plane(plane, OA, OB, OC)
    blocks = tl.cdiv(steps, BLOCK_S)
    carry = tl.zeros([BLOCK_L], dtype=tl.float32)
    for b in range(0, blocks):
        s = (blocks - 1 - b) * BLOCK_S + tl.arange(0, BLOCK_S)
        offsets = start[:, None] + s[None, :].to(tl.int64) * inner
        mask = ok[:, None] & (s < steps)[None, :]
        x = tl.zeros([BLOCK_L, BLOCK_S], dtype=tl.float32)
        slot = DG + plane.to(tl.int64) * total + offsets
        for _ in range(0, slots):
            x += tl.load(slot, mask=mask, other=0.0)
            slot += 3 * total
        suffix = tl.cumsum(x, axis=1, reverse=True) + carry[:, None]
        tl.store(dst + offsets, tl.where(s[None, :] == 0, 0.0, -suffix), mask=mask)
        carry += tl.sum(x, axis=1)


def _planes(log_alpha, log_gamma):
    """``(T, H, W)`` of the decays' grid and the number of planes (2 on a 2-D grid, 3 on 3-D)."""
    grid = log_alpha.shape[2:]
    return ((1, *grid) if log_gamma is None else tuple(grid)), (2 if log_gamma is None else 3)


def _launch(kernel, planes, frames, height, width, *args):
    """``kernel`` over every line of every plane; ``args`` end with ``total``, the values per plane."""
    total, shortest = args[-1], min((width, height, frames)[:planes])
    kernel[lambda meta: (cdiv(total // shortest, meta["BLOCK_L"]), planes)](
        *args[:-1], frames, height, width, total)


def cumulative_decays(log_alpha, log_beta, log_gamma):
    """``(Ga, Gb, Gc)``: fp32 ``(B*heads, N)`` cumulative sums of the negated log-decays
    ``(B, heads, *grid)`` along W, H (and T); ``Gc`` is ``Gb`` on a 2-D grid (unused there)."""
    (frames, height, width), planes = _planes(log_alpha, log_gamma)
    la, lb = log_alpha.float().contiguous(), log_beta.float().contiguous()
    lc = lb if log_gamma is None else log_gamma.float().contiguous()
    bh, total = log_alpha.shape[0] * log_alpha.shape[1], log_alpha.numel()
    g = torch.empty(planes, bh, total // bh, dtype=torch.float32, device=log_alpha.device)
    _launch(_cumulative_kernel, planes, frames, height, width, la, lb, lc, g, total)
    return g[0], g[1], g[planes - 1]


def decay_gradients(dg: torch.Tensor, log_alpha, log_gamma) -> list[torch.Tensor]:
    """The log-decay gradients ``[dlog_alpha, dlog_beta(, dlog_gamma)]``, fp32, shaped like
    ``log_alpha``, from ``dg``: fp32 ``(slots, 3, B*heads, N)`` whose sum over the slots is
    ``d loss / d (Ga, Gb, Gc)`` (:func:`cumulative_decays`). As ``G = cumsum(-log_decay)``, each
    is ``-`` the reverse cumulative sum along its axis, zero at index 0 (which no ``G`` reads)."""
    (frames, height, width), planes = _planes(log_alpha, log_gamma)
    grads = [torch.empty(log_alpha.shape, dtype=torch.float32, device=dg.device) for _ in range(planes)]
    _launch(_gradient_kernel, planes, frames, height, width, dg, grads[0], grads[1], grads[-1], dg.shape[0],
            log_alpha.numel())
    return grads


def compile_cases() -> list[tuning.CompileCase]:
    """Both kernels (one configuration each) for ``tools/kernel_resources.py``."""
    cases = []
    for kernel, pointers in ((_cumulative_kernel, ("LA", "LB", "LC", "G")), (_gradient_kernel, ("DG", "OA", "OB", "OC"))):
        signature = tuning.signature(kernel, {name: "*fp32" for name in pointers})
        cases += tuning.cases_of(kernel, signature, {})
    return cases
