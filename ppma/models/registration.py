"""What every family's timm registration shares: the default cfg of an ImageNet-1k classifier
and the builder call (official-checkpoint filter, four feature taps through timm's getter)."""
from __future__ import annotations

from typing import Callable

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg
from torch import nn


def imagenet_cfg(url: str = "", *, first_conv: str, paper_ids: str, **kwargs) -> dict:
    """A pretrained cfg: 1,000 classes at 224 (crop 0.875, bicubic, ImageNet mean/std), the
    classifier ``head.fc``; ``kwargs`` override or add entries."""
    return {
        "url": url,
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": (7, 7),
        "crop_pct": 0.875,
        "interpolation": "bicubic",
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": first_conv,
        "classifier": "head.fc",
        "paper_ids": paper_ids,
        **kwargs,
    }


def build_preset(model_cls: type[nn.Module], variant: str, pretrained: bool, filter_fn: Callable, **kwargs) -> nn.Module:
    """``timm.models.build_model_with_cfg`` for one of our presets: ``filter_fn`` (the family's
    ``checkpoint_filter_fn``) converts pretrained weights; ``features_only`` models tap the four
    outputs that ``feature_info`` lists, through timm's ``'getter'`` wrapper."""
    return build_model_with_cfg(
        model_cls,
        variant,
        pretrained,
        pretrained_filter_fn=filter_fn,
        feature_cfg=dict(out_indices=(0, 1, 2, 3), feature_cls="getter"),
        **kwargs,
    )
