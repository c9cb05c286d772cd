"""The hierarchical backbone: stem (stride 4) -> stages (stride 2 downsample + blocks).

Optional per-stage output norms, NCHW multi-scale features at strides 4/8/16/32, and a
classification head. Families (PPMA, and later VMamba/MILA) differ in the token mixer of each
stage, given as a factory ``mixer(dim) -> nn.Module`` whose ``token_layout`` is the backbone's
(:mod:`ppma.layers.layout`): channels-last ``(B, H, W, C)``, 3-D ``(B, T, H, W, C)``.
The timm API is :class:`~ppma.models.backbone.TimmBackbone`'s.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from timm.models import checkpoint_seq
from torch import nn

from ppma._deprecation import renamed_keyword, renamed_property
from ppma.layers import ConvDownsample, ConvStem, MixerBlock, ProjectionHead
from ppma.layers.layout import GRID_3D, GRID_LAYOUTS, check_mixer_layout

from .backbone import TimmBackbone, take_indices

MixerFactory = Callable[[int], nn.Module]


def per_frame(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Apply a 2-D channels-last module to every frame: ``(B, T, H, W, C)`` via ``(B*T, H, W, C)``."""
    y = module(x.flatten(0, 1))
    return y.unflatten(0, x.shape[:2])


class Stage(nn.Module):
    """Downsample (identity in the first stage), then blocks. Channels-last ``layout`` in and out."""

    def __init__(self, downsample: nn.Module, blocks: Iterable[nn.Module], layout: str):
        super().__init__()
        self.downsample = downsample
        self.blocks = nn.Sequential(*blocks)
        self.layout = layout
        self.grad_checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = per_frame(self.downsample, x) if self.layout == GRID_3D else self.downsample(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq(self.blocks, x)
        return self.blocks(x)


class HierarchicalBackbone(TimmBackbone):
    """Four-stage (by default) hierarchical vision backbone with the timm 1.0 model API.

    Args:
        mixers: one factory per stage, ``mixer(dim) -> nn.Module``, called once per block; the
            mixer's ``token_layout`` must be the backbone's.
        embed_dims, depths, mlp_ratios: per stage.
        in_chans, num_classes: input channels and classes (0: no classifier).
        global_pool: ``'avg'``, or ``''`` for unpooled maps from ``forward`` (see the head).
        drop_path_rate: stochastic depth, linear in the block index from 0 to this value.
        block_kwargs: extra keyword arguments of ``block_layer``, one dict for all stages or
            one per stage (e.g. PPMA's ``layerscale``, ``layerscale_init``).
        token_layout: ``'2d'`` for images ``(B, C, H, W)`` (blocks see ``(B, H, W, C)``),
            ``'3d'`` for clips/volumes ``(B, C, T, H, W)`` (blocks see ``(B, T, H, W, C)``; T is
            never downsampled; stem and downsamplers run frame by frame). ``grid=`` is its
            deprecated name.
        output_norms: stage indices (or True for all) that get a LayerNorm on their output
            features, as the released detection/segmentation backbones have; the classifier
            path never uses them.
        with_head: build the classification head (False: a pure backbone, as timm's
            ``features_only`` models and the OpenMMLab adapters use).
        head_layer: ``head_layer(in_dim, num_classes, global_pool=...)``, a module with
            ``forward(x, pre_logits)`` on channels-last maps, ``reset(num_classes, global_pool)``
            and ``hidden_dim`` (the pre-logits width).
        block_layer: the block, called ``block_layer(dim=, mixer=, mlp_ratio=, drop_path=,
            **block_kwargs)``, channels-last in and out.
        stem_layer, downsample_layer: stem ``(in_chans, dim)`` (``(B, C, H, W)`` -> channels-last,
            stride 4) and downsampler ``(in_dim, out_dim)`` (channels-last, stride 2).
        min_input_size: smallest accepted H and W (the stride of the last stage).

    Any H, W >= ``min_input_size`` works: the stride-2 convs give stage ``s`` features of
    ``ceil(H / 4 / 2**s) x ceil(W / 4 / 2**s)`` without padding, the convention of the release.
    """

    def __init__(
        self,
        mixers: Sequence[MixerFactory],
        embed_dims: Sequence[int] = (64, 128, 256, 512),
        depths: Sequence[int] = (2, 2, 8, 2),
        mlp_ratios: float | Sequence[float] = 3.0,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        drop_path_rate: float = 0.0,
        block_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] = (),
        token_layout: str = "2d",
        output_norms: bool | Iterable[int] = (),
        with_head: bool = True,
        head_layer: Callable[..., nn.Module] = ProjectionHead,
        block_layer: Callable[..., nn.Module] = MixerBlock,
        stem_layer: Callable[[int, int], nn.Module] = ConvStem,
        downsample_layer: Callable[[int, int], nn.Module] = ConvDownsample,
        min_input_size: int = 32,
        *,
        grid: str | None = None,
    ):
        super().__init__()
        token_layout = renamed_keyword(type(self).__name__, "grid", "token_layout", grid, token_layout, "2d")
        num_stages = len(embed_dims)
        mlp_ratios = per_stage(mlp_ratios, num_stages, "mlp_ratios")
        block_kwargs = per_stage(block_kwargs or {}, num_stages, "block_kwargs")
        for name, seq in (("mixers", mixers), ("depths", depths)):
            if len(seq) != num_stages:
                raise ValueError(f"{name} must have one entry per stage ({num_stages}), got {len(seq)}")
        if token_layout not in GRID_LAYOUTS:
            raise ValueError(f"token_layout must be one of {GRID_LAYOUTS}, got {token_layout!r}")
        self.num_classes = num_classes if with_head else 0
        self.in_chans = in_chans
        self.token_layout = token_layout
        self.input_layout = token_layout
        self.min_input_size = min_input_size
        self.embed_dims = tuple(embed_dims)
        self.num_features = embed_dims[-1]
        self.grad_checkpointing = False

        self.stem = stem_layer(in_chans, embed_dims[0])
        dpr = torch.linspace(0, drop_path_rate, sum(depths), device="cpu").tolist()
        stages, start = [], 0
        self.feature_info = []
        for i, (dim, depth) in enumerate(zip(embed_dims, depths)):
            downsample = downsample_layer(embed_dims[i - 1], dim) if i > 0 else nn.Identity()
            blocks = []
            for j in range(depth):
                mixer = mixers[i](dim)
                check_mixer_layout(mixer, token_layout)
                blocks.append(block_layer(
                    dim=dim, mixer=mixer, mlp_ratio=mlp_ratios[i], drop_path=dpr[start + j], **block_kwargs[i]
                ))
            stages.append(Stage(downsample, blocks, token_layout))
            start += depth
            self.feature_info.append(dict(num_chs=dim, reduction=4 * 2**i, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)
        self.tap_units = list(range(num_stages))

        if output_norms is True:
            output_norms = range(num_stages)
        elif output_norms is False:
            output_norms = ()
        self.out_norms = nn.ModuleDict({str(i): nn.LayerNorm(embed_dims[i]) for i in sorted(set(output_norms))})
        self.head = head_layer(embed_dims[-1], num_classes, global_pool=global_pool) if with_head else None
        self.head_hidden_size = self.head.hidden_dim if with_head else embed_dims[-1]

    grid = renamed_property("grid", "token_layout")

    # --- TimmBackbone hooks ---------------------------------------------------------------
    def units(self) -> nn.Sequential:
        return self.stages

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        if self.token_layout == GRID_3D:  # (B, C, T, H, W) -> per frame -> (B, T, H/4, W/4, C0)
            return self.stem(x.transpose(1, 2).flatten(0, 1)).unflatten(0, (x.shape[0], x.shape[2])), ()
        return self.stem(x), ()

    def _intermediate(self, tap: int, x: torch.Tensor, grid: tuple, norm: bool, output_fmt: str) -> torch.Tensor:
        """Stage ``tap`` output, normed by its output norm if it has one (``norm`` is unused:
        there is no final norm)."""
        if str(tap) in self.out_norms:
            x = self.out_norms[str(tap)](x)
        return _channels_first(x) if output_fmt == "NCHW" else x

    def _features(self, x: torch.Tensor, grid: tuple) -> torch.Tensor:
        """Last stage features, NCHW ``(B, C, H/32, W/32)`` (3-D ``(B, C, T, H/32, W/32)``)."""
        return _channels_first(x)

    def _prune(self, num_units: int, taps: list[int], prune_norm: bool) -> None:
        self.stages = self.stages[:num_units]
        self.out_norms = nn.ModuleDict({k: v for k, v in self.out_norms.items() if int(k) in taps})

    @torch.jit.ignore
    def frozen_modules(self, frozen_stages: int) -> list[nn.Module]:
        """-1: ``[]``; k >= 0: the stem, ``stages[:k]`` and the output norms of those stages."""
        modules = [self.stem] if self._check_frozen_stages(frozen_stages) >= 0 else []
        for i in range(frozen_stages):
            modules.append(self.stages[i])
            if str(i) in self.out_norms:
                modules.append(self.out_norms[str(i)])
        return modules

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(
            stem=r"^stem",
            blocks=r"^stages\.(\d+)" if coarse else [
                (r"^stages\.(\d+)\.downsample", (0,)),
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                (r"^out_norms\.(\d+)", (99999,)),
            ],
        )

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """NCHW features -> logits ``(B, num_classes)`` (see the head for ``pre_logits``, ``global_pool``)."""
        return self._require_head()(x.movedim(1, -1), pre_logits=pre_logits)


def _channels_first(x: torch.Tensor) -> torch.Tensor:
    return x.movedim(-1, 1).contiguous()


def per_stage(value, num_stages: int, name: str) -> tuple:
    """``value`` once per stage: a list/tuple must have one entry per stage, anything else is repeated."""
    if isinstance(value, (list, tuple)):
        if len(value) != num_stages:
            raise ValueError(f"{name} must have one entry per stage ({num_stages}), got {len(value)}")
        return tuple(value)
    return (value,) * num_stages


def dense_defaults(kwargs: dict) -> dict:
    """A hierarchical preset's keywords, with a ``features_only`` model built as the released
    dense-prediction backbones are: no head, an output norm on every tapped stage (unless given)."""
    if kwargs.get("features_only"):
        kwargs = dict(kwargs)
        kwargs.setdefault("output_norms", take_indices(len(kwargs["embed_dims"]), kwargs.get("out_indices"))[0])
        kwargs.setdefault("with_head", False)
    return kwargs
