"""Polyline Path Masked Attention (PPMA, arXiv 2506.15940): vanilla, criss-cross and linear kinds."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ppma._deprecation import renamed_attributes, renamed_keyword, renamed_property
from ppma.ops import polyline_attention, polyline_linear_attention
from ppma.ops.polyline_attention_impl import FORMS

from .conv import GridDepthwiseConv, add_to_conv_output
from .decay import DecayGenerator
from .hooks import plain_linears
from .layout import GRID_LAYOUTS
from .paths import paths_for
from .rope import RasterRotaryEmbedding

#: the layer's kinds: the op's (``ppma.ops.polyline_attention_impl.KINDS``) and ``'linear'``
ATTENTION_KINDS = ("vanilla", "criss_cross", "linear")


class _EluPlusOne(torch.autograd.Function):
    """``y = exp(min(x, 0)) + max(x, 0)``; its derivative is ``min(y, 1)`` (``exp(x)`` below 0, 1
    from 0 up, as ``elu``'s), so the backward keeps ``y`` alone: one clamp and one product, where
    autograd through ``maximum``/``minimum`` dispatches twelve ops (their ties split in halves)."""

    @staticmethod
    def forward(x):
        return x.clamp(max=0).exp_().add_(x.clamp(min=0))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y.clamp(max=1)


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """Positive feature map of the linear kind: ``elu(x) + 1`` (> 0 everywhere), computed as
    ``exp(min(x, 0)) + max(x, 0)`` (several times faster than ``elu``'s ``expm1``; equal up to
    rounding, and ``elu``'s gradient). Four elementwise ops forward, two backward. ``x`` any
    shape -> same shape."""
    return _EluPlusOne.apply(x)


class PolylineAttention(nn.Module):
    """Multi-head attention masked by the polyline path mask, on a 2-D or 3-D token grid.

    Shapes: ``x`` ``(B, H, W, C)`` (``token_layout='3d'``: ``(B, T, H, W, C)``) -> same shape.
    ``N = H*W`` (3-D ``T*H*W``) tokens, ``heads`` heads of ``d = C // heads`` channels.

    Common to every kind: ``q, k, v`` are linear maps of ``x``; the rotary embedding
    (:class:`RasterRotaryEmbedding`) rotates ``q`` and ``k``, and ``k`` is scaled by ``d**-0.5``;
    the decay generator maps ``x`` to log-decays ``log_alpha`` (along W), ``log_beta`` (along H)
    and, in 3-D, ``log_gamma`` (along T); LePE, a 5x5 depthwise conv of ``v``, is added to the
    attention output before ``out_proj``. ``L`` is the V2H polyline mask of :mod:`ppma.ops`
    (row = query, column = key), ``L^T`` the H2V mask and ``L2D = L + L^T``.

    Kinds (``kind``); vanilla and criss-cross are :func:`ppma.ops.polyline_attention`, with
    the same ``form`` (``None``, the default, means ``'official'``; ``mask_form=`` and
    ``grid=`` are the deprecated names of ``form=`` and ``token_layout=``):

    - ``'vanilla'``, O(N^2). ``form='official'`` (the released models):
      ``0.5 * softmax(QK^T + log L) V + 0.5 * softmax(QK^T + log L^T) V``;
      ``form='paper'``: ``(softmax(QK^T) * L2D) V``.
    - ``'criss_cross'``, O(N^1.5) (the early stages of the released models): per grid axis
      ``a`` a 1-D attention ``A_a`` among the tokens of each line along ``a``, with the 1-D log
      mask of that axis' decay (official: ``softmax(QK^T + log M_a)``; paper:
      ``softmax(QK^T) * M_a``). Output ``0.5 * A_W A_H V + 0.5 * A_H A_W V`` (3-D:
      ``0.5 * A_W A_H A_T V + 0.5 * A_T A_H A_W V``), the two path orders averaged.
    - ``'linear'``, O(N), never forming ``N x N``: with the positive feature map
      ``phi = elu + 1`` (attribute ``feature_map``), ``q* = phi(q)``, ``k* = phi(k)``::

          out_n = q*_n^T (L2D (k* (x) v))_n / (q*_n . (L2D k*)_n + eps)

      i.e. ``out_n = sum_m L2D[n, m] (q*_n . k*_m) v_m / sum_m L2D[n, m] (q*_n . k*_m)``:
      :func:`ppma.ops.polyline_linear_attention` (the ``L2D`` scans of the ``d*d + d`` channels
      of ``[k* (x) v, k*]``, a few channels at a time). ``form`` does not apply: passing
      one raises ``ValueError``, and the attribute is ``None``.

    Contract for tools that hook the layer without changing it (e.g. :mod:`ppma.vis`):

    - ``decay``: the :class:`DecayGenerator`; its forward returns ``(log_alpha, log_beta)``
      (3-D: ``(log_alpha, log_beta, log_gamma)``), each fp32 ``(B, heads, H, W)``
      (3-D ``(B, heads, T, H, W)``).
    - ``q_tap`` and ``k_tap``: ``nn.Identity`` modules that ``q`` and ``k`` pass through after
      the rotary embedding and the ``d**-0.5`` scaling (of ``k``), shapes ``(B, heads, H, W, d)``
      (3-D ``(B, heads, T, H, W, d)``), called in every kind. For vanilla and criss-cross the
      attention logits are ``q_tap_out @ k_tap_out^T``; the linear kind taps before
      ``feature_map``, its kernel is ``feature_map(q_tap_out) @ feature_map(k_tap_out)^T``.
    - plain attributes ``kind``, ``token_layout``, ``form``, ``num_heads``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        kind: str = "vanilla",
        token_layout: str = "2d",
        form: str | None = None,
        shared_decay: bool = False,
        eps: float = 1e-6,
        *,
        grid: str | None = None,
        mask_form: str | None = None,
    ):
        super().__init__()
        token_layout = renamed_keyword("PolylineAttention", "grid", "token_layout", grid, token_layout, "2d")
        form = renamed_keyword("PolylineAttention", "mask_form", "form", mask_form, form, None)
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"kind must be one of {ATTENTION_KINDS}, got {kind!r}")
        if token_layout not in GRID_LAYOUTS:
            raise ValueError(f"token_layout must be one of {GRID_LAYOUTS}, got {token_layout!r}")
        if kind == "linear" and form is not None:
            raise ValueError(f"form does not apply to the linear kind, got form={form!r}")
        if kind != "linear":
            form = "official" if form is None else form
            if form not in FORMS:
                raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.kind = kind
        self.token_layout = token_layout  # ppma.layers.layout: GRID_2D '2d' or GRID_3D '3d'
        self.form = form
        self.eps = eps
        self.scale = self.head_dim**-0.5
        self.grid_rank = 3 if token_layout == "3d" else 2

        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.lepe = GridDepthwiseConv(dim, 5)
        self.out_proj = nn.Linear(dim, dim)
        self.decay = DecayGenerator(dim, num_heads, token_layout=token_layout, shared=shared_decay)
        self.rope = RasterRotaryEmbedding(self.head_dim, grid_rank=self.grid_rank)
        self.q_tap = nn.Identity()
        self.k_tap = nn.Identity()
        self.feature_map = elu_feature_map

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != self.grid_rank + 2 or x.shape[-1] != self.dim:
            layout = "(B, T, H, W, C)" if self.token_layout == "3d" else "(B, H, W, C)"
            raise ValueError(f"x must have shape {layout} with C={self.dim}, got {tuple(x.shape)}")
        q, k, v = self._project(x)
        lepe = self.lepe(v.movedim(1, -2).flatten(-2))
        # k scaled before the rotation, as the release does (rotating is linear); q and k come out of
        # the rotary embedding contiguous, so the attention kernels copy nothing. CPU inference
        # rotates contiguous copies in place; elsewhere one op rotates both into new tensors (an
        # in-place rotation of their complex views would cost autograd a copy of each)
        if paths_for(x.device).update_views_in_place:
            q, k = self.rope(q.contiguous(), k.contiguous().mul_(self.scale), inplace=True)
        else:
            q, k = self.rope.rotate_qk(q, k, k_scale=self.scale)
        q, k = self.q_tap(q), self.k_tap(k)
        log_alpha, log_beta, log_gamma = _unpack(self.decay(x))
        if self.kind == "linear":
            out = self._linear(q, k, v, log_alpha, log_beta, log_gamma)
        else:
            out = polyline_attention(q, k, v, log_alpha, log_beta, log_gamma, kind=self.kind, form=self.form)
        # the heads merged by the sum with lepe, which lays them out as lepe (B, *grid, heads, d):
        # added into lepe, the conv's fresh output, in CPU inference
        out = add_to_conv_output(lepe.unflatten(-1, (self.num_heads, self.head_dim)), out.movedim(1, -2))
        return self.out_proj(out.flatten(-2))

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k, v`` ``(B, heads, *grid, d)`` of ``x`` ``(B, *grid, C)``.

        One GEMM with the three projections' weights stacked, its output ``(B, *grid, 3, heads,
        d)`` seen as three views: one GEMM for each of the forward, ``dx`` and ``dW`` where three
        ``nn.Linear`` calls take three, no sums of three ``dx``, and under autocast one cast of
        ``x`` (docs/benchmarks.md, "Ops and copies per training step"). Projections that are not
        plain ``nn.Linear`` modules, or that hooks watch (e.g. an adapter, a probe), are called
        as modules."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if not plain_linears(*projections):
            return tuple(self._split_heads(p(x)) for p in projections)
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections])
        qkv = F.linear(x, weight, bias).unflatten(-1, (3, self.num_heads, self.head_dim))
        return qkv.movedim((-3, -2), (0, 2)).unbind(0)

    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``(B, *grid, C)`` -> ``(B, heads, *grid, d)``."""
        return t.unflatten(-1, (self.num_heads, self.head_dim)).movedim(-2, 1)

    def _linear(self, q, k, v, log_alpha, log_beta, log_gamma):
        fq, fk = self.feature_map(q), self.feature_map(k)
        return polyline_linear_attention(fq, fk, v, log_alpha, log_beta, log_gamma, eps=self.eps)

    grid = renamed_property("grid", "token_layout")
    mask_form = renamed_property("mask_form", "form")

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, kind={self.kind!r}, "
            f"token_layout={self.token_layout!r}, form={self.form!r}"
        )


def _unpack(decays):
    """``(log_alpha, log_beta[, log_gamma])`` -> ``(log_alpha, log_beta, log_gamma or None)``."""
    return decays[0], decays[1], (decays[2] if len(decays) == 3 else None)


__getattr__ = renamed_attributes(__name__, globals(), {"KINDS": "ATTENTION_KINDS"})
