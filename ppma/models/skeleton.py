"""The hierarchical backbone every family of the package is built on.

stem (stride 4) -> stages (stride 2 downsample + blocks) -> optional per-stage output norms,
NCHW multi-scale features at strides 4/8/16/32, and a classification head. Families (PPMA,
and later Vim/VMamba/MILA) differ only in the token mixer of each stage, given as a factory
``mixer(dim) -> nn.Module`` mapping channels-last ``(B, H, W, C) -> (B, H, W, C)``
(3-D grids: ``(B, T, H, W, C)``).
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint_seq
from torch import nn

from ppma.layers import ConvDownsample, ConvStem, MixerBlock, ProjectionHead
from ppma.layers.decay import GRIDS

MixerFactory = Callable[[int], nn.Module]


def per_frame(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Apply a 2-D channels-last module to every frame: ``(B, T, H, W, C)`` via ``(B*T, H, W, C)``."""
    y = module(x.flatten(0, 1))
    return y.unflatten(0, x.shape[:2])


class Stage(nn.Module):
    """Downsample (identity in the first stage), then blocks. Channels-last in and out."""

    def __init__(self, downsample: nn.Module, blocks: Iterable[nn.Module]):
        super().__init__()
        self.downsample = downsample
        self.blocks = nn.Sequential(*blocks)
        self.grad_checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = per_frame(self.downsample, x) if x.dim() == 5 else self.downsample(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq(self.blocks, x)
        return self.blocks(x)


class HierarchicalBackbone(nn.Module):
    """Four-stage (by default) hierarchical vision backbone with the timm 1.0 model API.

    Args:
        mixers: one factory per stage, ``mixer(dim) -> nn.Module``, called once per block.
        embed_dims, depths, mlp_ratios: per stage.
        in_chans, num_classes: input channels and classes (0: no classifier).
        drop_path_rate: stochastic depth, linear in the block index from 0 to this value.
        layerscale: bool or one bool per stage; ``layerscale_init`` is the initial scale.
        grid: ``'2d'`` for images ``(B, C, H, W)``, ``'3d'`` for clips/volumes ``(B, C, T, H, W)``
            (T is never downsampled; stem and downsamplers run frame by frame).
        output_norms: stage indices (or True for all) that get a LayerNorm on their output
            features, as the released detection/segmentation backbones have; the classifier
            path never uses them.
        with_head: build the classification head (False: a pure backbone, as timm's
            ``features_only`` models and the OpenMMLab adapters use).
        head_layer: ``head_layer(in_dim, num_classes)``, a module with ``forward(x, pre_logits)``
            on channels-last maps and ``reset(num_classes)``.
        block_layer, stem_layer, downsample_layer: the block ``(dim, mixer, mlp_ratio,
            drop_path, layerscale, layerscale_init)``, stem ``(in_chans, dim)`` and
            downsampler ``(in_dim, out_dim)`` classes.
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
        drop_path_rate: float = 0.0,
        layerscale: bool | Sequence[bool] = False,
        layerscale_init: float = 1e-6,
        grid: str = "2d",
        output_norms: bool | Iterable[int] = (),
        with_head: bool = True,
        head_layer: Callable[[int, int], nn.Module] = ProjectionHead,
        block_layer: Callable[..., nn.Module] = MixerBlock,
        stem_layer: Callable[[int, int], nn.Module] = ConvStem,
        downsample_layer: Callable[[int, int], nn.Module] = ConvDownsample,
        min_input_size: int = 32,
    ):
        super().__init__()
        num_stages = len(embed_dims)
        mlp_ratios = _per_stage(mlp_ratios, num_stages, "mlp_ratios")
        layerscale = _per_stage(layerscale, num_stages, "layerscale")
        for name, seq in (("mixers", mixers), ("depths", depths)):
            if len(seq) != num_stages:
                raise ValueError(f"{name} must have one entry per stage ({num_stages}), got {len(seq)}")
        if grid not in GRIDS:
            raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")
        self.num_classes = num_classes if with_head else 0
        self.in_chans = in_chans
        self.grid = grid
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
            blocks = [
                block_layer(dim, mixers[i](dim), mlp_ratios[i], dpr[start + j], layerscale[i], layerscale_init)
                for j in range(depth)
            ]
            stages.append(Stage(downsample, blocks))
            start += depth
            self.feature_info.append(dict(num_chs=dim, reduction=4 * 2**i, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)

        if output_norms is True:
            output_norms = range(num_stages)
        elif output_norms is False:
            output_norms = ()
        self.out_norms = nn.ModuleDict({str(i): nn.LayerNorm(embed_dims[i]) for i in sorted(set(output_norms))})
        self.head = head_layer(embed_dims[-1], num_classes) if with_head else None
        self.head_hidden_size = getattr(self.head, "hidden_dim", embed_dims[-1])

    # --- timm model API -------------------------------------------------------------------
    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Names of parameters tagged ``_no_weight_decay`` (decay-generator ``dt_bias``/``A_log``)."""
        return {name for name, p in self.named_parameters() if getattr(p, "_no_weight_decay", False)}

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

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable
        for stage in self.stages:
            stage.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self._require_head().fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool not in (None, "", "avg"):
            raise ValueError(f"global_pool must be 'avg' (the only pooling of this head), got {global_pool!r}")
        self._require_head().reset(num_classes)
        self.num_classes = num_classes

    def _require_head(self) -> nn.Module:
        if self.head is None:
            raise RuntimeError("this model has no classification head (built as a backbone / features-only model)")
        return self.head

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``x`` is ``(B, in_chans, H, W)`` (3-D ``(B, in_chans, T, H, W)``)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"input must be a torch.Tensor, got {type(x).__name__}")
        layout = "(B, C, T, H, W)" if self.grid == "3d" else "(B, C, H, W)"
        if x.dim() != (5 if self.grid == "3d" else 4):
            raise ValueError(f"input must have shape {layout}, got a rank-{x.dim()} tensor {tuple(x.shape)}")
        if x.shape[1] != self.in_chans:
            raise ValueError(f"input has {x.shape[1]} channels, the model expects in_chans={self.in_chans} {layout}")
        h, w = x.shape[-2:]
        if min(h, w) < self.min_input_size or 0 in x.shape:
            raise ValueError(
                f"input of {h}x{w} is too small: H and W must be >= {self.min_input_size} "
                f"(the stride of the last stage), and no dim may be empty; got {tuple(x.shape)}"
            )

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if self.grid == "3d":  # (B, C, T, H, W) -> per frame -> (B, T, H/4, W/4, C0)
            return self.stem(x.transpose(1, 2).flatten(0, 1)).unflatten(0, (x.shape[0], x.shape[2]))
        return self.stem(x)

    @staticmethod
    def _channels_first(x: torch.Tensor) -> torch.Tensor:
        return x.movedim(-1, 1).contiguous()

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """Stage outputs at strides 4/8/16/32 (``indices`` as in timm: last n if int, all if None).

        Each intermediate is normalized by the stage's output norm when the model has one.
        ``output_fmt='NCHW'``: ``(B, C_s, H_s, W_s)`` (3-D ``(B, C_s, T, H_s, W_s)``); ``'NHWC'``:
        channels-last. ``norm`` is accepted for timm compatibility (there is no final norm).
        Returns the intermediates, or ``(final features NCHW, intermediates)``.
        """
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        stages = self.stages[: max_index + 1] if stop_early or intermediates_only else self.stages
        x = self._stem(x)
        intermediates = []
        for i, stage in enumerate(stages):
            x = stage(x)
            if i in take_indices:
                y = self.out_norms[str(i)](x) if str(i) in self.out_norms else x
                intermediates.append(self._channels_first(y) if output_fmt == "NCHW" else y)
        if intermediates_only:
            return intermediates
        return self._channels_first(x), intermediates

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the stages after the last wanted one, unused output norms and (by default) the head."""
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        self.stages = self.stages[: max_index + 1]
        self.out_norms = nn.ModuleDict({k: v for k, v in self.out_norms.items() if int(k) in take_indices})
        if prune_head or max_index < len(self.feature_info) - 1:
            self.head = None
            self.num_classes = 0
        return take_indices

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Last stage features, NCHW ``(B, C, H/32, W/32)`` (3-D ``(B, C, T, H/32, W/32)``)."""
        x = self._stem(x)
        return self._channels_first(self.stages(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self._require_head()(x.movedim(1, -1), pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def _per_stage(value, num_stages: int, name: str) -> tuple:
    if isinstance(value, (list, tuple)):
        if len(value) != num_stages:
            raise ValueError(f"{name} must have one entry per stage ({num_stages}), got {len(value)}")
        return tuple(value)
    return (value,) * num_stages
