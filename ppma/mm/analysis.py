"""Build a detector/segmentor from a config and feed it synthetic inputs (FLOPs, benchmarks).

mmdet and mmseg models take ``(inputs, data_samples)``; :func:`dummy_batch` makes both for a
given input size so tools can run a model without a data set.
"""
from __future__ import annotations

import torch
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import MODELS, init_default_scope

SCOPES = ("mmdet", "mmseg")


def build_model(cfg: Config, checkpoint: str | None = None, device: str = "cpu") -> torch.nn.Module:
    """Build ``cfg.model`` in its scope (mmdet or mmseg), SyncBN reverted to BN, in eval mode.

    With ``checkpoint``, load a checkpoint written by training (strict); otherwise the model
    keeps its initialisation (no pretrained download).
    """
    scope = cfg.get("default_scope")
    if scope not in SCOPES:
        raise ValueError(f"config default_scope must be one of {SCOPES}, got {scope!r}")
    init_default_scope(scope)
    model = revert_sync_batchnorm(MODELS.build(cfg.model))
    if checkpoint is not None:
        from mmengine.runner import load_checkpoint

        load_checkpoint(model, checkpoint, map_location="cpu", strict=True)
    return model.to(device).eval()


def dummy_batch(scope: str, batch_size: int, height: int, width: int, device: str = "cpu"):
    """Normalized random ``inputs`` ``(B, 3, H, W)`` and matching data samples of ``scope``."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    if batch_size < 1 or height < 1 or width < 1:
        raise ValueError(f"batch_size, height and width must be >= 1, got {batch_size}, {height}, {width}")
    if scope == "mmdet":
        from mmdet.structures import DetDataSample as DataSample
    else:
        from mmseg.structures import SegDataSample as DataSample
    shape = (height, width)
    meta = dict(img_shape=shape, ori_shape=shape, pad_shape=shape, batch_input_shape=shape,
                scale_factor=(1.0, 1.0))
    inputs = torch.randn(batch_size, 3, height, width, device=device)
    return inputs, [DataSample(metainfo=meta) for _ in range(batch_size)]


class TensorForward(torch.nn.Module):
    """``model._forward(inputs, data_samples)`` (mmdet/mmseg tensor mode) as ``f(inputs)``."""

    def __init__(self, model: torch.nn.Module, data_samples: list):
        super().__init__()
        self.model = model
        self.data_samples = data_samples

    def forward(self, inputs: torch.Tensor):
        return self.model._forward(inputs, self.data_samples)
