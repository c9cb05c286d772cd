"""Data-dependent decay factors of the polyline path mask (the release's ``PathEmbeding2D``)."""
from __future__ import annotations

import math

import torch
from torch import nn

from ppma._deprecation import renamed_keyword, renamed_property
from ppma.ops import polyline_decays
from ppma.ops.polyline_decays_impl import decays_of_projection

from .hooks import plain_linears
from .layout import GRID_LAYOUTS


class DecayGenerator(nn.Module):
    """Per-token, per-head log-decays for the polyline path mask.

    Every head's slice ``x_h`` (``head_dim`` features) goes through one linear map shared by the
    heads, ``t = W x_h`` (``W``: ``(n, head_dim)``, no bias; ``n = 2`` for a 2-D grid, 3 for 3-D,
    1 when the axes share one decay), and each output becomes a log-decay as in Mamba-2::

        log_decay = -softplus(t + dt_bias[h]) * exp(A_log[h])      (<= 0)

    ``dt_bias`` and ``A_log`` (one per head, shared by the axes) use the Mamba-2 initialisation,
    ``A`` uniform in ``A_init_range`` and ``dt`` log-uniform in ``[dt_min, dt_max]``; both are
    tagged ``_no_weight_decay``.

    Args:
        dim: channels ``C`` of the input; must be divisible by ``num_heads``.
        num_heads: heads; one set of decays per head.
        token_layout: ``'2d'`` (decays alpha along W, beta along H) or ``'3d'`` (plus gamma
            along T); ``grid=`` is its deprecated name.
        shared: one decay for all axes (alpha = beta [= gamma]), the paper's ablation.

    The forward is one op, :func:`ppma.ops.polyline_decays` (on a GPU, a Triton launch each way),
    fed ``proj.weight``; ``proj`` itself is called only when it is not a plain ``nn.Linear`` or a
    hook watches it.

    Forward: ``x`` ``(B, H, W, C)`` (3-D: ``(B, T, H, W, C)``) -> ``(log_alpha, log_beta)``
    (3-D: ``(log_alpha, log_beta, log_gamma)``), each fp32 (fp64 for a float64 module) ``(B, heads, H, W)``
    (3-D: ``(B, heads, T, H, W)``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        token_layout: str = "2d",
        shared: bool = False,
        A_init_range: tuple[float, float] = (1.0, 1.1),
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        dt_init_floor: float = 1e-4,
        *,
        grid: str | None = None,
    ):
        super().__init__()
        token_layout = renamed_keyword("DecayGenerator", "grid", "token_layout", grid, token_layout, "2d")
        if token_layout not in GRID_LAYOUTS:
            raise ValueError(f"token_layout must be one of {GRID_LAYOUTS}, got {token_layout!r}")
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        if not 0 < A_init_range[0] <= A_init_range[1]:
            raise ValueError(f"A_init_range must satisfy 0 < low <= high, got {A_init_range}")
        self.num_heads = num_heads
        self.token_layout = token_layout
        self.shared = shared
        self.num_axes = 3 if token_layout == "3d" else 2
        self.proj = nn.Linear(dim // num_heads, 1 if shared else self.num_axes, bias=False)

        dt = torch.exp(torch.rand(num_heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse of softplus
        self.A_log = nn.Parameter(torch.empty(num_heads).uniform_(*A_init_range).log())
        self.dt_bias._no_weight_decay = True
        self.A_log._no_weight_decay = True

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # one op (ppma.ops.polyline_decays: on a GPU one Triton launch each way); a hooked or
        # replaced projection is called as a module, the same math around it
        if plain_linears(self.proj):
            log_decay = polyline_decays(x, self.proj.weight, self.dt_bias, self.A_log)
        else:
            log_decay = decays_of_projection(self.proj(x.unflatten(-1, (self.num_heads, -1))), self.dt_bias, self.A_log)
        axes = log_decay.unbind(0)
        return axes[:1] * self.num_axes if self.shared else axes

    grid = renamed_property("grid", "token_layout")

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, token_layout={self.token_layout!r}, shared={self.shared}"
