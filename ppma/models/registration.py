"""What every family's timm registration shares: the default cfg of an ImageNet-1k classifier
and the builder call (official-checkpoint filter, four feature taps through timm's getter, a
pretrained ``file`` read with named errors)."""
from __future__ import annotations

from typing import Callable

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, resolve_pretrained_cfg
from torch import nn

from .checkpoint import read_checkpoint


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


class _ReadCheckpoint(dict):
    """A checkpoint read for timm's builder, passed as its pretrained cfg's ``state_dict``; the
    builder copies the cfg of a ``features_only`` model, but not this."""

    def __deepcopy__(self, memo):
        return self


def build_preset(model_cls: type[nn.Module], variant: str, pretrained: bool, filter_fn: Callable, **kwargs) -> nn.Module:
    """``timm.models.build_model_with_cfg`` for one of our presets: ``filter_fn`` (the family's
    ``checkpoint_filter_fn``) converts pretrained weights; ``features_only`` models tap the four
    outputs that ``feature_info`` lists, through timm's ``'getter'`` wrapper (the classifier's head
    keys dropped, logged by name). A pretrained cfg's ``file`` (e.g. ``pretrained_cfg_overlay=dict(
    file=PATH)``) is read by :func:`~ppma.models.checkpoint.read_checkpoint`, whose errors name
    the file and the problem (missing, not a checkpoint or truncated, a global to allow)."""
    cfg = resolve_pretrained_cfg(variant, kwargs.get("pretrained_cfg"), kwargs.get("pretrained_cfg_overlay"))
    read = pretrained and cfg.file and cfg.state_dict is None
    if read:
        state = _ReadCheckpoint(read_checkpoint(cfg.file))
        kwargs["pretrained_cfg_overlay"] = {**(kwargs.get("pretrained_cfg_overlay") or {}), "state_dict": state}
    model = build_model_with_cfg(
        model_cls,
        variant,
        pretrained,
        pretrained_filter_fn=filter_fn,
        feature_cfg=dict(out_indices=(0, 1, 2, 3), feature_cls="getter"),
        **kwargs,
    )
    if read:  # the model's cfg keeps the file's name, not its tensors
        for module in (model, getattr(model, "model", model)):
            for module_cfg in (module.pretrained_cfg, module.default_cfg):
                module_cfg.pop("state_dict", None)
    return model
