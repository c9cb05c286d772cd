"""VMamba: visual state space models (Liu et al., NeurIPS 2024, arXiv 2401.10166).

Released at github.com/MzeroMiko/VMamba (``classification/models/vmamba.py``), here on
:class:`~ppma.models.skeleton.HierarchicalBackbone` and the ``selective_scan`` / ``cross_scan``
ops (CPU and GPU, no CUDA build). Presets, with the released parameter counts:

- v2 (``forward_type='v05_noz'``, ``d_state=1``, v2 stem, v3 downsampler, MLP 4x):
  ``vmamba_tiny`` / ``vmamba_small`` / ``vmamba_base`` (released as ``vmamba_{tiny_s1l8,
  small_s1l20, base_s1l20}``, also registered under those names; ``ssm_ratio=1``),
  ``vmamba_tiny_s2l5``, ``vmamba_small_s2l15``, ``vmamba_base_s2l15`` (``ssm_ratio=2``);
- vanilla (``forward_type='v0'``, ``d_state=16``, gate ``z``, patch-embed stem, patch merging,
  no MLP): ``vmamba_tiny_v0`` / ``vmamba_small_v0`` / ``vmamba_base_v0``;
- ``test_vmamba``: tiny, for generic model tests.

The "s{ratio}l{depth}" in a name is what tells the variants apart (``s1l8`` and ``s2l5`` are both
"VMamba-T"); a checkpoint of another variant fails to load with the mismatching keys named.

Official checkpoints (``{'model': ..., 'model_ema': ...}``; either key generation; detection /
segmentation backbones with ``outnorm{i}``) are converted by :func:`checkpoint_filter_fn`::

    timm.create_model('vmamba_tiny', pretrained=True,
                      pretrained_cfg_overlay=dict(file='vssm1_tiny_0230s_ckpt_epoch_264.pth'))
"""
from __future__ import annotations

import re
from functools import partial
from typing import Sequence

from timm.layers import trunc_normal_
from timm.models import generate_default_cfgs, register_model, register_notrace_module
from torch import nn

from ppma.layers import NormPoolHead
from ppma.layers.vmamba import SS2D, PatchMerging, VMambaDownsample, VMambaPatchEmbed, VMambaStem, VSSBlock

from .checkpoint import finish_conversion, head_and_norm_kwargs, model_state_dict
from .family import Family, register_family
from .registration import build_preset, imagenet_cfg
from .skeleton import HierarchicalBackbone, dense_defaults

__all__ = ["VMamba", "checkpoint_filter_fn", "checkpoint_model_kwargs", "PRESETS"]

STEMS = {"v1": VMambaPatchEmbed, "v2": VMambaStem}
DOWNSAMPLERS = {"v1": PatchMerging, "v3": VMambaDownsample}


def _choice(name: str, value: str, choices: dict):
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return choices[value]


class VMamba(HierarchicalBackbone):
    """VMamba backbone: :class:`HierarchicalBackbone` with :class:`~ppma.layers.vmamba.VSSBlock` s
    around :class:`~ppma.layers.vmamba.SS2D`, the released stems, downsamplers and classifier.

    Args (the release's names where it has them):
        embed_dims, depths: per stage.
        d_state, ssm_ratio, dt_rank, conv_bias, forward_type: of :class:`SS2D` (``'v05_noz'``
            or ``'v0'``).
        mlp_ratio: MLP hidden ratio (0: no MLP, the vanilla models).
        patchembed_version: ``'v2'`` (two 3x3 stride-2 convs) or ``'v1'`` (4x4 patches; the
            features are then ``floor(H / 4)`` as released, not ``ceil``).
        downsample_version: ``'v3'`` (3x3 stride-2 conv) or ``'v1'`` (patch merging).
        other args: see :class:`HierarchicalBackbone` (``output_norms``: the ``outnorm{i}`` of
        the released detection/segmentation backbones; ``features_only`` models get them).
    """

    def __init__(
        self,
        embed_dims: Sequence[int] = (96, 192, 384, 768),
        depths: Sequence[int] = (2, 2, 8, 2),
        d_state: int = 1,
        ssm_ratio: float = 1.0,
        dt_rank: int | str = "auto",
        conv_bias: bool = False,
        forward_type: str = "v05_noz",
        mlp_ratio: float = 4.0,
        patchembed_version: str = "v2",
        downsample_version: str = "v3",
        drop_path_rate: float = 0.2,
        **kwargs,
    ):
        mixer = partial(SS2D, d_state=d_state, ssm_ratio=ssm_ratio, dt_rank=dt_rank, conv_bias=conv_bias,
                        forward_type=forward_type)
        super().__init__(
            [mixer] * len(embed_dims),
            embed_dims=embed_dims,
            depths=depths,
            mlp_ratios=mlp_ratio,
            drop_path_rate=drop_path_rate,
            head_layer=NormPoolHead,
            block_layer=VSSBlock,
            stem_layer=_choice("patchembed_version", patchembed_version, STEMS),
            downsample_layer=_choice("downsample_version", downsample_version, DOWNSAMPLERS),
            **kwargs,
        )
        self.apply(_init_weights)


# torch.fx (timm's fx feature extraction) keeps SS2D as one call: its ops check real tensors.
register_notrace_module(SS2D)


def _init_weights(module: nn.Module) -> None:
    """As released: Linear truncated-normal (std 0.02) with zero bias; LayerNorm ones / zeros
    (SS2D's stacked route parameters keep their own initialisation)."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


# --- official checkpoint conversion ---------------------------------------------------------
# Official (current generation): patch_embed.{0,2,5,7}.* (v2 stem: conv, norm, conv, norm) or
# patch_embed.{0,2}.* (v1: proj, norm); layers.i.blocks.j.{norm,op,norm2,mlp}.* (same leaf paths
# as ours); layers.i.downsample.{1,3}.* (v3: conv, norm) or .{norm,reduction}.* (v1), at the end
# of stage i (ours start stage i + 1); classifier.{norm,head}.*; outnorm{i}.* (output norms of the
# detection/segmentation backbones). Older generation, renamed by the release's
# _load_from_state_dict: patch_embed.{proj,norm}, blocks' ln_1 / self_attention, norm.*, head.*.
# Linear2d weights (in_proj, out_proj, mlp.fc1/fc2) are stored (out, in) or (out, in, 1, 1).
_OLD_NAMES = ((r"patch_embed\.proj\.", "patch_embed.0."), (r"patch_embed\.norm\.", "patch_embed.2."),
              (r"(layers\.\d+\.blocks\.\d+)\.ln_1\.", r"\1.norm."),
              (r"(layers\.\d+\.blocks\.\d+)\.self_attention\.", r"\1.op."),
              (r"norm\.", "classifier.norm."), (r"head\.", "classifier.head."))
_STEM = {"v2": {"0": "conv1", "2": "norm1", "5": "conv2", "7": "norm2"}, "v1": {"0": "proj", "2": "norm"}}
_DOWNSAMPLE = {"1": "conv", "3": "norm", "norm": "norm", "reduction": "reduction"}


def _current_name(key: str) -> str:
    """An official key under the current generation's name (the release's renames of old keys)."""
    for old, new in _OLD_NAMES:
        if re.match(old, key):
            return re.sub(old, new, key, count=1)
    return key


def _convert_official_key(key: str, stem: dict[str, str]) -> str:
    """Our name for a current-generation official key (unknown keys keep their name and are
    reported by the strict check)."""
    if m := re.fullmatch(r"patch_embed\.(\d+)\.(\w+)", key):
        return f"stem.{stem[m[1]]}.{m[2]}" if m[1] in stem else key
    if m := re.fullmatch(r"layers\.(\d+)\.downsample\.(\w+)\.(\w+)", key):
        return f"stages.{int(m[1]) + 1}.downsample.{_DOWNSAMPLE[m[2]]}.{m[3]}" if m[2] in _DOWNSAMPLE else key
    if m := re.fullmatch(r"layers\.(\d+)\.blocks\.(.+)", key):
        return f"stages.{m[1]}.blocks.{m[2]}"
    if m := re.fullmatch(r"outnorm(\d+)\.(\w+)", key):
        return f"out_norms.{m[1]}.{m[2]}"
    if m := re.fullmatch(r"classifier\.(norm|head)\.(\w+)", key):
        return f"head.{'fc' if m[1] == 'head' else 'norm'}.{m[2]}"
    return key


def _is_official(state_dict: dict) -> bool:
    return any(k.startswith(("patch_embed.", "layers.", "classifier.")) for k in state_dict)


def checkpoint_filter_fn(state_dict: dict, model: VMamba) -> dict:
    """Convert an official VMamba checkpoint (or one of ours) to ``model``'s layout, strictly.

    Both key generations of the release and both ``Linear2d`` weight shapes are accepted. Every
    key must map onto one of ``model``'s with the same shape, and every key of ``model`` must be
    filled, else ``ValueError`` naming them (a checkpoint of another variant, e.g. ``s2l5`` for
    ``s1l8``, fails this way). Output norms the checkpoint lacks keep their initialisation; the
    head of a classification checkpoint is dropped when the model has none; the classifier
    ``head.fc`` is left to timm (which adapts it to another ``num_classes``).
    """
    state_dict = model_state_dict(state_dict)
    own = model.state_dict()
    out, source = {}, {}
    if _is_official(state_dict):
        stem = _STEM["v2" if isinstance(model.stem, VMambaStem) else "v1"]
        for key, value in state_dict.items():
            new_key = _convert_official_key(_current_name(key), stem)
            if new_key in own and own[new_key].dim() == 2 and value.dim() == 4 and value.shape[2:] == (1, 1):
                value = value.flatten(1)  # a Linear2d weight stored as a 1x1 conv
            out[new_key], source[new_key] = value, key
    else:
        out, source = dict(state_dict), {k: k for k in state_dict}
    out = finish_conversion(out, source, model)
    wrong = [f"{source.get(k, k)} {tuple(v.shape)} (model: {tuple(own[k].shape)})"
             for k, v in out.items() if k in own and not k.startswith("head.fc.") and v.shape != own[k].shape]
    if wrong:
        raise ValueError(f"checkpoint does not match the model: shapes differ for {wrong}")
    return out


def checkpoint_model_kwargs(state_dict: dict) -> dict:
    """``timm.create_model`` keywords under which a checkpoint (official or our layout) loads:
    ``output_norms`` from ``out_norms.{i}`` (official: ``outnorm{i}``) keys; ``with_head=False``
    without head keys, else ``num_classes`` from the classifier (0 when only the head norm is there)."""
    state_dict = model_state_dict(state_dict)
    if _is_official(state_dict):
        current = {_current_name(k): v for k, v in state_dict.items()}
        return head_and_norm_kwargs(current, r"outnorm(\d+)\.", ("classifier.",), "classifier.head.weight")
    return head_and_norm_kwargs(state_dict, r"out_norms\.(\d+)\.", ("head.",), "head.fc.weight")


# --- presets --------------------------------------------------------------------------------
def _v2(dim: int, depths: tuple, ssm_ratio: float, drop_path_rate: float) -> dict:
    return dict(embed_dims=tuple(dim * 2**i for i in range(4)), depths=depths, ssm_ratio=ssm_ratio,
                drop_path_rate=drop_path_rate)


def _v0(dim: int, depths: tuple, drop_path_rate: float) -> dict:
    return dict(embed_dims=tuple(dim * 2**i for i in range(4)), depths=depths, d_state=16, ssm_ratio=2.0,
                conv_bias=True, forward_type="v0", mlp_ratio=0.0, patchembed_version="v1",
                downsample_version="v1", drop_path_rate=drop_path_rate)


# As the release's builders (vmamba_tiny_s1l8(), ..., vanilla_vmamba_base()).
PRESETS = {
    "vmamba_tiny": _v2(96, (2, 2, 8, 2), 1.0, 0.2),
    "vmamba_small": _v2(96, (2, 2, 20, 2), 1.0, 0.3),
    "vmamba_base": _v2(128, (2, 2, 20, 2), 1.0, 0.5),
    "vmamba_tiny_s2l5": _v2(96, (2, 2, 5, 2), 2.0, 0.2),
    "vmamba_small_s2l15": _v2(96, (2, 2, 15, 2), 2.0, 0.3),
    "vmamba_base_s2l15": _v2(128, (2, 2, 15, 2), 2.0, 0.6),
    "vmamba_tiny_v0": _v0(96, (2, 2, 9, 2), 0.2),
    "vmamba_small_v0": _v0(96, (2, 2, 27, 2), 0.3),
    "vmamba_base_v0": _v0(128, (2, 2, 27, 2), 0.6),
    # timm's test_* convention: tiny and fast, for generic model tests.
    "test_vmamba": dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), ssm_ratio=2.0, mlp_ratio=2.0,
                        drop_path_rate=0.0),
}
# The release's names of the s1 presets.
ALIASES = {"vmamba_tiny_s1l8": "vmamba_tiny", "vmamba_small_s1l20": "vmamba_small", "vmamba_base_s1l20": "vmamba_base"}


def _create_vmamba(variant: str, pretrained: bool = False, **kwargs) -> VMamba:
    kwargs = dense_defaults({**PRESETS[ALIASES.get(variant, variant)], **kwargs})
    return build_preset(VMamba, variant, pretrained, checkpoint_filter_fn, **kwargs)


_cfg = partial(imagenet_cfg, first_conv="stem.conv1", paper_ids="arXiv:2401.10166")


_RELEASES = "https://github.com/MzeroMiko/VMamba/releases/download"
_V0 = dict(first_conv="stem.proj")
default_cfgs = generate_default_cfgs({
    "vmamba_tiny.in1k": _cfg(f"{_RELEASES}/%23v2cls/vssm1_tiny_0230s_ckpt_epoch_264.pth"),
    "vmamba_small.in1k": _cfg(f"{_RELEASES}/%23v2cls/vssm1_small_0229s_ckpt_epoch_240.pth"),
    "vmamba_base.in1k": _cfg(f"{_RELEASES}/%23v2cls/vssm1_base_0229s_ckpt_epoch_225.pth"),
    "vmamba_tiny_s1l8.in1k": _cfg(f"{_RELEASES}/%23v2cls/vssm1_tiny_0230s_ckpt_epoch_264.pth"),
    "vmamba_small_s1l20.in1k": _cfg(f"{_RELEASES}/%23v2cls/vssm1_small_0229s_ckpt_epoch_240.pth"),
    "vmamba_base_s1l20.in1k": _cfg(f"{_RELEASES}/%23v2cls/vssm1_base_0229s_ckpt_epoch_225.pth"),
    "vmamba_tiny_s2l5.in1k": _cfg(f"{_RELEASES}/%23v2cls/vssm_tiny_0230_ckpt_epoch_262.pth"),
    "vmamba_small_s2l15.in1k": _cfg(f"{_RELEASES}/%23v2cls/vssm_small_0229_ckpt_epoch_222.pth"),
    "vmamba_base_s2l15.in1k": _cfg(f"{_RELEASES}/%23v2cls/vssm_base_0229_ckpt_epoch_237.pth"),
    "vmamba_tiny_v0.in1k": _cfg(f"{_RELEASES}/%23v0cls/vssmtiny_dp01_ckpt_epoch_292.pth", **_V0),
    "vmamba_small_v0.in1k": _cfg(f"{_RELEASES}/%23v0cls/vssmsmall_dp03_ckpt_epoch_238.pth", **_V0),
    "vmamba_base_v0.in1k": _cfg(f"{_RELEASES}/%23v0cls/vssmbase_dp06_ckpt_epoch_241.pth", **_V0),
    "test_vmamba": _cfg(input_size=(3, 64, 64), pool_size=(2, 2)),
})


@register_model
def vmamba_tiny(pretrained: bool = False, **kwargs) -> VMamba:
    """VMamba-T (released as vmamba_tiny_s1l8): widths 96-768, depths 2-2-8-2, ssm_ratio 1, 30.25 M params."""
    return _create_vmamba("vmamba_tiny", pretrained, **kwargs)


@register_model
def vmamba_small(pretrained: bool = False, **kwargs) -> VMamba:
    """VMamba-S (released as vmamba_small_s1l20): widths 96-768, depths 2-2-20-2, ssm_ratio 1, 49.01 M params."""
    return _create_vmamba("vmamba_small", pretrained, **kwargs)


@register_model
def vmamba_base(pretrained: bool = False, **kwargs) -> VMamba:
    """VMamba-B (released as vmamba_base_s1l20): widths 128-1024, depths 2-2-20-2, ssm_ratio 1, 86.61 M params."""
    return _create_vmamba("vmamba_base", pretrained, **kwargs)


@register_model
def vmamba_tiny_s1l8(pretrained: bool = False, **kwargs) -> VMamba:
    """The release's name of ``vmamba_tiny``."""
    return _create_vmamba("vmamba_tiny_s1l8", pretrained, **kwargs)


@register_model
def vmamba_small_s1l20(pretrained: bool = False, **kwargs) -> VMamba:
    """The release's name of ``vmamba_small``."""
    return _create_vmamba("vmamba_small_s1l20", pretrained, **kwargs)


@register_model
def vmamba_base_s1l20(pretrained: bool = False, **kwargs) -> VMamba:
    """The release's name of ``vmamba_base``."""
    return _create_vmamba("vmamba_base_s1l20", pretrained, **kwargs)


@register_model
def vmamba_tiny_s2l5(pretrained: bool = False, **kwargs) -> VMamba:
    """VMamba-T s2l5: widths 96-768, depths 2-2-5-2, ssm_ratio 2, 30.71 M params."""
    return _create_vmamba("vmamba_tiny_s2l5", pretrained, **kwargs)


@register_model
def vmamba_small_s2l15(pretrained: bool = False, **kwargs) -> VMamba:
    """VMamba-S s2l15: widths 96-768, depths 2-2-15-2, ssm_ratio 2, 50.15 M params."""
    return _create_vmamba("vmamba_small_s2l15", pretrained, **kwargs)


@register_model
def vmamba_base_s2l15(pretrained: bool = False, **kwargs) -> VMamba:
    """VMamba-B s2l15: widths 128-1024, depths 2-2-15-2, ssm_ratio 2, 88.56 M params."""
    return _create_vmamba("vmamba_base_s2l15", pretrained, **kwargs)


@register_model
def vmamba_tiny_v0(pretrained: bool = False, **kwargs) -> VMamba:
    """Vanilla VMamba-T (v0): widths 96-768, depths 2-2-9-2, d_state 16, no MLP, 22.89 M params."""
    return _create_vmamba("vmamba_tiny_v0", pretrained, **kwargs)


@register_model
def vmamba_small_v0(pretrained: bool = False, **kwargs) -> VMamba:
    """Vanilla VMamba-S (v0): widths 96-768, depths 2-2-27-2, d_state 16, no MLP, 44.42 M params."""
    return _create_vmamba("vmamba_small_v0", pretrained, **kwargs)


@register_model
def vmamba_base_v0(pretrained: bool = False, **kwargs) -> VMamba:
    """Vanilla VMamba-B (v0): widths 128-1024, depths 2-2-27-2, d_state 16, no MLP, 76.25 M params."""
    return _create_vmamba("vmamba_base_v0", pretrained, **kwargs)


@register_model
def test_vmamba(pretrained: bool = False, **kwargs) -> VMamba:
    """Tiny VMamba (widths 16-64, one block per stage) for fast generic model tests."""
    return _create_vmamba("test_vmamba", pretrained, **kwargs)


register_family(Family(
    name="vmamba", model_class=VMamba, presets=(*PRESETS, *ALIASES), checkpoint_filter_fn=checkpoint_filter_fn,
    checkpoint_model_kwargs=checkpoint_model_kwargs, test_preset="test_vmamba",
))
