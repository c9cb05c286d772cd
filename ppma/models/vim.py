"""Vim: Vision Mamba, bidirectional state-space backbones (Zhu et al., ICML 2024, arXiv 2401.09417).

Released models (github.com/hustvl/Vim, Apache-2.0), on :class:`PlainBackbone`: ``vim_tiny`` /
``vim_small`` / ``vim_base`` (patch 16, 24 blocks, class token in the middle of the sequence;
7,148,008 / 25,796,584 / 97,598,440 parameters as released) and the stride-8 fine-tuned "+"
models ``vim_tiny_stride8`` / ``vim_small_stride8`` (16-pixel patches every 8 pixels: 27x27 at
224). ``features_only`` models are the release's dense-prediction backbone: no class token, taps
after blocks 5, 11, 17, 23 through the released adapter (:class:`~ppma.layers.vim.DeconvPyramid`) to
strides 4/8/16/32. Not released: ``vim_hier_tiny`` / ``vim_hier_small``, Vim blocks over each
stage's raster sequence in the four-stage :class:`HierarchicalBackbone` at the widths and depths
of PPMA-T / PPMA-S. Tiny ``test_vim`` / ``test_vim_hier`` for generic model tests.

Differences from the release: both directions on every device (the release runs only the forward
one without its CUDA kernels), any input size (position embeddings resampled, class token kept in
the middle), the two directions averaged in fp32. Official checkpoints (``{'model': state_dict}``)
are converted by :func:`checkpoint_filter_fn`::

    timm.create_model('vim_tiny', pretrained=True, pretrained_cfg_overlay=dict(file='vim_t_midclstok_76p1acc.pth'))
"""
from __future__ import annotations

import logging
import math
import re
from functools import partial
from typing import Sequence

import torch
from timm.layers import lecun_normal_, trunc_normal_
from timm.models import generate_default_cfgs, register_model, register_notrace_module
from torch import nn

from ppma.layers.embed import resample_pos_embed
from ppma.layers.vim import BiMamba, DeconvPyramid, RasterBiMamba, VimBlock

from .checkpoint import finish_conversion, head_and_norm_kwargs, model_state_dict
from .family import Family, register_family
from .plain import PlainBackbone
from .registration import build_preset, imagenet_cfg
from .skeleton import HierarchicalBackbone, dense_defaults

_logger = logging.getLogger(__name__)

__all__ = ["Vim", "VimHierarchical", "checkpoint_filter_fn", "checkpoint_model_kwargs", "hierarchical_checkpoint_filter_fn",
           "hierarchical_checkpoint_model_kwargs", "PRESETS"]


# FX (timm's feature extraction) keeps the mixers whole: their scan checks its inputs' shapes.
register_notrace_module(BiMamba)
register_notrace_module(RasterBiMamba)


def pyramid_taps(depth: int) -> list[int]:
    """The blocks the dense-prediction adapter taps: the last of each quarter (24: 5, 11, 17, 23)."""
    return [depth * (i + 1) // 4 - 1 for i in range(4)]


class Vim(PlainBackbone):
    """Plain Vim: :class:`PlainBackbone` with :class:`~ppma.layers.vim.VimBlock` s around
    :class:`~ppma.layers.vim.BiMamba`, the class token in the middle, a final RMSNorm.

    Args:
        embed_dim, depth: width and number of blocks.
        d_state, expand: the Mamba state size and inner width ratio.
        patch_size, patch_stride, img_size: patches (stride default ``patch_size``), and the
            image size the position embedding is learned for.
        class_token, global_pool: ``'token'`` (the class token, as released) or ``'avg'``.
        pyramid: the release's dense-prediction adapter (``features_only`` models): taps after
            :func:`pyramid_taps`, features at strides 4/8/16/32.
        other args: see :class:`PlainBackbone`.

    Input ``(B, in_chans, H, W)``; H, W >= ``patch_size`` (with ``pyramid``: a patch grid of at
    least ``32 / patch_stride``).
    """

    def __init__(
        self,
        embed_dim: int = 192,
        depth: int = 24,
        d_state: int = 16,
        expand: int = 2,
        patch_size: int = 16,
        patch_stride: int | None = None,
        img_size: int = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        class_token: bool = True,
        global_pool: str = "token",
        drop_path_rate: float = 0.0,
        pyramid: bool = False,
        with_head: bool = True,
    ):
        super().__init__(
            partial(BiMamba, d_state=d_state, expand=expand, num_layers=depth),
            embed_dim=embed_dim,
            depth=depth,
            mlp_ratio=0.0,
            patch_size=patch_size,
            img_size=img_size,
            in_chans=in_chans,
            num_classes=num_classes,
            class_token=class_token,
            global_pool=global_pool,
            drop_path_rate=drop_path_rate,
            taps=pyramid_taps(depth) if pyramid else None,
            block_layer=VimBlock,
            with_head=with_head,
            patch_stride=patch_stride,
            class_token_position="middle",
            norm_layer=partial(nn.RMSNorm, eps=1e-5),
        )
        self.pyramid = DeconvPyramid(embed_dim, self.patch_stride) if pyramid else None
        if pyramid:
            for info, reduction in zip(self.feature_info, self.pyramid.reductions):
                info["reduction"] = reduction
            self.min_input_size = patch_size + (32 // self.patch_stride - 1) * self.patch_stride
        # the release's initialisation (the blocks initialise themselves, see BiMamba)
        lecun_normal_(self.stem.proj.weight)
        nn.init.zeros_(self.stem.proj.bias)
        self.stem.pos_embed._no_weight_decay = True  # (truncated normal, 0.02, as released: the stem's own)
        if class_token:
            trunc_normal_(self.stem.cls_token, std=0.02)
            self.stem.cls_token._no_weight_decay = True
        if self.head is not None and num_classes > 0:
            trunc_normal_(self.head.fc.weight, std=0.02)
            nn.init.zeros_(self.head.fc.bias)

    def _intermediate(self, tap: int, x: torch.Tensor, grid: tuple, norm: bool, output_fmt: str) -> torch.Tensor:
        """The tap's patch tokens as a map; through the adapter's op ``tap`` with ``pyramid``."""
        if self.pyramid is None:
            return super()._intermediate(tap, x, grid, norm, output_fmt)
        x = self.pyramid[tap](super()._intermediate(tap, x, grid, norm, "NCHW"))
        return x if output_fmt == "NCHW" else x.permute(0, 2, 3, 1)


class VimHierarchical(HierarchicalBackbone):
    """Hierarchical Vim (not a released model): :class:`HierarchicalBackbone` whose blocks are
    :class:`~ppma.layers.vim.VimBlock` s around :class:`~ppma.layers.vim.RasterBiMamba` (Vim's
    bidirectional Mamba over each stage's raster sequence), with the shared convolutional stem,
    downsamplers and projection head.

    Args:
        embed_dims, depths: per stage.
        d_state, expand: the Mamba state size and inner width ratio.
        other args: see :class:`HierarchicalBackbone`.
    """

    def __init__(
        self,
        embed_dims: Sequence[int] = (64, 128, 256, 512),
        depths: Sequence[int] = (2, 2, 8, 2),
        d_state: int = 16,
        expand: int = 2,
        drop_path_rate: float = 0.1,
        **kwargs,
    ):
        mixer = partial(RasterBiMamba, d_state=d_state, expand=expand, num_layers=sum(depths))
        super().__init__(
            [mixer] * len(embed_dims),
            embed_dims=embed_dims,
            depths=depths,
            mlp_ratios=0.0,
            drop_path_rate=drop_path_rate,
            block_layer=VimBlock,
            **kwargs,
        )


# --- checkpoints ----------------------------------------------------------------------------
# official name -> ours (classification checkpoints of the release)
_OFFICIAL_NAMES = [
    (r"^patch_embed\.", "stem."),
    (r"^cls_token$", "stem.cls_token"),
    (r"^pos_embed$", "stem.pos_embed"),
    (r"^layers\.(\d+)\.", r"blocks.\1."),
    (r"^norm_f\.", "norm."),
    (r"^head\.", "head.fc."),
]
NO_OUTPUT_NORMS = r"(?!)"  # plain models have no per-stage output norms


def _is_official(state_dict: dict) -> bool:
    return "norm_f.weight" in state_dict or any(k.startswith("layers.") for k in state_dict)


def _fit_positions(out: dict, model: Vim) -> None:
    """Resample ``stem.pos_embed`` (a square grid, class token entry in the middle) to the
    model's grid; drop the class token and its entry when the model has none."""
    pos = out.get("stem.pos_embed")
    if pos is None:
        return
    num_cls = int("stem.cls_token" in out)
    if num_cls and model.stem.cls_token is None:
        del out["stem.cls_token"]
        i = (pos.shape[1] - 1) // 2
        pos, num_cls = torch.cat([pos[:, :i], pos[:, i + 1 :]], dim=1), 0
    if num_cls != model.num_prefix_tokens:
        raise ValueError("the checkpoint has no class token (cls_token) but the model has one: build it with "
                         "class_token=False, global_pool='avg'")
    side = math.isqrt(pos.shape[1] - num_cls)
    if side * side != pos.shape[1] - num_cls:
        raise ValueError(f"pos_embed of the checkpoint {tuple(pos.shape)} is not a square grid "
                         f"(+{num_cls} class token)")
    out["stem.pos_embed"] = resample_pos_embed(pos, model.stem.pos_grid, (side, side), num_cls, "middle")


def checkpoint_filter_fn(state_dict: dict, model: Vim) -> dict:
    """Official (hustvl/Vim classification) or our layout -> the plain ``model``'s state dict, strictly.

    Renames the official keys (``patch_embed.proj`` -> ``stem.proj``, ``cls_token`` /
    ``pos_embed`` -> ``stem.*``, ``layers.i`` -> ``blocks.i`` with the mixer's own names,
    ``norm_f`` -> ``norm``, ``head`` -> ``head.fc``); resamples the position embedding to the
    model's grid (class token entry kept in the middle; dropped with the class token for a model
    without one, as the release's dense-prediction backbone). A classification checkpoint has no
    dense-prediction adapter: the adapter keeps its initialisation (logged). Anything else that
    does not match (keys, or shapes, e.g. another variant's checkpoint): ``ValueError`` naming
    the keys.
    """
    state_dict = model_state_dict(state_dict)
    rules = _OFFICIAL_NAMES if _is_official(state_dict) else []
    out, source = {}, {}
    for key, value in state_dict.items():
        new_key = key
        for pattern, repl in rules:
            new_key = re.sub(pattern, repl, new_key)
        out[new_key], source[new_key] = value, key
    _fit_positions(out, model)
    if "norm.weight" not in model.state_dict() and out.pop("norm.weight", None) is not None:
        _logger.info("the model's final norm was pruned (a features model): dropped the checkpoint's")
    return finish_conversion(out, source, model)


def hierarchical_checkpoint_filter_fn(state_dict: dict, model: VimHierarchical) -> dict:
    """Our layout -> ``model``'s state dict, strictly (no hierarchical Vim was released)."""
    state_dict = model_state_dict(state_dict)
    return finish_conversion(dict(state_dict), {k: k for k in state_dict}, model)


def checkpoint_model_kwargs(state_dict: dict) -> dict:
    """``timm.create_model`` keywords under which a plain Vim checkpoint (official or our layout)
    loads: head or not and ``num_classes``, the class token and the adapter (``pyramid``)."""
    state_dict = model_state_dict(state_dict)
    official = _is_official(state_dict)
    classifier = "head.weight" if official else "head.fc.weight"
    kwargs = head_and_norm_kwargs(state_dict, NO_OUTPUT_NORMS, ("head.",), classifier)
    if ("cls_token" if official else "stem.cls_token") not in state_dict:
        kwargs.update(class_token=False, global_pool="avg")
    if any(k.startswith("pyramid.") for k in state_dict):
        kwargs["pyramid"] = True
    return kwargs


def hierarchical_checkpoint_model_kwargs(state_dict: dict) -> dict:
    """``timm.create_model`` keywords under which a hierarchical Vim checkpoint loads: head or
    not, ``num_classes`` and the output norms."""
    return head_and_norm_kwargs(model_state_dict(state_dict), r"out_norms\.(\d+)\.", ("head.",), "head.fc.weight")


# --- presets --------------------------------------------------------------------------------
PRESETS = {
    "vim_tiny": dict(embed_dim=192, depth=24),
    "vim_small": dict(embed_dim=384, depth=24, drop_path_rate=0.05),
    "vim_base": dict(embed_dim=768, depth=24, drop_path_rate=0.1),
    "vim_tiny_stride8": dict(embed_dim=192, depth=24, patch_stride=8),
    "vim_small_stride8": dict(embed_dim=384, depth=24, patch_stride=8),
    # timm's test_* convention: tiny and fast, for generic model tests.
    "test_vim": dict(embed_dim=16, depth=4, d_state=4, patch_size=8, img_size=32),
}
HIERARCHICAL_PRESETS = {
    "vim_hier_tiny": dict(embed_dims=(64, 128, 256, 512), depths=(2, 2, 8, 2), drop_path_rate=0.1),
    "vim_hier_small": dict(embed_dims=(64, 128, 256, 512), depths=(3, 4, 18, 4), drop_path_rate=0.15),
    "test_vim_hier": dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), d_state=4, drop_path_rate=0.0),
}


def _create_vim(variant: str, pretrained: bool = False, **kwargs) -> Vim:
    kwargs = {**PRESETS[variant], **kwargs}
    if kwargs.get("features_only"):  # as the released dense-prediction backbone
        for key, value in dict(pyramid=True, with_head=False, class_token=False, global_pool="avg").items():
            kwargs.setdefault(key, value)
    return build_preset(Vim, variant, pretrained, checkpoint_filter_fn, **kwargs)


def _create_vim_hierarchical(variant: str, pretrained: bool = False, **kwargs) -> VimHierarchical:
    kwargs = dense_defaults({**HIERARCHICAL_PRESETS[variant], **kwargs})
    return build_preset(VimHierarchical, variant, pretrained, hierarchical_checkpoint_filter_fn, **kwargs)


_cfg = partial(imagenet_cfg, first_conv="stem.proj", paper_ids="arXiv:2401.09417", license="apache-2.0", pool_size=None)


_HF = "https://huggingface.co/hustvl"
default_cfgs = generate_default_cfgs({
    "vim_tiny.in1k": _cfg(f"{_HF}/Vim-tiny-midclstok/resolve/main/vim_t_midclstok_76p1acc.pth"),
    "vim_small.in1k": _cfg(f"{_HF}/Vim-small-midclstok/resolve/main/vim_s_midclstok_80p5acc.pth"),
    "vim_base.in1k": _cfg(f"{_HF}/Vim-base-midclstok/resolve/main/vim_b_midclstok_81p9acc.pth"),
    "vim_tiny_stride8.in1k": _cfg(f"{_HF}/Vim-tiny-midclstok/resolve/main/vim_t_midclstok_ft_78p3acc.pth"),
    "vim_small_stride8.in1k": _cfg(f"{_HF}/Vim-small-midclstok/resolve/main/vim_s_midclstok_ft_81p6acc.pth"),
    "test_vim": _cfg(input_size=(3, 32, 32)),
    "vim_hier_tiny": _cfg(pool_size=(7, 7), first_conv="stem.conv1"),
    "vim_hier_small": _cfg(pool_size=(7, 7), first_conv="stem.conv1"),
    "test_vim_hier": _cfg(input_size=(3, 64, 64), pool_size=(2, 2), first_conv="stem.conv1"),
})


@register_model
def vim_tiny(pretrained: bool = False, **kwargs) -> Vim:
    """Vim-Ti: width 192, 24 blocks, patch 16, 7,148,008 params."""
    return _create_vim("vim_tiny", pretrained, **kwargs)


@register_model
def vim_small(pretrained: bool = False, **kwargs) -> Vim:
    """Vim-S: width 384, 24 blocks, patch 16, 25,796,584 params."""
    return _create_vim("vim_small", pretrained, **kwargs)


@register_model
def vim_base(pretrained: bool = False, **kwargs) -> Vim:
    """Vim-B: width 768, 24 blocks, patch 16, 97,598,440 params."""
    return _create_vim("vim_base", pretrained, **kwargs)


@register_model
def vim_tiny_stride8(pretrained: bool = False, **kwargs) -> Vim:
    """Vim-Ti+ (the release's long-sequence fine-tuning): 16-pixel patches at stride 8, 27x27 at 224."""
    return _create_vim("vim_tiny_stride8", pretrained, **kwargs)


@register_model
def vim_small_stride8(pretrained: bool = False, **kwargs) -> Vim:
    """Vim-S+ (the release's long-sequence fine-tuning): 16-pixel patches at stride 8, 27x27 at 224."""
    return _create_vim("vim_small_stride8", pretrained, **kwargs)


@register_model
def test_vim(pretrained: bool = False, **kwargs) -> Vim:
    """Tiny plain Vim (width 16, 4 blocks, patch 8) for fast generic model tests."""
    return _create_vim("test_vim", pretrained, **kwargs)


@register_model
def vim_hier_tiny(pretrained: bool = False, **kwargs) -> VimHierarchical:
    """Hierarchical Vim at PPMA-T's widths 64-512 and depths 2-2-8-2 (not a released model)."""
    return _create_vim_hierarchical("vim_hier_tiny", pretrained, **kwargs)


@register_model
def vim_hier_small(pretrained: bool = False, **kwargs) -> VimHierarchical:
    """Hierarchical Vim at PPMA-S's widths 64-512 and depths 3-4-18-4 (not a released model)."""
    return _create_vim_hierarchical("vim_hier_small", pretrained, **kwargs)


@register_model
def test_vim_hier(pretrained: bool = False, **kwargs) -> VimHierarchical:
    """Tiny hierarchical Vim (widths 16-64, one block per stage) for fast generic model tests."""
    return _create_vim_hierarchical("test_vim_hier", pretrained, **kwargs)


register_family(Family(
    name="vim", model_class=Vim, presets=tuple(PRESETS), checkpoint_filter_fn=checkpoint_filter_fn,
    checkpoint_model_kwargs=checkpoint_model_kwargs, test_preset="test_vim",
))
register_family(Family(
    name="vim_hier", model_class=VimHierarchical, presets=tuple(HIERARCHICAL_PRESETS),
    checkpoint_filter_fn=hierarchical_checkpoint_filter_fn,
    checkpoint_model_kwargs=hierarchical_checkpoint_model_kwargs, test_preset="test_vim_hier",
))
