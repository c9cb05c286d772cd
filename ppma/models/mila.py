"""MILA: Mamba-Inspired Linear Attention vision backbones (Han et al., NeurIPS 2024, arXiv 2405.16605).

Released as MLLA (github.com/LeapLabTHU/MLLA): MLLA-T/S/B, here ``mila_tiny`` / ``mila_small`` /
``mila_base`` (24.39 M / 43.02 M / 95.98 M parameters, as released), plus ``test_mila`` (tiny,
for generic model tests). Differences from the release: any input size (the release builds its
RoPE buffers and shape asserts for one image size and square grids; here the rotary angles are
computed for the grid of every input).

Official checkpoints (``{'model': state_dict}``) are converted by :func:`checkpoint_filter_fn`::

    timm.create_model('mila_tiny', pretrained=True, pretrained_cfg_overlay=dict(file='mlla_t.pth'))
"""
from __future__ import annotations

import re
from functools import partial
from typing import Sequence

import torch
from timm.layers import trunc_normal_
from timm.models import generate_default_cfgs, register_model
from torch import nn

from ppma.layers import NormPoolHead
from ppma.layers.mila import MILAAttention, MILABlock, MILADownsample, MILAStem

from .checkpoint import finish_conversion, head_and_norm_kwargs, model_state_dict
from .family import Family, register_family
from .registration import build_preset, imagenet_cfg
from .skeleton import HierarchicalBackbone, dense_defaults

__all__ = ["MILA", "checkpoint_filter_fn", "checkpoint_model_kwargs", "PRESETS"]


class MILA(HierarchicalBackbone):
    """MILA backbone: :class:`HierarchicalBackbone` with :class:`~ppma.layers.mila.MILABlock` s
    around :class:`~ppma.layers.mila.MILAAttention`, the released stem, downsampler and head.

    Args (per-stage sequences have one entry per stage):
        embed_dims, depths, num_heads: stage widths (multiples of 4), blocks, heads.
        mlp_ratio: MLP hidden ratio (4 as released).
        qkv_bias: bias of the attention's ``qk`` map.
        other args: see :class:`HierarchicalBackbone` (``output_norms``: the LayerNorms
        ``norm{i}`` of the released detection/segmentation backbones; ``features_only`` models
        get them on their taps).
    """

    def __init__(
        self,
        embed_dims: Sequence[int] = (64, 128, 256, 512),
        depths: Sequence[int] = (2, 4, 8, 4),
        num_heads: Sequence[int] = (2, 4, 8, 16),
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path_rate: float = 0.2,
        **kwargs,
    ):
        if len(num_heads) != len(embed_dims):
            raise ValueError(f"num_heads must have one entry per stage ({len(embed_dims)}), got {tuple(num_heads)}")
        super().__init__(
            [partial(MILAAttention, num_heads=h, qkv_bias=qkv_bias) for h in num_heads],
            embed_dims=embed_dims,
            depths=depths,
            mlp_ratios=mlp_ratio,
            drop_path_rate=drop_path_rate,
            head_layer=NormPoolHead,
            block_layer=MILABlock,
            stem_layer=MILAStem,
            downsample_layer=MILADownsample,
            **kwargs,
        )
        self.apply(_init_weights)


def _init_weights(module: nn.Module) -> None:
    """As released: Linear truncated-normal (std 0.02) with zero bias; LayerNorm ones / zeros."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


# --- official checkpoint conversion ---------------------------------------------------------
# Official: patch_embed.* (stem), layers.i.blocks.j.* (same leaf paths as ours),
# layers.i.downsample.* (end of stage i; ours starts stage i + 1), norm.* / head.* (classifier),
# norm{i}.* (output norms of the detection/segmentation backbones),
# layers.i.blocks.j.attn.rope.rotations (fixed RoPE buffer (H, W, C/2, 2), recomputed here).
_ROPE = re.compile(r"layers\.(\d+)\.blocks\.(\d+)\.attn\.rope\.rotations")


def _convert_official_key(key: str) -> str | None:
    """Our name for an official parameter/buffer name; None for a RoPE ``rotations`` buffer."""
    if _ROPE.fullmatch(key):
        return None
    if key.startswith("patch_embed."):
        return "stem." + key.removeprefix("patch_embed.")
    if m := re.fullmatch(r"layers\.(\d+)\.downsample\.(.+)", key):
        return f"stages.{int(m[1]) + 1}.downsample.{m[2]}"
    if m := re.fullmatch(r"layers\.(\d+)\.blocks\.(.+)", key):
        return f"stages.{m[1]}.blocks.{m[2]}"
    if m := re.fullmatch(r"norm(\d+)\.(\w+)", key):  # output norms of the released dense-prediction backbones
        return f"out_norms.{m[1]}.{m[2]}"
    if m := re.fullmatch(r"(norm|head)\.(\w+)", key):
        return f"head.{'fc' if m[1] == 'head' else 'norm'}.{m[2]}"
    return key  # reported as unexpected by the strict check, under its official name


def _is_official(state_dict: dict) -> bool:
    return any(k.startswith(("patch_embed.", "layers.")) for k in state_dict)


def _check_rope(key: str, value: torch.Tensor, model: MILA) -> None:
    """``ValueError`` naming ``key`` unless the stored rotations equal ours for their grid."""
    m = _ROPE.fullmatch(key)
    stage, block = int(m[1]), int(m[2])
    if stage >= len(model.stages) or block >= len(model.stages[stage].blocks):
        raise ValueError(f"{key}: the model has no block {block} in stage {stage}")
    rope = model.stages[stage].blocks[block].attn.rope
    if value.dim() != 4 or value.shape[2:] != (rope.dim // 2, 2):
        raise ValueError(f"{key} has shape {tuple(value.shape)}, expected (H, W, {rope.dim // 2}, 2) for this model")
    ours = rope.rotations(tuple(value.shape[:2]))
    if not torch.allclose(value.float().cpu(), ours, rtol=1e-5, atol=1e-5):
        err = (value.float().cpu() - ours).abs().max().item()
        raise ValueError(f"{key} does not match this model's 2-D rotary embedding on a "
                         f"{value.shape[0]}x{value.shape[1]} grid (max abs difference {err:.3g})")


def checkpoint_filter_fn(state_dict: dict, model: MILA) -> dict:
    """Convert an official MLLA checkpoint (or one of ours) to ``model``'s layout, strictly.

    Each official ``attn.rope.rotations`` buffer is checked against the rotations the model
    computes for that grid, then dropped (a mismatch: ``ValueError`` naming the key). Every other
    key must map onto one of ``model``'s and every key of ``model`` must be filled, else
    ``ValueError`` naming them. Output norms the checkpoint lacks keep their initialisation; the
    head of a classification checkpoint is dropped when the model has none; the classifier
    ``head.fc`` is left to timm (which adapts it to another ``num_classes``).
    """
    state_dict = model_state_dict(state_dict)
    official = _is_official(state_dict)
    out, source = {}, {}
    for key, value in state_dict.items():
        new_key = _convert_official_key(key) if official else key
        if new_key is None:
            _check_rope(key, value, model)
            continue
        out[new_key], source[new_key] = value, key
    return finish_conversion(out, source, model)


def checkpoint_model_kwargs(state_dict: dict) -> dict:
    """``timm.create_model`` keywords under which a checkpoint (official or our layout) loads:
    ``output_norms`` from ``out_norms.{i}`` (official: ``norm{i}``) keys; ``with_head=False`` without head keys, else
    ``num_classes`` from the classifier (0 when only the head norm is there)."""
    state_dict = model_state_dict(state_dict)
    if _is_official(state_dict):
        return head_and_norm_kwargs(state_dict, r"norm(\d+)\.", ("norm.", "head."), "head.weight")
    return head_and_norm_kwargs(state_dict, r"out_norms\.(\d+)\.", ("head.",), "head.fc.weight")


# --- presets --------------------------------------------------------------------------------
PRESETS = {
    "mila_tiny": dict(embed_dims=(64, 128, 256, 512), depths=(2, 4, 8, 4), num_heads=(2, 4, 8, 16),
                      drop_path_rate=0.2),
    "mila_small": dict(embed_dims=(64, 128, 256, 512), depths=(3, 6, 21, 6), num_heads=(2, 4, 8, 16),
                       drop_path_rate=0.3),
    "mila_base": dict(embed_dims=(96, 192, 384, 768), depths=(3, 6, 21, 6), num_heads=(3, 6, 12, 24),
                      drop_path_rate=0.5),
    # timm's test_* convention: tiny and fast, for generic model tests.
    "test_mila": dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4), mlp_ratio=2.0,
                      drop_path_rate=0.0),
}


def _create_mila(variant: str, pretrained: bool = False, **kwargs) -> MILA:
    kwargs = dense_defaults({**PRESETS[variant], **kwargs})
    return build_preset(MILA, variant, pretrained, checkpoint_filter_fn, **kwargs)


_cfg = partial(imagenet_cfg, first_conv="stem.conv1.conv", paper_ids="arXiv:2405.16605")


_TSINGHUA = "https://cloud.tsinghua.edu.cn/f"
default_cfgs = generate_default_cfgs({
    "mila_tiny.in1k": _cfg(f"{_TSINGHUA}/7a19712877cb4242889c/?dl=1"),
    "mila_small.in1k": _cfg(f"{_TSINGHUA}/0e5d0b1409d540aaa80c/?dl=1"),
    "mila_base.in1k": _cfg(f"{_TSINGHUA}/91c85c5a1061496d8796/?dl=1"),
    "test_mila": _cfg(input_size=(3, 64, 64), pool_size=(2, 2)),
})


@register_model
def mila_tiny(pretrained: bool = False, **kwargs) -> MILA:
    """MILA-T (MLLA-T): widths 64-512, depths 2-4-8-4, 24.39 M params."""
    return _create_mila("mila_tiny", pretrained, **kwargs)


@register_model
def mila_small(pretrained: bool = False, **kwargs) -> MILA:
    """MILA-S (MLLA-S): widths 64-512, depths 3-6-21-6, 43.02 M params."""
    return _create_mila("mila_small", pretrained, **kwargs)


@register_model
def mila_base(pretrained: bool = False, **kwargs) -> MILA:
    """MILA-B (MLLA-B): widths 96-768, depths 3-6-21-6, 95.98 M params."""
    return _create_mila("mila_base", pretrained, **kwargs)


@register_model
def test_mila(pretrained: bool = False, **kwargs) -> MILA:
    """Tiny MILA (widths 16-64, one block per stage) for fast generic model tests."""
    return _create_mila("test_mila", pretrained, **kwargs)


register_family(Family(
    name="mila", model_class=MILA, presets=tuple(PRESETS), checkpoint_filter_fn=checkpoint_filter_fn,
    checkpoint_model_kwargs=checkpoint_model_kwargs, test_preset="test_mila",
))
