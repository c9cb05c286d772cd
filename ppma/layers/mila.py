"""MILA (Mamba-Inspired Linear Attention, Han et al., NeurIPS 2024; released as MLLA) layers.

The released model's parts, on channels-last grids ``(B, H, W, C)`` of any size:

- :class:`MILARotaryEmbedding`: 2-D rotary embedding over all channels, computed for the grid
  it is given (the release stores a fixed ``(H, W, C/2, 2)`` buffer for one input size);
- :class:`MILAttention`: the token mixer (``token_layout = '2d'``);
- :class:`MILABlock`: positional conv, the Mamba-like gated branch around the attention, MLP;
- :class:`MILAStem` (stride 4), :class:`MILADownsample` (stride 2); the classifier is :class:`ppma.layers.NormPoolHead`.

Module names follow the release (``cpe1``, ``in_proj``, ``act_proj``, ``dwc``, ``attn.qk``,
``attn.lepe``, ...), so that official checkpoints map onto them by path.
"""
from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from timm.layers import DropPath, Mlp
from torch import nn

from .conv import GridDepthwiseConv
from .layout import GRID_2D


def rope_rotations(height: int, width: int, dim: int, base: float = 10000.0,
                   device: torch.device | None = None) -> torch.Tensor:
    """fp32 ``(height, width, dim/2, 2)``: ``(cos, sin)`` of :class:`MILARotaryEmbedding`'s angles.

    Wrapped for ``torch.fx``: traced models compute it for the grid of each input.
    """
    k = dim // 4
    theta = 1.0 / base ** (torch.arange(k, device=device, dtype=torch.float32) / k)
    rows = torch.arange(height, device=device, dtype=torch.float32)[:, None, None] * theta
    cols = torch.arange(width, device=device, dtype=torch.float32)[None, :, None] * theta
    angles = torch.cat((rows.expand(-1, width, -1), cols.expand(height, -1, -1)), dim=-1)  # (H, W, dim/2)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def check_tokens(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` if it is ``(B, H, W, dim)``, else ``ValueError`` (wrapped for ``torch.fx``, so traced
    models keep the check)."""
    if x.dim() != 4 or x.shape[-1] != dim:
        raise ValueError(f"expected channels-last (B, H, W, {dim}) tokens, got {tuple(x.shape)}")
    return x


torch.fx.wrap("rope_rotations")
torch.fx.wrap("check_tokens")


class MILARotaryEmbedding(nn.Module):
    """2-D RoPE over all ``C`` channels of a channels-last grid, as in the MILA release.

    ``k = C // 4`` frequencies ``theta_m = base ** (-m / k)``, ``m = 0 .. k-1``. Channel pair
    ``(2p, 2p+1)``, ``p = 0 .. C/2 - 1``, of the token at row ``i``, column ``j`` is rotated by
    ``i * theta_p`` for ``p < k`` (the first half of the pairs, by row) and by
    ``j * theta_{p-k}`` for ``p >= k`` (the second half, by column)::

        rope(x)[2p]   = x[2p] cos(a_p) - x[2p+1] sin(a_p)
        rope(x)[2p+1] = x[2p] sin(a_p) + x[2p+1] cos(a_p)

    No parameters or buffers: the angles are computed, in fp32, for the grid of every input.
    Forward: tensors ``(B, H, W, C)`` of one grid -> a tuple of fp32 ``(B, H, W, C)`` (the
    release rotates in fp32).
    """

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        if dim % 4:
            raise ValueError(f"dim must be a multiple of 4 for the 2-D rotary embedding, got {dim}")
        self.dim = dim
        self.base = base

    def rotations(self, grid: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
        """fp32 ``(H, W, C/2, 2)``: ``(cos a_p, sin a_p)`` per token and channel pair (the release's buffer)."""
        return rope_rotations(grid[0], grid[1], self.dim, self.base, device)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Rotate each of ``xs`` (same grid, e.g. ``q, k = rope(q, k)``); the angles are computed once."""
        rot = rope_rotations(xs[0].shape[-3], xs[0].shape[-2], self.dim, self.base, xs[0].device)
        cos, sin = rot[..., 0], rot[..., 1]
        out = []
        for x in xs:
            pairs = check_tokens(x, self.dim).float().unflatten(-1, (-1, 2))
            re, im = pairs[..., 0], pairs[..., 1]
            out.append(torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1).flatten(-2))
        return tuple(out)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}"


class MILAttention(nn.Module):
    """MILA's linear attention with RoPE and LePE, as released, on any ``H x W`` grid.

    ``q, k = elu(qk(x)) + 1`` (one linear map to ``2C``), ``v = x``; ``N = H W``; per head
    (``h = num_heads``, ``d = C / h``), with RoPE over all ``C`` channels before the head split::

        y = rope(q) (rope(k)^T v) / N  *  1 / (q mean_n(k)^T + 1e-6)  +  lepe(v)

    (the normaliser uses the un-rotated ``q, k``; ``lepe`` is a 3x3 depthwise conv).

    Forward: ``(B, H, W, C)`` -> ``(B, H, W, C)``.
    """

    token_layout = GRID_2D

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim = dim
        self.num_heads = num_heads
        self.qk = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.lepe = GridDepthwiseConv(dim, 3)
        self.rope = MILARotaryEmbedding(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = check_tokens(x, self.dim)
        b, h, w = x.shape[0], x.shape[1], x.shape[2]
        n = h * w
        qk = self.qk(x)
        q, k = F.elu(qk[..., : self.dim]) + 1.0, F.elu(qk[..., self.dim :]) + 1.0

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, H, W, C) -> (B, heads, N, d)
            return t.reshape(b, n, self.num_heads, -1).transpose(1, 2)

        q_rope, k_rope = (heads(t) for t in self.rope(q, k))
        q, k, v = heads(q), heads(k), heads(x)
        z = 1.0 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)  # (B, heads, N, 1)
        kv = (k_rope.transpose(-2, -1) * n**-0.5) @ (v * n**-0.5)  # (B, heads, d, d)
        y = (q_rope @ kv * z).transpose(1, 2).reshape(b, h, w, self.dim)
        return y + self.lepe(x)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}"


class MILABlock(nn.Module):
    """The released MILA block on channels-last tokens ``(B, H, W, C)``::

        x = x + cpe1(x)
        a = silu(act_proj(norm1(x)))
        x = x + drop(out_proj(mixer(silu(dwc(in_proj(norm1(x))))) * a))
        x = x + cpe2(x)
        x = x + drop(mlp(norm2(x)))

    ``cpe1``, ``cpe2``, ``dwc``: 3x3 depthwise convs; norms LayerNorm (eps 1e-5); ``mlp`` timm's
    ``Mlp`` (GELU) with ``int(dim * mlp_ratio)`` hidden channels. ``mixer`` (stored as ``attn``)
    is the token mixer, :class:`MILAttention` as released.
    """

    def __init__(self, dim: int, mixer: nn.Module, mlp_ratio: float = 4.0, drop_path: float = 0.0):
        super().__init__()
        self.cpe1 = GridDepthwiseConv(dim, 3)
        self.norm1 = nn.LayerNorm(dim)
        self.in_proj = nn.Linear(dim, dim)
        self.act_proj = nn.Linear(dim, dim)
        self.dwc = GridDepthwiseConv(dim, 3)
        self.act = nn.SiLU()
        self.attn = mixer
        self.out_proj = nn.Linear(dim, dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.cpe2 = GridDepthwiseConv(dim, 3)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.cpe1(x)
        shortcut = x
        x = self.norm1(x)
        gate = self.act(self.act_proj(x))
        x = self.act(self.dwc(self.in_proj(x)))
        x = shortcut + self.drop_path(self.out_proj(self.attn(x) * gate))
        x = x + self.cpe2(x)
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ConvNormAct(nn.Module):
    """``act(norm(conv(x)))`` on NCHW maps; ``norm`` BatchNorm2d or none, ``act`` a module class or none."""

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int = 1, groups: int = 1, bias: bool = True,
                 norm: bool = True, act: type[nn.Module] | None = nn.ReLU):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride, kernel_size // 2, groups=groups, bias=bias)
        self.norm = nn.BatchNorm2d(cout) if norm else None
        self.act = act() if act else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.norm is not None:
            x = self.norm(x)
        return self.act(x) if self.act is not None else x


class MILAStem(nn.Module):
    """The released stem (stride 4), BatchNorm + ReLU convs without bias::

        x = conv1(x)             # 3x3 s2 -> dim/2
        x = x + conv2(x)         # 3x3 (ReLU), 3x3 (no act)
        x = conv3(x)             # 3x3 s2 -> 4 dim (ReLU), 1x1 -> dim (no act)

    Forward: ``(B, in_chans, H, W)`` -> channels-last ``(B, ceil(H/4), ceil(W/4), dim)``.
    """

    def __init__(self, in_chans: int, dim: int):
        super().__init__()
        half = dim // 2
        self.conv1 = ConvNormAct(in_chans, half, 3, stride=2, bias=False)
        self.conv2 = nn.Sequential(ConvNormAct(half, half, 3, bias=False),
                                   ConvNormAct(half, half, 3, bias=False, act=None))
        self.conv3 = nn.Sequential(ConvNormAct(half, 4 * dim, 3, stride=2, bias=False),
                                   ConvNormAct(4 * dim, dim, 1, bias=False, act=None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.conv2(x) + x
        return self.conv3(x).permute(0, 2, 3, 1)


class MILADownsample(nn.Module):
    """The released downsampler, an inverted bottleneck (hidden ``int(out_dim * ratio)``)::

        1x1 conv + ReLU -> 3x3 depthwise stride-2 conv + ReLU -> 1x1 conv + BatchNorm

    Forward: channels-last ``(B, H, W, in_dim)`` -> ``(B, ceil(H/2), ceil(W/2), out_dim)``.
    """

    def __init__(self, in_dim: int, out_dim: int, ratio: float = 4.0):
        super().__init__()
        hidden = int(out_dim * ratio)
        self.conv = nn.Sequential(
            ConvNormAct(in_dim, hidden, 1, norm=False),
            ConvNormAct(hidden, hidden, 3, stride=2, groups=hidden, norm=False),
            ConvNormAct(hidden, out_dim, 1, act=None),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
