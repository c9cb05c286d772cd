"""The plain (non-hierarchical) backbone: patch stem -> blocks over one token sequence -> head.

The sibling of :class:`~ppma.models.HierarchicalBackbone` for ViT-like families (Vim): one
resolution, a token sequence ``(B, N, C)`` with an optional class token (first, or in the middle
of the sequence as in Vim), features tapped after chosen blocks. The mixer factory
``mixer(dim) -> nn.Module`` must declare
``token_layout = SEQUENCE`` (:mod:`ppma.layers.layout`). The timm API is
:class:`~ppma.models.backbone.TimmBackbone`'s.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from ppma.layers import PatchStem, SequenceBlock, TokenPoolHead
from ppma.layers.layout import GRID_2D, SEQUENCE, check_mixer_layout

from .backbone import TimmBackbone, take_indices
from .skeleton import MixerFactory


class PlainBackbone(TimmBackbone):
    """ViT-like backbone with the timm 1.0 model API.

    Args:
        mixer: factory ``mixer(dim) -> nn.Module`` on ``(B, N, C)``, called once per block.
        embed_dim, depth, mlp_ratio: width, number of blocks, MLP ratio of the default block.
        patch_size, img_size: patch size, and the image size the position embedding is learned
            for (other sizes resample it).
        patch_stride: stride of the patches (default ``patch_size``; smaller: overlapping).
        class_token_position: ``'first'`` or ``'middle'`` (see :class:`~ppma.layers.PatchStem`);
            ``forward_features`` returns the class token first in both cases.
        in_chans, num_classes: input channels and classes (0: no classifier).
        class_token, pos_embed: prepend a class token; add a learned absolute position embedding.
        global_pool: ``'token'`` (class token), ``'avg'`` (mean of the patch tokens) or ``''``.
        drop_path_rate: stochastic depth, linear in the block index from 0 to this value.
        taps: the blocks whose outputs are the features (``feature_info``, ``forward_intermediates``);
            default all.
        block_layer: ``block_layer(dim=, mixer=, mlp_ratio=, drop_path=, **block_kwargs)`` on
            ``(B, N, C)`` (e.g. Vim's block: no MLP, ``mlp_ratio=0``, an fp32 residual stream).
        norm_layer: the final norm, ``norm_layer(embed_dim)`` (default LayerNorm, eps 1e-6).
        with_head: build the classification head (False: a pure backbone).

    Input ``(B, in_chans, H, W)``, H, W >= ``patch_size``; ``h, w = (H - patch_size) // patch_stride + 1``,
    same for ``w``. ``forward_features``: normed tokens ``(B, num_prefix_tokens + h*w, embed_dim)``,
    class token first;
    intermediates: the patch tokens of a tap as ``(B, embed_dim, h, w)`` maps (``'NHWC'``:
    channels-last), normed by the final norm if ``norm=True``.
    """

    def __init__(
        self,
        mixer: MixerFactory,
        embed_dim: int = 192,
        depth: int = 12,
        mlp_ratio: float = 4.0,
        patch_size: int = 16,
        img_size: int = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        class_token: bool = True,
        pos_embed: bool = True,
        global_pool: str = "token",
        drop_path_rate: float = 0.0,
        taps: Sequence[int] | None = None,
        block_layer: Callable[..., nn.Module] = SequenceBlock,
        block_kwargs: Mapping[str, Any] | None = None,
        with_head: bool = True,
        patch_stride: int | None = None,
        class_token_position: str = "first",
        norm_layer: Callable[[int], nn.Module] = partial(nn.LayerNorm, eps=1e-6),
    ):
        super().__init__()
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True (or use global_pool='avg')")
        self.num_classes = num_classes if with_head else 0
        self.in_chans = in_chans
        self.input_layout = GRID_2D
        self.min_input_size = patch_size
        self.patch_size = patch_size
        self.patch_stride = patch_stride or patch_size
        self.num_prefix_tokens = int(class_token)
        self.num_features = self.head_hidden_size = embed_dim
        self.grad_checkpointing = False

        self.stem = PatchStem(in_chans, embed_dim, patch_size, img_size, class_token, pos_embed,
                              self.patch_stride, class_token_position)
        dpr = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()
        blocks = []
        for i in range(depth):
            mix = mixer(embed_dim)
            check_mixer_layout(mix, SEQUENCE)
            blocks.append(block_layer(dim=embed_dim, mixer=mix, mlp_ratio=mlp_ratio, drop_path=dpr[i],
                                      **(block_kwargs or {})))
        self.blocks = nn.Sequential(*blocks)
        self.norm = norm_layer(embed_dim)
        self.tap_units = take_indices(depth, taps)[0] if taps is not None else list(range(depth))
        self.feature_info = [dict(num_chs=embed_dim, reduction=self.patch_stride, module=f"blocks.{i}")
                             for i in self.tap_units]
        self.head = TokenPoolHead(embed_dim, num_classes, self.num_prefix_tokens, global_pool) if with_head else None

    # --- TimmBackbone hooks ---------------------------------------------------------------
    def units(self) -> nn.Sequential:
        return self.blocks

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        return self.stem(x), self.stem.grid(x.shape[-2], x.shape[-1])

    def _intermediate(self, tap: int, x: torch.Tensor, grid: tuple, norm: bool, output_fmt: str) -> torch.Tensor:
        if norm:
            x = self.norm(x)
        x = self.stem.patch_tokens(x).unflatten(1, grid)  # (B, h, w, C)
        return x.permute(0, 3, 1, 2).contiguous() if output_fmt == "NCHW" else x

    def _features(self, x: torch.Tensor, grid: tuple) -> torch.Tensor:
        return self.stem.class_token_first(self.norm(x))

    def _prune(self, num_units: int, taps: list[int], prune_norm: bool) -> None:
        self.blocks = self.blocks[:num_units]
        if prune_norm:
            self.norm = nn.Identity()

    @torch.jit.ignore
    def frozen_modules(self, frozen_stages: int) -> list[nn.Module]:
        """-1: ``[]``; k >= 0: the stem (patches, class token, position embedding) and ``blocks[:k]``."""
        if self._check_frozen_stages(frozen_stages) < 0:
            return []
        return [self.stem, *self.blocks[:frozen_stages]]

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^stem", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Normed tokens -> logits ``(B, num_classes)`` (pooled features with ``pre_logits``)."""
        return self._require_head()(x, pre_logits=pre_logits)
