"""Vim's layers (Zhu et al., ICML 2024, arXiv 2401.09417): the bidirectional Mamba mixer, its block
and the released dense-prediction adapter.

Parameter names follow the release (``in_proj``, ``conv1d``/``conv1d_b``, ``x_proj``/``x_proj_b``,
``dt_proj``/``dt_proj_b``, ``A_log``/``A_b_log``, ``D``/``D_b``, ``out_proj``; the backward
direction's carry ``_b``), so that released checkpoints map one to one.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from ppma.ops import selective_scan

from .layout import GRID_2D, SEQUENCE


def causal_depthwise_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``y_t = bias + sum_k weight[:, 0, k] * x_{t - K + 1 + k}`` (zeros before the start): a
    depthwise ``Conv1d`` of kernel ``K`` padded on the left, as shifted multiply-adds (no slow
    per-channel convolution for half precision on CPUs). ``(B, C, L)`` -> ``(B, C, L)``."""
    k, length = weight.shape[-1], x.shape[-1]
    x = F.pad(x, (k - 1, 0))
    return bias[:, None] + sum(weight[:, :, i] * x[..., i : i + length] for i in range(k))


class BiMamba(nn.Module):
    """Vim's bidirectional Mamba (bimamba v2) on a token sequence.

    ``x, z = in_proj(tokens)`` (width ``d_inner = expand * dim`` each), shared by both directions;
    per direction a causal depthwise conv1d (kernel ``d_conv``, weights of the ``nn.Conv1d`` s
    ``conv1d`` / ``conv1d_b``, run by :func:`causal_depthwise_conv1d`) + SiLU, ``x_proj`` (to ``dt_rank``
    step inputs, ``B`` and ``C`` of ``d_state``), ``dt_proj``, ``A = -exp(A_log)`` and ``D``, and the
    selective scan gated by ``silu(z)``; the backward direction scans the flipped sequence (and
    flipped ``z``), its output is flipped back. ``out_proj`` of the average of the two directions
    (the release's ``if_divide_out``; averaged in fp32, which also keeps fp16 finite).

    Mamba initialisation: ``dt = softplus(dt_proj.bias)`` log-uniform in ``[dt_min, dt_max]``,
    ``A = 1..d_state`` per channel, ``D = 1``, ``out_proj`` PyTorch's default divided by
    ``sqrt(num_layers)``; ``A_log``, ``D`` (and their ``_b``) are tagged ``_no_weight_decay``.

    Forward: ``(B, L, dim)`` -> ``(B, L, dim)``.
    """

    token_layout = SEQUENCE

    def __init__(
        self,
        dim: int,
        d_state: int = 16,
        d_conv: int = 4,
        expand: int = 2,
        dt_rank: int | None = None,
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        num_layers: int = 1,
    ):
        super().__init__()
        d_inner = expand * dim
        dt_rank = dt_rank or math.ceil(dim / 16)
        self.d_inner, self.d_state, self.dt_rank = d_inner, d_state, dt_rank
        self.in_proj = nn.Linear(dim, 2 * d_inner, bias=False)
        for suffix in ("", "_b"):
            self.add_module(f"conv1d{suffix}", nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1))
            self.add_module(f"x_proj{suffix}", nn.Linear(d_inner, dt_rank + 2 * d_state, bias=False))
            dt_proj = nn.Linear(dt_rank, d_inner)
            nn.init.uniform_(dt_proj.weight, -(dt_rank**-0.5), dt_rank**-0.5)
            dt = torch.exp(torch.rand(d_inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
            dt = dt.clamp(min=dt_init_floor)
            with torch.no_grad():
                dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
            self.add_module(f"dt_proj{suffix}", dt_proj)
            a_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(d_inner, 1))
            d = nn.Parameter(torch.ones(d_inner))
            a_log._no_weight_decay = d._no_weight_decay = True
            self.register_parameter("A_log" if not suffix else "A_b_log", a_log)
            self.register_parameter(f"D{suffix}", d)
        self.out_proj = nn.Linear(d_inner, dim, bias=False)
        with torch.no_grad():
            self.out_proj.weight /= math.sqrt(num_layers)

    def _scan_inputs(self, u: torch.Tensor, x_proj: nn.Linear, dt_proj: nn.Linear):
        """Conv output ``u`` ``(B, d_inner, L)`` -> step inputs ``(B, d_inner, L)``, B, C ``(B, d_state, L)``."""
        dt, b, c = x_proj(u.transpose(1, 2)).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        return F.linear(dt, dt_proj.weight).transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, z = self.in_proj(x).transpose(1, 2).chunk(2, dim=1)  # (B, d_inner, L) each
        # Both directions in one conv and one scan: channels [forward | backward (flipped sequence)].
        u, z = torch.cat([u, u.flip(-1)], dim=1), torch.cat([z, z.flip(-1)], dim=1)
        weight = torch.cat([self.conv1d.weight, self.conv1d_b.weight])
        bias = torch.cat([self.conv1d.bias, self.conv1d_b.bias])
        u = F.silu(causal_depthwise_conv1d(u, weight, bias))
        u_f, u_b = u.chunk(2, dim=1)
        (dt_f, b_f, c_f), (dt_b, b_b, c_b) = (self._scan_inputs(u_f, self.x_proj, self.dt_proj),
                                              self._scan_inputs(u_b, self.x_proj_b, self.dt_proj_b))
        y = selective_scan(
            u, torch.cat([dt_f, dt_b], dim=1), -torch.exp(torch.cat([self.A_log, self.A_b_log]).float()),
            torch.stack([b_f, b_b], dim=1), torch.stack([c_f, c_b], dim=1),  # two groups: one per direction
            D=torch.cat([self.D, self.D_b]).float(), z=z,
            delta_bias=torch.cat([self.dt_proj.bias, self.dt_proj_b.bias]).float(), delta_softplus=True,
            out_dtype=torch.float32,
        )
        y_f, y_b = y.chunk(2, dim=1)
        return self.out_proj(((y_f + y_b.flip(-1)) / 2).transpose(1, 2).to(x.dtype))


class RasterBiMamba(BiMamba):
    """:class:`BiMamba` over the raster sequence of a channels-last grid (hierarchical Vim).

    Forward: ``(B, H, W, dim)`` -> ``(B, H, W, dim)``, scanning the ``H*W`` tokens row by row, and back.
    """

    token_layout = GRID_2D

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.flatten(1, 2)).unflatten(1, x.shape[1:3])


class VimBlock(nn.Module):
    """``x = float(x) + drop_path(mixer(rms_norm(x)))``: Vim's block on an fp32 residual stream.

    The release computes ``residual += drop_path(hidden); hidden = mixer(norm(residual))`` with
    a fused add + RMSNorm kernel and the residual in fp32 (``residual_in_fp32``), the drop path of
    block ``i`` acting on the mixer output of block ``i - 1`` (rates ``[0] + linspace``, the last
    mixer output dropped by the final add + norm at the full rate). Written as a residual block,
    that is a drop path of rate ``linspace(0, rate, depth)[i]`` on block ``i``'s own mixer output:
    the same model. No MLP (``mlp_ratio`` must be 0).

    Forward: channels-last tokens ``(B, ..., dim)`` in any dtype -> the residual stream, fp32.
    """

    def __init__(self, dim: int, mixer: nn.Module, mlp_ratio: float = 0.0, drop_path: float = 0.0, eps: float = 1e-5):
        super().__init__()
        if mlp_ratio:
            raise ValueError(f"Vim blocks have no MLP: mlp_ratio must be 0, got {mlp_ratio}")
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.mixer = mixer
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return x + self.drop_path(self.mixer(self.norm(x.to(self.norm.weight.dtype))))


class DeconvPyramid(nn.ModuleList):
    """The released dense-prediction adapter of a plain Vim: four taps -> strides 4, 8, 16, 32.

    From stride 16: deconv x4 (deconv, BatchNorm, GELU, deconv), deconv x2, identity, 2x2 max-pool;
    from stride 8: deconv x2, identity, 2x2 and 4x4 max-pools. The release's SyncBatchNorm is a
    BatchNorm here (OpenMMLab configs convert it). ``self[i]`` maps tap ``i``: ``(B, dim, h, w)``
    -> ``(B, dim, h * s, w * s)`` (``s`` = 4, 2, 1 or 1/2, 1/4, pooling floors).
    """

    def __init__(self, dim: int, stride: int = 16):
        def up():
            return nn.ConvTranspose2d(dim, dim, 2, 2)

        if stride == 16:
            ops = [nn.Sequential(up(), nn.BatchNorm2d(dim), nn.GELU(), up()), up(), nn.Identity(), nn.MaxPool2d(2, 2)]
        elif stride == 8:
            ops = [up(), nn.Identity(), nn.MaxPool2d(2, 2), nn.MaxPool2d(4, 4)]
        else:
            raise ValueError(f"the released adapter exists for patch strides 16 and 8, got {stride}")
        super().__init__(ops)
        self.reductions = (4, 8, 16, 32)
