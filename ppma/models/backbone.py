"""The timm model API shared by the package's skeletons.

:class:`TimmBackbone` holds what :class:`~ppma.models.HierarchicalBackbone` and
:class:`~ppma.models.PlainBackbone` have in common: input checks, ``forward_intermediates`` /
``prune_intermediate_layers`` plumbing over the units the features are tapped after (stages or
blocks), classifier reset, gradient checkpointing, ``no_weight_decay``, ``group_matcher``,
``frozen_modules``. A skeleton builds ``stem``, ``head`` (or None) and ``feature_info`` (one
entry per tap) and implements the ``_`` hooks below.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.fx
from timm.models import checkpoint
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from ppma.layers.layout import GRID_3D


def take_indices(num_taps: int, indices: int | Sequence[int] | None = None) -> tuple[list[int], int]:
    """timm's tap selection: None -> all, ``n`` -> the last ``n``, a sequence -> those taps
    (negative from the end). Returns ``(absolute indices in the given order, largest index)``."""
    if indices is None:
        indices = num_taps
    if isinstance(indices, int):
        if not 0 < indices <= num_taps:
            raise ValueError(f"last-n indices must be in 1..{num_taps}, got {indices}")
        taken = list(range(num_taps - indices, num_taps))
    else:
        taken = [num_taps + i if i < 0 else i for i in indices]
        bad = [i for i, j in zip(indices, taken) if not 0 <= j < num_taps]
        if bad or not taken:
            raise ValueError(f"indices must be non-empty and within [-{num_taps}, {num_taps}), got {list(indices)}")
    return taken, max(taken)


def check_input(x: torch.Tensor, in_chans: int, input_layout: str, min_size: int) -> torch.Tensor:
    """``x`` if it is a floating-point ``(B, in_chans, H, W)`` (3-D ``(B, in_chans, T, H, W)``)
    with B >= 1 and H, W >= ``min_size``, else ``TypeError``/``ValueError`` naming the problem.
    A NaN or infinite pixel is a ``ValueError`` too on the CPU; the value check needs the data on
    the host, so it is skipped on other devices (no stall per call) and while compiling, exporting
    or tracing: there a NaN propagates to the outputs, as in timm.

    Wrapped for ``torch.fx``: a traced model keeps the check as one call on the data path (so
    dead-code elimination keeps it), run on the real input.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"the model expects a floating-point image, got {x.dtype}; convert with x.float() / 255 "
                        "and normalize (e.g. with the model's pretrained_cfg mean and std)")
    layout = "(B, C, T, H, W)" if input_layout == GRID_3D else "(B, C, H, W)"
    if x.dim() != (5 if input_layout == GRID_3D else 4):
        raise ValueError(f"input must have shape {layout}, got a rank-{x.dim()} tensor {tuple(x.shape)}")
    if x.shape[1] != in_chans:
        raise ValueError(f"input has {x.shape[1]} channels, the model expects in_chans={in_chans} {layout}")
    if x.shape[0] == 0:
        raise ValueError(f"input is an empty batch (B=0), shape {tuple(x.shape)}: pass at least one image")
    h, w = x.shape[-2:]
    if min(h, w) < min_size or 0 in x.shape:
        raise ValueError(
            f"input of {h}x{w} is too small: H and W must be >= {min_size} "
            f"(the stride of the coarsest features), and no dim may be empty; got {tuple(x.shape)}"
        )
    if x.device.type == "cpu" and not _symbolic(x) and not torch.isfinite(x).all():
        raise ValueError(f"input contains NaN or infinite values (shape {tuple(x.shape)}); check the image "
                         "loading and normalization")
    return x


torch.fx.wrap("check_input")


def _symbolic(x: torch.Tensor) -> bool:
    """Whether ``x`` has no real values to read (compiling, exporting, JIT tracing, fake tensors)."""
    return (torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing()
            or is_fake(x))


class TimmBackbone(nn.Module):
    """timm 1.0 model API over ``stem -> units -> head``; features tapped after chosen units.

    Attributes a skeleton sets: ``in_chans``, ``input_layout`` (``GRID_2D`` images or ``GRID_3D``
    clips), ``min_input_size``, ``num_classes``, ``num_features``, ``head_hidden_size``,
    ``stem``, ``head`` (None for a pure backbone), ``feature_info`` (one dict per tap),
    ``tap_units`` (the unit index of each tap), ``grad_checkpointing``.
    """

    # --- hooks of a skeleton --------------------------------------------------------------
    def units(self) -> nn.Sequential:
        """The modules run one after another between stem and head (stages, or blocks)."""
        raise NotImplementedError

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """Checked input -> ``(tokens for the first unit, its token grid, e.g. ``(h, w)``, or ``()``)``."""
        raise NotImplementedError

    def _intermediate(self, tap: int, x: torch.Tensor, grid: tuple, norm: bool, output_fmt: str) -> torch.Tensor:
        """Feature map of ``tap`` from the tokens after its unit, in ``output_fmt``."""
        raise NotImplementedError

    def _features(self, x: torch.Tensor, grid: tuple) -> torch.Tensor:
        """Tokens after the last unit -> ``forward_features`` output."""
        raise NotImplementedError

    def _prune(self, num_units: int, taps: list[int], prune_norm: bool) -> None:
        """Keep the first ``num_units`` units and what the taps ``taps`` need."""
        raise NotImplementedError

    @torch.jit.ignore
    def frozen_modules(self, frozen_stages: int) -> list[nn.Module]:
        """Modules to freeze for ``frozen_stages`` (-1: none; k >= 0: the stem and the first k units)."""
        raise NotImplementedError

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        raise NotImplementedError

    # --- shared timm API ------------------------------------------------------------------
    def check_input(self, x: torch.Tensor) -> torch.Tensor:
        """``x``; ``ValueError`` unless it is ``(B, in_chans, H, W)`` (3-D ``(B, in_chans, T, H, W)``)."""
        return check_input(x, self.in_chans, self.input_layout, self.min_input_size)

    def _check_frozen_stages(self, frozen_stages: int) -> int:
        if not -1 <= frozen_stages <= len(self.units()):
            raise ValueError(f"frozen_stages must be in -1..{len(self.units())}, got {frozen_stages}")
        return frozen_stages

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Names of parameters tagged ``_no_weight_decay`` (e.g. decay-generator ``dt_bias``/``A_log``)."""
        return {name for name, p in self.named_parameters() if getattr(p, "_no_weight_decay", False)}

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable
        for unit in self.units():
            if hasattr(unit, "grad_checkpointing"):  # a unit that checkpoints its own blocks (a Stage)
                unit.grad_checkpointing = enable

    def _run_unit(self, unit: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and not hasattr(unit, "grad_checkpointing") and not torch.jit.is_scripting():
            return checkpoint(unit, x)
        return unit(x)

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self._require_head().fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """New classifier (0: none); ``global_pool=''`` makes ``forward`` return unpooled maps."""
        self._require_head().reset(num_classes, global_pool)
        self.num_classes = num_classes

    def _require_head(self) -> nn.Module:
        if self.head is None:
            raise RuntimeError("this model has no classification head (built as a backbone / features-only model)")
        return self.head

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """Features at the taps ``indices`` (timm: last n if int, all if None), in unit order.

        ``output_fmt='NCHW'``: ``(B, C, H_s, W_s)`` maps (3-D ``(B, C, T, H_s, W_s)``); ``'NHWC'``:
        channels-last. Returns the intermediates, or ``(forward_features output, intermediates)``.
        """
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        taps, _ = take_indices(len(self.feature_info), indices)
        wanted = {self.tap_units[t]: t for t in taps}
        units = self.units()
        if stop_early or intermediates_only:
            units = units[: max(wanted) + 1]
        x, grid = self._embed(self.check_input(x))
        intermediates = []
        for i, unit in enumerate(units):
            x = self._run_unit(unit, x)
            if i in wanted:
                intermediates.append(self._intermediate(wanted[i], x, grid, norm, output_fmt))
        if intermediates_only:
            return intermediates
        return self._features(x, grid), intermediates

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the units after the last wanted tap, what only they use and (by default) the head."""
        taps, max_tap = take_indices(len(self.feature_info), indices)
        self._prune(self.tap_units[max_tap] + 1, taps, prune_norm)
        if prune_head or max_tap < len(self.feature_info) - 1:
            self.head = None
            self.num_classes = 0
        return taps

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens after the last unit, as the skeleton gives them (``_features``)."""
        x, grid = self._embed(self.check_input(x))
        for unit in self.units():
            x = self._run_unit(unit, x)
        return self._features(x, grid)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

