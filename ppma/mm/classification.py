"""Image classification with mmpretrain 1.x: any timm preset of this package, whole, as a classifier.

Classification configs import this module
(``custom_imports=dict(imports=['ppma.mm.classification'])``; ``import ppma.mm`` alone does not
need mmpretrain). It registers in mmpretrain's registries

- :class:`PresetClassifier` (``MODELS``): the timm model with its released head; mmpretrain's
  data preprocessor, Mixup/CutMix batch augments and losses around it. Checkpoints written by
  training hold the timm model's own state dict (``stem.*``, ``stages.*``, ``head.*``), so they
  load in ``tools/validate.py``, in ``timm.create_model(name, pretrained=True,
  pretrained_cfg_overlay=dict(file=...))`` and as ``init_cfg`` of the detection/segmentation
  backbones, all through the family's strict ``checkpoint_filter_fn``;
- :class:`ClassCountCheckHook` (``HOOKS``): the data sets' classes must be as many as the
  model's outputs, checked before training, validation and testing.
"""
from __future__ import annotations

import logging

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmpretrain.models import TimmClassifier
from mmpretrain.registry import HOOKS, MODELS

from ppma.models.checkpoint import load_strict, model_state_dict
from ppma.models.family import family_of

from .backbone import _check_init_cfg
from .checkpoint import read_checkpoint_or_url

__all__ = ["ClassCountCheckHook", "PresetClassifier"]


@MODELS.register_module()
class PresetClassifier(TimmClassifier):
    """mmpretrain's :class:`~mmpretrain.models.TimmClassifier` for the presets of this package.

    Args:
        model_name: a timm preset registered by ``import ppma`` (``'ppma_tiny'``, ``'mila_small'``,
            ...); another name is a ``ValueError`` listing the presets.
        init_cfg: None (the model's own initialisation) or
            ``dict(type='Pretrained', checkpoint=PATH_OR_URL)``: an official classification
            checkpoint or one of ours, loaded strictly through the family's filter (fine-tuning).
            A classifier ``head.fc`` of another class count is dropped (logged) and keeps its
            initialisation; any other mismatch is a ``ValueError`` naming the keys.
        **kwargs: the above, and the rest to ``timm.create_model`` (``num_classes``,
            ``drop_path_rate``, ...).

    Forward: ``inputs`` ``(B, 3, H, W)`` -> logits ``(B, num_classes)`` (mode ``'tensor'``), the
    loss dict (``'loss'``) or data samples with predicted scores (``'predict'``).
    """

    def __init__(self, model_name: str, init_cfg: dict | None = None, **kwargs):
        # kwargs: TimmClassifier's loss, train_cfg (augments: Mixup/CutMix), with_cp,
        # data_preprocessor; the rest goes to timm.create_model
        family_of(model_name)  # ValueError for a name that is not a preset of this package
        _check_init_cfg(init_cfg)
        try:
            super().__init__(model_name, pretrained=False, init_cfg=init_cfg, **kwargs)
        except TypeError as err:  # e.g. "PPMA.__init__() got an unexpected keyword argument 'x'"
            raise TypeError(f"{type(self).__name__}: timm cannot build {model_name!r} with the "
                            f"arguments {sorted(kwargs)}: {err}") from err
        self.model_name = model_name

    @staticmethod
    def _remove_state_dict_prefix(self, state_dict, prefix, local_metadata):
        """State-dict hook: ``<prefix>model.k`` -> ``<prefix>k``, in place.

        TimmClassifier's own hook returns a new dict, which torch ignores when the classifier is a
        submodule, as in mmengine's EMA wrapper (whose keys would keep ``model.``)."""
        for key in [k for k in state_dict if k.startswith(f"{prefix}model.")]:
            state_dict[prefix + key[len(prefix) + len("model."):]] = state_dict.pop(key)

    def init_weights(self) -> None:
        """Load ``init_cfg``'s checkpoint strictly (timm initialised the model when built)."""
        if self.init_cfg:
            self.load_checkpoint(self.init_cfg["checkpoint"])
        self._is_init = True

    def load_checkpoint(self, path: str) -> None:
        """Load an official or converted checkpoint of this preset into the timm model, strictly."""
        convert = family_of(self.model_name).checkpoint_filter_fn
        state = load_strict(self.model, model_state_dict(read_checkpoint_or_url(path)), convert,
                            source=f"checkpoint {path}", model_name=self.model_name, head_may_differ=True)
        resized = [k for k in state.kept if k.startswith("head.fc.")]
        print_log(f"{self.model_name}: loaded {path}"
                  + (f"; the classifier has another class count and keeps its initialisation: {resized}"
                     if resized else ""), logger="current", level=logging.WARNING if resized else logging.INFO)


@HOOKS.register_module()
class ClassCountCheckHook(Hook):
    """Stop early, with one line naming both counts, when a data set's classes and the model's
    outputs differ (mmpretrain itself would fail in the loss or report nonsense accuracy)."""

    def before_train(self, runner) -> None:
        self._check(runner, runner.train_loop.dataloader.dataset, "train_dataloader")

    def before_val(self, runner) -> None:
        self._check(runner, runner.val_loop.dataloader.dataset, "val_dataloader")

    def before_test(self, runner) -> None:
        self._check(runner, runner.test_loop.dataloader.dataset, "test_dataloader")

    @staticmethod
    def _check(runner, dataset, which: str) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        classes = dataset.metainfo.get("classes")
        outputs = getattr(getattr(model, "model", None), "num_classes", None)
        if classes is None or outputs is None:
            return
        preprocessor = getattr(model.data_preprocessor, "num_classes", None)
        if preprocessor is not None and preprocessor != outputs:
            raise ValueError(f"model.data_preprocessor.num_classes is {preprocessor} but the model has "
                             f"{outputs} outputs (Mixup/CutMix one-hot labels need the same count)")
        if len(classes) != outputs:
            raise ValueError(f"{which}'s data set has {len(classes)} classes but the model "
                             f"{getattr(model, 'model_name', type(model).__name__)} has {outputs} outputs: "
                             "set model.num_classes (and model.data_preprocessor.num_classes) to "
                             f"{len(classes)}, or point the data set at a folder of {outputs} classes")

