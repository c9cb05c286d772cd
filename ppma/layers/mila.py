"""MILA (Mamba-Inspired Linear Attention, Han et al., NeurIPS 2024; released as MLLA) layers.

The released model's parts, on channels-last grids ``(B, H, W, C)`` of any size:

- :class:`MILARotaryEmbedding`: 2-D rotary embedding over all channels, computed for the grid
  it is given (the release stores a fixed ``(H, W, C/2, 2)`` buffer for one input size);
- :class:`MILAAttention`: the token mixer (``token_layout = '2d'``);
- :class:`MILABlock`: positional conv, the Mamba-like gated branch around the attention, MLP;
- :class:`MILAStem` (stride 4), :class:`MILADownsample` (stride 2); the classifier is :class:`ppma.layers.NormPoolHead`.

Module names follow the release (``cpe1``, ``in_proj``, ``act_proj``, ``dwc``, ``attn.qk``,
``attn.lepe``, ...), so that official checkpoints map onto them by path.

The arithmetic is the release's, in two arrangements that :mod:`ppma.layers.paths` chooses
between. Training and GPUs take the released layout (channels-last ``q, k`` from one linear map,
1x1 convs, residuals added), with no in-place update of a view (which autograd copies back whole).
CPU inference is arranged for fewer passes over memory (on the CPU these narrow layers spend
more time in elementwise passes and fresh allocations than in FLOPs): ``q``
and ``k`` channels-first ``(B, C, N)``, where the rotary pairs are rows and every per-head product
is a batched matmul without copies; the rotary angles cached per grid; ``elu + 1`` through the
vectorized ``exp``; the residual of each positional conv folded into its kernel; eval-mode
BatchNorms folded into their convs; 1x1 convs on channels-last maps as linear maps; activations,
gates and residual adds in place wherever autograd does not need the overwritten values.
"""
from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from timm.layers import DropPath, Mlp
from torch import nn

from ppma._deprecation import renamed_attributes

from .conv import GridDepthwiseConv
from .grid_tables import cached_per_grid
from .layout import GRID_2D
from .paths import paths_for


def rope_rotations(height: int, width: int, dim: int, base: float = 10000.0,
                   device: torch.device | None = None) -> torch.Tensor:
    """fp32 ``(height, width, dim/2, 2)``: ``(cos, sin)`` of :class:`MILARotaryEmbedding`'s angles."""
    k = dim // 4
    theta = 1.0 / base ** (torch.arange(k, device=device, dtype=torch.float32) / k)
    rows = torch.arange(height, device=device, dtype=torch.float32)[:, None, None] * theta
    cols = torch.arange(width, device=device, dtype=torch.float32)[None, :, None] * theta
    angles = torch.cat((rows.expand(-1, width, -1), cols.expand(height, -1, -1)), dim=-1)  # (H, W, dim/2)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


@cached_per_grid
def rope_tables(height: int, width: int, dim: int, base: float, device: torch.device) -> torch.Tensor:
    """fp32 ``(2, dim/2, height * width)``: ``(cos, sin)`` of :func:`rope_rotations`, channel pair
    first (the layout :class:`MILARotaryEmbedding` rotates channels-first grids with); cached per
    grid in eager (:func:`~ppma.layers.grid_tables.cached_per_grid`)."""
    return rope_rotations(height, width, dim, base, device).flatten(0, 1).permute(2, 1, 0).contiguous()


@cached_per_grid
def rope_phases(height: int, width: int, dim: int, base: float, device: torch.device) -> torch.Tensor:
    """complex64 ``(height * width, dim/2)``: ``cos a_p + i sin a_p`` of :func:`rope_rotations`, per
    token and channel pair (the layout that rotates channels-last tokens); cached as :func:`rope_tables`."""
    return torch.view_as_complex(rope_rotations(height, width, dim, base, device)).flatten(0, 1)


def rotate_channels_last(x: torch.Tensor, height: int, width: int, dim: int, base: float) -> torch.Tensor:
    """:class:`MILARotaryEmbedding` on channels-last tokens ``x`` ``(B, N, ..., dim)`` (``N = height *
    width``; any dims between ``N`` and the channels share the rotation) -> fp32, same shape: the
    channel pairs as complex numbers times the phases, one multiply (under ``torch.compile``, whose
    Inductor generates no code for complex numbers, the same in real arithmetic, fused there)."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (B, N, ..., dim/2, 2)
    between = [1] * (x.dim() - 3)
    if torch.compiler.is_compiling():
        rotations = rope_rotations(height, width, dim, base, x.device).view(height * width, *between, dim // 2, 2)
        cos, sin, re, im = rotations[..., 0], rotations[..., 1], pairs[..., 0], pairs[..., 1]
        return torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1).flatten(-2)
    phases = rope_phases(height, width, dim, base, x.device)  # (N, dim/2)
    phases = phases.view(phases.shape[0], *between, phases.shape[1])
    return torch.view_as_real(torch.view_as_complex(pairs) * phases).flatten(-2)


def rotate_channels_first(x: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    """:class:`MILARotaryEmbedding` on ``x`` ``(B, dim, H, W)`` -> fp32 ``(B, dim, H, W)``: the
    channel pairs are rows ``(2p, 2p+1)``, rotated with in-place updates of their halves."""
    h, w = x.shape[-2], x.shape[-1]
    cos, sin = rope_tables(h, w, dim, base, x.device)  # (dim/2, N) each
    pairs = x.float().reshape(x.shape[0], dim // 2, 2, h * w)
    out = pairs * cos[:, None]
    out[:, :, 0].addcmul_(pairs[:, :, 1], sin, value=-1.0)
    out[:, :, 1].addcmul_(pairs[:, :, 0], sin)
    return out.view(x.shape)


def check_tokens(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` if it is ``(B, H, W, dim)``, else ``ValueError`` (wrapped for ``torch.fx``, so traced
    models keep the check)."""
    if x.dim() != 4 or x.shape[-1] != dim:
        raise ValueError(f"expected channels-last (B, H, W, {dim}) tokens, got {tuple(x.shape)}")
    return x


def _tracked(*xs: torch.Tensor) -> bool:
    """Whether autograd records ops on any of ``xs`` (else they may be overwritten in place)."""
    return any(x.requires_grad for x in xs)


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1`` as ``max(x, 0) + exp(min(x, 0))``, same shape as ``x`` (in place on ``x``
    where autograd does not track it): the vectorized ``exp`` is ~10x faster on the CPU than
    ``elu``'s element-by-element ``expm1``. Equal to the release's up to rounding (1 ulp of 1),
    gradient included (1 at 0, as ``elu``'s: ``min(x, 0)`` by masking, not ``clamp``)."""
    if _tracked(x):
        return torch.exp(x.masked_fill(x > 0, 0)) + F.relu(x)
    e = x.clamp(max=0).exp_()
    return x.relu_().add_(e)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x, inplace=not _tracked(x))


def _gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return F.gelu(x, approximate=approximate) if _tracked(x) else torch.ops.aten.gelu_(x, approximate=approximate)


def _gated(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x * gate if _tracked(x, gate) else x.mul_(gate)


# Wrapped for torch.fx (one graph node each): traced models keep the input check, the rotary
# tables of each input's grid, and the in-place ops (chosen for the tensors of each call; graphs
# would drop in-place updates whose results are not used, as dead code).
torch.fx.wrap("check_tokens")
torch.fx.wrap("rotate_channels_first")
torch.fx.wrap("elu_plus_one")
torch.fx.wrap("_silu")
torch.fx.wrap("_gelu")
torch.fx.wrap("_gated")


class InPlaceSiLU(nn.SiLU):
    """``nn.SiLU``, in place where autograd does not track the input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _silu(x)


class InPlaceGELU(nn.GELU):
    """``nn.GELU``, in place where autograd does not track the input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gelu(x, self.approximate)


def conv_plus_identity(conv: GridDepthwiseConv, x: torch.Tensor) -> torch.Tensor:
    """``x + conv(x)`` on a channels-last grid ``(B, H, W, C)`` -> same shape: one depthwise conv
    with ``conv``'s kernel plus 1 at its centre where :func:`~ppma.layers.paths.paths_for` folds
    residuals, else :meth:`GridDepthwiseConv.plus_input`."""
    if not paths_for(x.device).fold_conv_residual:
        return conv.plus_input(x)
    r = conv.kernel_size[0] // 2
    weight = conv.weight + F.pad(conv.weight.new_ones(conv.weight.shape[0], 1, 1, 1), (r, r, r, r))
    return conv._conv_forward(x.permute(0, 3, 1, 2), weight, conv.bias).permute(0, 2, 3, 1)


class MILARotaryEmbedding(nn.Module):
    """2-D RoPE over all ``C`` channels of a grid, as in the MILA release.

    ``k = C // 4`` frequencies ``theta_m = base ** (-m / k)``, ``m = 0 .. k-1``. Channel pair
    ``(2p, 2p+1)``, ``p = 0 .. C/2 - 1``, of the token at row ``i``, column ``j`` is rotated by
    ``i * theta_p`` for ``p < k`` (the first half of the pairs, by row) and by
    ``j * theta_{p-k}`` for ``p >= k`` (the second half, by column)::

        rope(x)[2p]   = x[2p] cos(a_p) - x[2p+1] sin(a_p)
        rope(x)[2p+1] = x[2p] sin(a_p) + x[2p+1] cos(a_p)

    No parameters or buffers: the angles are computed, in fp32, for the grid of every input
    (cached per grid, see :func:`rope_tables`). Forward: a channels-first grid ``(B, C, H, W)``
    -> fp32 ``(B, C, H, W)`` (the release rotates in fp32).
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rotate_channels_first(x, self.dim, self.base)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}"


class MILAAttention(nn.Module):
    """MILA's linear attention with RoPE and LePE, as released, on any ``H x W`` grid.

    ``q, k = elu(qk(x)) + 1`` (one linear map to ``2C``), ``v = x``; ``N = H W``; per head
    (``h = num_heads``, ``d = C / h``), with RoPE over all ``C`` channels before the head split::

        y = rope(q) (rope(k)^T v) / N  *  1 / (q mean_n(k)^T + 1e-6)  +  lepe(v)

    (the normaliser uses the un-rotated ``q, k``; ``lepe`` is a 3x3 depthwise conv).

    In CPU inference ``q`` and ``k`` are computed channels-first, ``(B, C, N)``: each head is then a
    contiguous ``(d, N)`` block, so the products over heads are batched matmuls without copies (only
    ``v`` is gathered per head); elsewhere (:mod:`ppma.layers.paths`) as released, channels-last.
    Either way ``1 / N`` goes into the ``N`` normalisers rather than ``k`` and ``v``.

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
        if paths_for(x.device).qk_channels_first:
            return self._forward_channels_first(x)
        return self._forward_channels_last(x)

    def _forward_channels_first(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape[0], x.shape[1], x.shape[2], self.dim
        n, heads = h * w, self.num_heads
        xt = x.reshape(b, n, c).transpose(1, 2)  # (B, C, N), a view
        q, k = self._features(xt, 0), self._features(xt, 1)  # (B, C, N) each
        z = torch.bmm(k.mean(-1).view(b * heads, 1, -1), q.view(b * heads, -1, n))  # (B h, 1, N): q . mean_n(k)
        z = z.add_(1e-6).mul_(n).reciprocal_()
        q, k = (self.rope(t.view(b, c, h, w)).view(b * heads, -1, n) for t in (q, k))  # (B h, d, N)
        v = x.reshape(b, n, heads, -1).transpose(1, 2).reshape(b * heads, n, -1)  # (B h, N, d)
        y = torch.bmm(q.transpose(1, 2), torch.bmm(k, v))  # (B h, N, d)
        out = self.lepe(x).reshape(b, n, heads, -1)
        out = out.addcmul_(y.view(b, heads, n, -1).transpose(1, 2), z.view(b, heads, n, 1).transpose(1, 2))
        return out.view(b, h, w, c)

    def _forward_channels_last(self, x: torch.Tensor) -> torch.Tensor:
        """The released layout: ``q, k`` from one linear map to ``(B, N, 2C)``, rotated together;
        the heads gathered once for ``q, k`` and once for ``v``."""
        b, h, w, c = x.shape[0], x.shape[1], x.shape[2], self.dim
        n, heads = h * w, self.num_heads
        qk = F.elu(self.qk(x.reshape(b, n, c))).add_(1.0).view(b, n, 2, heads, -1)  # (B, N, 2, h, d)
        z = (qk[:, :, 0] * qk[:, :, 1].mean(1, keepdim=True)).sum(-1)  # (B, N, h): q . mean_n(k)
        z = z.add_(1e-6).mul_(n).reciprocal_()
        rotated = rotate_channels_last(qk.view(b, n, 2, c), h, w, c, self.rope.base)  # (B, N, 2, C)
        q, k = rotated.view(b, n, 2, heads, -1).permute(2, 0, 3, 1, 4).reshape(2, b * heads, n, -1)  # (B h, N, d)
        v = x.reshape(b, n, heads, -1).transpose(1, 2).reshape(b * heads, n, -1)  # (B h, N, d)
        y = torch.bmm(q, torch.bmm(k.transpose(1, 2), v))  # (B h, N, d)
        out = torch.addcmul(self.lepe(x).reshape(b, n, heads, -1), y.view(b, heads, n, -1).transpose(1, 2),
                            z.unsqueeze(-1))  # out of place: lepe's output is a view
        return out.view(b, h, w, c)

    def _features(self, xt: torch.Tensor, part: int) -> torch.Tensor:
        """``elu(qk(x)) + 1`` of ``q`` (``part`` 0) or ``k`` (1), channels-first: ``(B, C, N)`` -> ``(B, C, N)``."""
        rows = slice(part * self.dim, (part + 1) * self.dim)
        f = torch.matmul(self.qk.weight[rows], xt)
        if self.qk.bias is not None:
            f = f.add_(self.qk.bias[rows, None])
        return elu_plus_one(f)

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
    is the token mixer, :class:`MILAAttention` as released.
    """

    def __init__(self, dim: int, mixer: nn.Module, mlp_ratio: float = 4.0, drop_path: float = 0.0):
        super().__init__()
        self.cpe1 = GridDepthwiseConv(dim, 3)
        self.norm1 = nn.LayerNorm(dim)
        self.in_proj = nn.Linear(dim, dim)
        self.act_proj = nn.Linear(dim, dim)
        self.dwc = GridDepthwiseConv(dim, 3)
        self.act = InPlaceSiLU()
        self.attn = mixer
        self.out_proj = nn.Linear(dim, dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.cpe2 = GridDepthwiseConv(dim, 3)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=InPlaceGELU)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = conv_plus_identity(self.cpe1, x)
        shortcut = x
        x = self.norm1(x)
        gate = self.act(self.act_proj(x))
        x = self.attn(self.act(self.dwc(self.in_proj(x))))
        x = _gated(x, gate)
        x = self.drop_path(self.out_proj(x)).add_(shortcut)
        x = conv_plus_identity(self.cpe2, x)
        return self.drop_path(self.mlp(self.norm2(x))).add_(x)


class ConvNormAct(nn.Module):
    """``act(norm(conv(x)))`` on NCHW maps; ``norm`` BatchNorm2d or none, ``act`` a module class
    taking ``inplace`` (``nn.ReLU``) or none.

    An eval-mode BatchNorm is folded into the conv (:meth:`fused`); a 1x1 conv runs as a linear map
    over the channels of the channels-last view (PyTorch sends single-threaded 1x1 convs of small
    batches to its slow reference conv), so channels-last maps (:data:`torch.channels_last`) stay
    channels-last; the activation runs in place.
    """

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int = 1, groups: int = 1, bias: bool = True,
                 norm: bool = True, act: type[nn.Module] | None = nn.ReLU):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride, kernel_size // 2, groups=groups, bias=bias)
        self.norm = nn.BatchNorm2d(cout) if norm else None
        self.act = act(inplace=True) if act else None

    def fused(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight, bias)`` of the conv with the BatchNorm's eval-mode affine map folded in."""
        weight, bias = self.conv.weight, self.conv.bias
        if self.norm is None:
            return weight, bias
        scale = self.norm.weight * (self.norm.running_var + self.norm.eps).rsqrt()
        shift = self.norm.bias - self.norm.running_mean * scale
        return weight * scale[:, None, None, None], shift if bias is None else shift + bias * scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch_stats = self.norm is not None and self.norm.training
        weight, bias = (self.conv.weight, self.conv.bias) if batch_stats else self.fused()
        if self.conv.kernel_size == (1, 1) and self.conv.stride == (1, 1) and self.conv.groups == 1 \
                and paths_for(x.device).conv1x1_as_linear:
            x = F.linear(x.permute(0, 2, 3, 1), weight.flatten(1), bias).permute(0, 3, 1, 2)
        else:
            x = self.conv._conv_forward(x, weight, bias)
        if batch_stats:
            x = self.norm(x)
        return self.act(x) if self.act is not None else x


class MILAStem(nn.Module):
    """The released stem (stride 4), BatchNorm + ReLU convs without bias::

        x = conv1(x)             # 3x3 s2 -> dim/2
        x = x + conv2(x)         # 3x3 (ReLU), 3x3 (no act)
        x = conv3(x)             # 3x3 s2 -> 4 dim (ReLU), 1x1 -> dim (no act)

    The convs run on channels-last maps. Forward: ``(B, in_chans, H, W)`` -> channels-last
    ``(B, ceil(H/4), ceil(W/4), dim)``.
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
        if paths_for(x.device).channels_last_stem:
            x = x.contiguous(memory_format=torch.channels_last)
        x = self.conv1(x)
        x = self.conv2(x).add_(x)
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


__getattr__ = renamed_attributes(__name__, globals(), {"MILAttention": "MILAAttention"})
