"""VMamba (Liu et al., NeurIPS 2024, arXiv 2401.10166) layers, on channels-last grids ``(B, H, W, C)``.

- :class:`SS2D`: the 2-D selective-scan mixer (``token_layout = '2d'``) in the two released
  forms, ``'v05_noz'`` (VMamba v2: no gate, ``d_state = 1``) and ``'v0'`` (vanilla VMamba:
  SiLU gate ``z``, ``d_state = 16``), on :func:`ppma.ops.cross_selective_scan` (its
  projections and the selective scan along the four routes, as one op);
- :class:`VSSBlock`: norm, SS2D, drop path, and (v2) norm, MLP;
- stems :class:`VMambaStem` (v2: two stride-2 3x3 convs) and :class:`VMambaPatchEmbed` (v1: a
  4x4 patch conv); downsamplers :class:`VMambaDownsample` (v3: a 3x3 stride-2 conv) and
  :class:`PatchMerging` (v1). The classifier (norm, average pool, linear) is
  :class:`ppma.layers.NormPoolHead`, shared with MILA.

The v2 release runs channels-first (``Linear2d`` = 1x1 convs, ``LayerNorm2d``); here the same
maps run channels-last (``nn.Linear``, ``nn.LayerNorm``), and SS2D goes channels-first where the
release's math does (depthwise conv, scans). Parameter names follow the release (``op.in_proj``,
``op.x_proj_weight``, ``op.dt_projs_weight``, ``op.A_logs``, ``op.Ds``, ...).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import DropPath, Mlp
from torch import nn

from ppma.ops import cross_selective_scan

from .conv import channels_last_weight
from .layout import GRID_2D

FORWARD_TYPES = ("v05_noz", "v0")
ROUTES = 4


def _dt_bias(d_inner: int, dt_min: float = 1e-3, dt_max: float = 0.1, floor: float = 1e-4) -> torch.Tensor:
    """Mamba's dt bias: ``softplus^-1(dt)``, ``dt`` log-uniform in ``[dt_min, dt_max]`` (at least ``floor``)."""
    dt = torch.exp(torch.rand(d_inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))


class SS2D(nn.Module):
    """2-D selective scan (VMamba's SS2D) on a channels-last grid.

    With ``D = int(ssm_ratio * dim)`` inner channels, ``N = d_state``, ``R = dt_rank``
    (``'auto'``: ``ceil(dim / 16)``), ``K = 4`` routes and ``L = H W``::

        x = in_proj(x)                          # (B, H, W, D); 'v0': (x, z), z = silu(z)
        x = silu(conv2d(x))                     # 3x3 depthwise (on a channels-first view)
        xs = cross_scan(x)                      # (B, K, D, L)
        dt, B, C = x_proj_weight[k] @ xs[:, k]  # per route: (B, K, R), (B, K, N), (B, K, N) x L
        dt = dt_projs_weight[k] @ dt            # (B, K, D, L)
        ys = selective_scan(xs, dt, -exp(A_logs), B, C, Ds, dt_projs_bias, softplus)  # K groups
        y = out_norm(cross_merge(ys))           # LayerNorm over D, in fp32 as released
        out = out_proj(y)                       # 'v0': out_proj(y * z)

    The lines from ``cross_scan`` to ``cross_merge`` are one op,
    :func:`ppma.ops.cross_selective_scan` (on the CPU it reads the routes from the
    map and merges them back in place of copies).

    Parameters: ``x_proj_weight`` ``(K, R + 2N, D)``, ``dt_projs_weight`` ``(K, D, R)``,
    ``dt_projs_bias`` ``(K, D)``, ``A_logs`` ``(K D, N)``, ``Ds`` ``(K D,)``, initialised as
    released (``A = -[1 .. N]``, ``D = 1``, Mamba's dt); ``A_logs``, ``Ds`` and
    ``dt_projs_bias`` are tagged ``_no_weight_decay``.

    Forward: ``(B, H, W, dim)`` -> ``(B, H, W, dim)``.
    """

    token_layout = GRID_2D

    def __init__(self, dim: int, d_state: int = 1, ssm_ratio: float = 2.0, dt_rank: int | str = "auto",
                 conv_bias: bool = False, forward_type: str = "v05_noz"):
        super().__init__()
        if forward_type not in FORWARD_TYPES:
            raise ValueError(f"forward_type must be one of {FORWARD_TYPES}, got {forward_type!r}")
        d_inner = int(ssm_ratio * dim)
        if d_inner < 1 or d_state < 1:
            raise ValueError(f"ssm_ratio * dim and d_state must be >= 1, got {ssm_ratio} * {dim} and {d_state}")
        self.dim, self.d_inner, self.d_state = dim, d_inner, d_state
        self.dt_rank = math.ceil(dim / 16) if dt_rank == "auto" else int(dt_rank)
        self.forward_type = forward_type
        self.gate = forward_type == "v0"

        self.in_proj = nn.Linear(dim, 2 * d_inner if self.gate else d_inner, bias=False)
        self.act = nn.SiLU()
        self.conv2d = nn.Conv2d(d_inner, d_inner, 3, padding=1, groups=d_inner, bias=conv_bias)
        x_proj = [nn.Linear(d_inner, self.dt_rank + 2 * d_state, bias=False).weight for _ in range(ROUTES)]
        self.x_proj_weight = nn.Parameter(torch.stack(x_proj))
        bound = self.dt_rank**-0.5
        self.dt_projs_weight = nn.Parameter(torch.empty(ROUTES, d_inner, self.dt_rank).uniform_(-bound, bound))
        self.dt_projs_bias = nn.Parameter(torch.stack([_dt_bias(d_inner) for _ in range(ROUTES)]))
        a_log = torch.log(torch.arange(1, d_state + 1, dtype=torch.float32))
        self.A_logs = nn.Parameter(a_log.repeat(ROUTES * d_inner, 1))
        self.Ds = nn.Parameter(torch.ones(ROUTES * d_inner))
        for p in (self.A_logs, self.Ds, self.dt_projs_bias):
            p._no_weight_decay = True
        self.out_norm = nn.LayerNorm(d_inner)
        self.out_proj = nn.Linear(d_inner, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[-1] != self.dim:
            raise ValueError(f"expected channels-last (B, H, W, {self.dim}) tokens, got {tuple(x.shape)}")
        x = self.in_proj(x)
        if self.gate:
            x, z = x.chunk(2, dim=-1)
            z = self.act(z)
        x = self.act(self.conv2d(x.permute(0, 3, 1, 2))).permute(0, 2, 3, 1)  # (B, H, W, D)
        y = cross_selective_scan(x, self.x_proj_weight, self.dt_projs_weight, self.dt_projs_bias,
                                 -self.A_logs.float().exp(), self.Ds.float())
        y = self.out_norm(y.to(self.out_norm.weight.dtype))
        y = y * z if self.gate else y.to(x.dtype)
        return self.out_proj(y)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, d_inner={self.d_inner}, d_state={self.d_state}, dt_rank={self.dt_rank}, "
                f"forward_type={self.forward_type!r}")


class VSSBlock(nn.Module):
    """``x += drop(op(norm(x)))``, then, when ``mlp_ratio > 0``, ``x += drop(mlp(norm2(x)))``.

    Norms LayerNorm (eps 1e-5); ``mlp`` timm's ``Mlp`` (GELU) with ``int(dim * mlp_ratio)``
    hidden channels (the vanilla v0 models have none: ``mlp_ratio = 0``); ``mixer`` (stored as
    ``op``) is :class:`SS2D` as released.

    Forward: ``(B, H, W, C)`` -> ``(B, H, W, C)``.
    """

    def __init__(self, dim: int, mixer: nn.Module, mlp_ratio: float = 4.0, drop_path: float = 0.0):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.op = mixer
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        if mlp_ratio > 0:
            self.norm2 = nn.LayerNorm(dim)
            self.mlp = Mlp(dim, int(dim * mlp_ratio))
        else:
            self.norm2 = self.mlp = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.op(self.norm(x)))
        if self.mlp is not None:
            x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x


class VMambaStem(nn.Module):
    """The v2 patch embed (stride 4): ``norm2(conv2(gelu(norm1(conv1(x)))))``, 3x3 stride-2 convs
    to ``dim / 2`` then ``dim`` channels, LayerNorms over channels.

    Forward: ``(B, in_chans, H, W)`` -> channels-last ``(B, ceil(H/4), ceil(W/4), dim)``.
    """

    def __init__(self, in_chans: int, dim: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_chans, dim // 2, 3, 2, 1)
        self.norm1 = nn.LayerNorm(dim // 2)
        self.act = nn.GELU()
        self.conv2 = channels_last_weight(nn.Conv2d(dim // 2, dim, 3, 2, 1))
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm1(self.conv1(x).permute(0, 2, 3, 1)))
        return self.norm2(self.conv2(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))


class VMambaPatchEmbed(nn.Module):
    """The v1 patch embed of the vanilla models: ``norm(proj(x))``, a 4x4 stride-4 conv.

    Forward: ``(B, in_chans, H, W)`` -> channels-last ``(B, floor(H/4), floor(W/4), dim)`` (as
    released: a partial last patch is dropped).
    """

    def __init__(self, in_chans: int, dim: int, patch_size: int = 4):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, patch_size, patch_size)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


class VMambaDownsample(nn.Module):
    """The v3 downsampler: ``norm(conv(x))``, a 3x3 stride-2 conv and a LayerNorm.

    Forward: channels-last ``(B, H, W, in_dim)`` -> ``(B, ceil(H/2), ceil(W/2), out_dim)``.
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.conv = channels_last_weight(nn.Conv2d(in_dim, out_dim, 3, 2, 1))
        self.norm = nn.LayerNorm(out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))


class PatchMerging(nn.Module):
    """The v1 downsampler (Swin's patch merging): each 2x2 patch's four tokens, in the order
    ``(0,0), (1,0), (0,1), (1,1)`` (row, column), concatenated, LayerNorm, then ``reduction``, a
    linear map ``4 in_dim -> out_dim`` without bias. Odd sizes are zero-padded at the end.

    Forward: channels-last ``(B, H, W, in_dim)`` -> ``(B, ceil(H/2), ceil(W/2), out_dim)``.
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * in_dim)
        self.reduction = nn.Linear(4 * in_dim, out_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[1], x.shape[2]
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        return self.reduction(self.norm(x))
