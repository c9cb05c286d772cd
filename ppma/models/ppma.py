"""PPMA: Polyline Path Masked Attention vision backbones (Zhao et al., NeurIPS 2025, arXiv 2506.15940).

Released models (github.com/zhongchenzhao/PPMA, Apache-2.0): PPMA-T/S/B, whose early stages use
criss-cross attention and later stages vanilla masked attention. Added here: ``ppma_linear_*``
(linear polyline attention in every stage, O(N)), ``ppma_tiny_3d`` (clips and volumes) and
``test_ppma`` (tiny, for generic model tests).

Official checkpoints (``{'model': state_dict}``, also mmdet/mmseg checkpoints with a
``backbone.`` prefix) are converted by :func:`checkpoint_filter_fn`::

    timm.create_model('ppma_tiny', pretrained=True, pretrained_cfg_overlay=dict(file='best.pth'))
"""
from __future__ import annotations

import re
from functools import partial
from typing import Sequence

import torch
from timm.layers import trunc_normal_
from timm.models import generate_default_cfgs, register_model, register_notrace_module, resolve_pretrained_cfg
from torch import nn

from ppma._deprecation import renamed_keyword, renamed_property
from ppma.layers import PolylineAttention, ProjectionHead
from ppma.layers.polyline_attention import ATTENTION_KINDS

from .checkpoint import finish_conversion, head_and_norm_kwargs, model_state_dict
from .family import Family, register_family
from .registration import build_preset, imagenet_cfg
from .skeleton import HierarchicalBackbone, dense_defaults, per_stage

__all__ = ["PPMA", "checkpoint_filter_fn", "PRESETS"]


class PPMA(HierarchicalBackbone):
    """PPMA backbone: :class:`HierarchicalBackbone` with a :class:`PolylineAttention` per block.

    Args (per-stage sequences have one entry per stage):
        embed_dims, depths, num_heads, mlp_ratios: stage widths, blocks, heads, FFN ratios.
        layerscale: bool or one bool per stage (:class:`~ppma.layers.MixerBlock`'s layer scale),
            initialised to ``layerscale_init``.
        attn_kinds: ``'vanilla'``, ``'criss_cross'`` or ``'linear'`` per stage.
        form: ``'official'`` (mask inside the softmax, the released weights) or ``'paper'``
            (``mask_form=`` is its deprecated name).
        token_layout: ``'2d'`` (images ``(B, C, H, W)``) or ``'3d'`` (``(B, C, T, H, W)``)
            (``grid=`` is its deprecated name).
        shared_decay: one decay for all grid axes (alpha = beta), the paper's ablation.
        head_hidden_dim: width of the head's projection (the pre-logits features), 1024 as released.
        other args: see :class:`HierarchicalBackbone`.
    """

    def __init__(
        self,
        embed_dims: Sequence[int] = (64, 128, 256, 512),
        depths: Sequence[int] = (2, 2, 8, 2),
        num_heads: Sequence[int] = (4, 4, 8, 16),
        mlp_ratios: float | Sequence[float] = 3.0,
        attn_kinds: Sequence[str] = ("criss_cross", "criss_cross", "vanilla", "vanilla"),
        form: str = "official",
        token_layout: str = "2d",
        shared_decay: bool = False,
        drop_path_rate: float = 0.1,
        layerscale: bool | Sequence[bool] = False,
        layerscale_init: float = 1e-6,
        head_hidden_dim: int = 1024,
        *,
        mask_form: str | None = None,
        grid: str | None = None,
        **kwargs,
    ):
        form = renamed_keyword("PPMA", "mask_form", "form", mask_form, form, "official")
        token_layout = renamed_keyword("PPMA", "grid", "token_layout", grid, token_layout, "2d")
        for name, seq in (("num_heads", num_heads), ("attn_kinds", attn_kinds)):
            if len(seq) != len(embed_dims):
                raise ValueError(f"{name} must have one entry per stage ({len(embed_dims)}), got {tuple(seq)}")
        for kind in attn_kinds:
            if kind not in ATTENTION_KINDS:
                raise ValueError(f"attn_kinds entries must be one of {ATTENTION_KINDS}, got {kind!r}")
        mixers = [
            partial(
                PolylineAttention, num_heads=h, kind=k, token_layout=token_layout, shared_decay=shared_decay,
                form=None if k == "linear" else form,  # form does not apply to linear
            )
            for h, k in zip(num_heads, attn_kinds)
        ]
        block_kwargs = [
            dict(layerscale=ls, layerscale_init=layerscale_init)
            for ls in per_stage(layerscale, len(embed_dims), "layerscale")
        ]
        super().__init__(
            mixers,
            embed_dims=embed_dims,
            depths=depths,
            mlp_ratios=mlp_ratios,
            drop_path_rate=drop_path_rate,
            block_kwargs=block_kwargs,
            token_layout=token_layout,
            head_layer=partial(ProjectionHead, hidden_dim=head_hidden_dim),
            **kwargs,
        )
        self.attn_kinds = tuple(attn_kinds)
        self.form = form
        self.apply(_init_weights)

    mask_form = renamed_property("mask_form", "form")


# torch.fx (timm's feature extraction, test_models' FX tests) keeps the mixer as one call: its
# shape checks and data-dependent kind dispatch are not symbolically traceable.
register_notrace_module(PolylineAttention)


def _init_weights(module: nn.Module) -> None:
    """As released: every Linear truncated-normal (std 0.02) with zero bias."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


# --- official checkpoint conversion ---------------------------------------------------------
# Official stem: patch_embed.proj = Sequential(conv, BN, GELU, conv, BN, GELU, conv, BN, GELU, conv, BN).
_STEM = {
    "0": "conv1", "1": "norm1", "3": "conv2", "4": "norm2", "6": "conv3", "7": "norm3", "9": "conv4", "10": "norm4",
}
# Module paths inside an official block -> ours (leaf names are unchanged).
_BLOCK = {
    "retention_layer_norm": "norm1",
    "final_layer_norm": "norm2",
    "pos.conv": "pos_conv",
    "retention.q_proj": "mixer.q_proj",
    "retention.k_proj": "mixer.k_proj",
    "retention.v_proj": "mixer.v_proj",
    "retention.out_proj": "mixer.out_proj",
    "retention.lepe.conv": "mixer.lepe",
    "retention.path_embed.dt_linear": "mixer.decay.proj",
    "retention.path_embed": "mixer.decay",
    "ffn.fc1": "mlp.fc1",
    "ffn.fc2": "mlp.fc2",
    "ffn.dwconv.conv": "mlp.dwconv",
}
_LAYER_SCALE = {"gamma_1": "ls1.gamma", "gamma_2": "ls2.gamma"}
_TOP = {"proj": "head.fc1", "norm": "head.norm", "head": "head.fc"}


def _convert_official_key(key: str) -> str | None:
    """Our name for an official parameter/buffer name; None for the RoPE ``angle`` buffers."""
    if m := re.fullmatch(r"patch_embed\.proj\.(\d+)\.(\w+)", key):
        if m[1] in _STEM:
            return f"stem.{_STEM[m[1]]}.{m[2]}"
    elif re.fullmatch(r"layers\.\d+\.Relpos\.angle", key):
        return None
    elif m := re.fullmatch(r"layers\.(\d+)\.downsample\.(reduction|norm)\.(\w+)", key):
        return f"stages.{int(m[1]) + 1}.downsample.{'conv' if m[2] == 'reduction' else 'norm'}.{m[3]}"
    elif m := re.fullmatch(r"layers\.(\d+)\.blocks\.(\d+)\.(gamma_[12])", key):
        return f"stages.{m[1]}.blocks.{m[2]}.{_LAYER_SCALE[m[3]]}"
    elif m := re.fullmatch(r"layers\.(\d+)\.blocks\.(\d+)\.([\w.]+)\.(\w+)", key):
        if m[3] in _BLOCK:
            return f"stages.{m[1]}.blocks.{m[2]}.{_BLOCK[m[3]]}.{m[4]}"
    elif m := re.fullmatch(r"outnorm(\d+)\.(\w+)", key):
        return f"out_norms.{m[1]}.{m[2]}"
    elif m := re.fullmatch(r"(proj|norm|head)\.(\w+)", key):
        return f"{_TOP[m[1]]}.{m[2]}"
    raise ValueError(f"unexpected key {key!r} in the official PPMA checkpoint (no counterpart in this model)")


def _is_official(state_dict: dict) -> bool:
    return any(k.startswith(("patch_embed.", "layers.")) for k in state_dict)


def checkpoint_filter_fn(state_dict: dict, model: PPMA) -> dict:
    """Convert an official PPMA checkpoint (or one of ours) to ``model``'s layout, strictly.

    Every official key must have a counterpart in ``model`` and every key of ``model`` a source,
    else ``ValueError`` naming the keys. The RoPE ``Relpos.angle`` buffers are checked against the
    model's and dropped; layer-scale ``gamma_1/2`` ``(1, 1, 1, C)`` become ``ls1/ls2.gamma``
    ``(C,)``. Two deliberate, logged exceptions: output norms the model has but the checkpoint
    lacks (a classification checkpoint in a features model, as the official detection backbones
    load it) keep their fresh initialisation, and the head of a classification checkpoint is
    dropped when the model has none. The classifier ``head.fc`` is left to timm, which adapts it
    to a different ``num_classes``.
    """
    state_dict = model_state_dict(state_dict)
    ours = not _is_official(state_dict)
    out, source = {}, {}
    for key, value in state_dict.items():
        new_key = key if ours else _convert_official_key(key)
        if new_key is None:
            _check_rope_angle(key, value, model)
            continue
        if not ours and key.endswith(("gamma_1", "gamma_2")):
            value = value.reshape(-1)
        out[new_key], source[new_key] = value, key
    return finish_conversion(out, source, model)


def checkpoint_model_kwargs(state_dict: dict) -> dict:
    """``timm.create_model`` keywords under which a checkpoint (official or our layout) loads.

    Output norms: the stages of its ``outnorm{i}`` / ``out_norms.{i}`` keys (a dense-prediction
    backbone). Head: ``with_head=False`` without head keys, else ``num_classes`` from the
    classifier (0 when it has the projection head but no classifier).
    """
    state_dict = model_state_dict(state_dict)
    if _is_official(state_dict):
        return head_and_norm_kwargs(state_dict, r"outnorm(\d+)\.", ("proj.", "norm.", "head."), "head.weight")
    return head_and_norm_kwargs(state_dict, r"out_norms\.(\d+)\.", ("head.",), "head.fc.weight")


def _check_rope_angle(key: str, value: torch.Tensor, model: PPMA) -> None:
    stage = int(key.split(".")[1])
    if stage >= len(model.stages):
        return
    theta = model.stages[stage].blocks[0].mixer.rope.theta
    if value.shape != theta.shape or not torch.allclose(value.float().cpu(), theta.float().cpu(), rtol=1e-5):
        raise ValueError(
            f"{key} does not match this model's rotary embedding "
            f"(shape {tuple(value.shape)} vs {tuple(theta.shape)}, or different angles)"
        )


# --- presets --------------------------------------------------------------------------------
PRESETS = {
    "ppma_tiny": dict(
        embed_dims=(64, 128, 256, 512), depths=(2, 2, 8, 2), num_heads=(4, 4, 8, 16), mlp_ratios=(3, 3, 3, 3),
        attn_kinds=("criss_cross", "criss_cross", "vanilla", "vanilla"), drop_path_rate=0.1,
    ),
    "ppma_small": dict(
        embed_dims=(64, 128, 256, 512), depths=(3, 4, 18, 4), num_heads=(4, 4, 8, 16), mlp_ratios=(4, 4, 3, 3),
        attn_kinds=("criss_cross", "criss_cross", "criss_cross", "vanilla"), drop_path_rate=0.15,
    ),
    "ppma_base": dict(
        embed_dims=(80, 160, 320, 512), depths=(4, 8, 25, 8), num_heads=(5, 5, 10, 16), mlp_ratios=(4, 4, 3, 3),
        attn_kinds=("criss_cross", "criss_cross", "criss_cross", "vanilla"), drop_path_rate=0.4,
        layerscale=(False, False, True, True), layerscale_init=1e-6,
    ),
}
for _size in ("tiny", "small", "base"):
    PRESETS[f"ppma_linear_{_size}"] = dict(PRESETS[f"ppma_{_size}"], attn_kinds=("linear",) * 4)
PRESETS["ppma_tiny_3d"] = dict(PRESETS["ppma_tiny"], token_layout="3d")
# timm's test_* convention: tiny and fast, for generic model tests; still criss-cross then vanilla.
PRESETS["test_ppma"] = dict(
    embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4), mlp_ratios=(2, 2, 2, 2),
    attn_kinds=("criss_cross", "criss_cross", "vanilla", "vanilla"), drop_path_rate=0.0, head_hidden_dim=128,
)


def _create_ppma(variant: str, pretrained: bool = False, **kwargs) -> PPMA:
    kwargs = dense_defaults({**PRESETS[variant], **kwargs})
    # timm's builder reads in_chans from a (C, H, W) input_size; a 3-D preset's is (C, T, H, W):
    # build with one frame's and give the model the clip's.
    cfg = resolve_pretrained_cfg(variant, kwargs.get("pretrained_cfg"), kwargs.get("pretrained_cfg_overlay"))
    clip_size = cfg.input_size if len(cfg.input_size) == 4 else None
    if clip_size:
        frame_size = (clip_size[0], *clip_size[2:])
        kwargs["pretrained_cfg_overlay"] = {**(kwargs.get("pretrained_cfg_overlay") or {}), "input_size": frame_size}
    model = build_preset(PPMA, variant, pretrained, checkpoint_filter_fn, **kwargs)
    if clip_size:
        for m in {model, getattr(model, "model", model)}:
            m.pretrained_cfg = m.default_cfg = {**m.pretrained_cfg, "input_size": clip_size}
    return model


_HF = "https://huggingface.co/ZhongchenZhao/PPMA/resolve/main/checkpoints/classification"


_cfg = partial(imagenet_cfg, first_conv="stem.conv1", paper_ids="arXiv:2506.15940", license="apache-2.0")


default_cfgs = generate_default_cfgs({
    "ppma_tiny.in1k": _cfg(f"{_HF}/PPMA_T_202502251000/best.pth"),
    "ppma_small.in1k": _cfg(f"{_HF}/PPMA_S_202504021000/best.pth"),
    "ppma_base.in1k": _cfg(f"{_HF}/PPMA_B_202504101400/best.pth"),
    "ppma_linear_tiny": _cfg(),
    "ppma_linear_small": _cfg(),
    "ppma_linear_base": _cfg(),
    "ppma_tiny_3d": _cfg(input_size=(3, 8, 224, 224), pool_size=(8, 7, 7)),  # (C, T, H, W): 8-frame clips
    "test_ppma": _cfg(input_size=(3, 160, 160), pool_size=(5, 5)),
})


@register_model
def ppma_tiny(pretrained: bool = False, **kwargs) -> PPMA:
    """PPMA-T (14.34 M params, 2.7 GFLOPs at 224)."""
    return _create_ppma("ppma_tiny", pretrained, **kwargs)


@register_model
def ppma_small(pretrained: bool = False, **kwargs) -> PPMA:
    """PPMA-S (26.97 M params, 4.9 GFLOPs at 224)."""
    return _create_ppma("ppma_small", pretrained, **kwargs)


@register_model
def ppma_base(pretrained: bool = False, **kwargs) -> PPMA:
    """PPMA-B (54.16 M params, 10.6 GFLOPs at 224)."""
    return _create_ppma("ppma_base", pretrained, **kwargs)


@register_model
def ppma_linear_tiny(pretrained: bool = False, **kwargs) -> PPMA:
    """PPMA-T backbone with linear polyline attention in every stage."""
    return _create_ppma("ppma_linear_tiny", pretrained, **kwargs)


@register_model
def ppma_linear_small(pretrained: bool = False, **kwargs) -> PPMA:
    """PPMA-S backbone with linear polyline attention in every stage."""
    return _create_ppma("ppma_linear_small", pretrained, **kwargs)


@register_model
def ppma_linear_base(pretrained: bool = False, **kwargs) -> PPMA:
    """PPMA-B backbone with linear polyline attention in every stage."""
    return _create_ppma("ppma_linear_base", pretrained, **kwargs)


@register_model
def ppma_tiny_3d(pretrained: bool = False, **kwargs) -> PPMA:
    """PPMA-T on clips/volumes ``(B, C, T, H, W)``: polyline masks over T x H x W."""
    return _create_ppma("ppma_tiny_3d", pretrained, **kwargs)


@register_model
def test_ppma(pretrained: bool = False, **kwargs) -> PPMA:
    """Tiny PPMA (widths 16-64, one block per stage, 0.26 M params) for fast generic model tests."""
    return _create_ppma("test_ppma", pretrained, **kwargs)


register_family(Family(
    name="ppma", model_class=PPMA, presets=tuple(PRESETS), checkpoint_filter_fn=checkpoint_filter_fn,
    checkpoint_model_kwargs=checkpoint_model_kwargs, test_preset="test_ppma",
))
