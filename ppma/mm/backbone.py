"""mmdet/mmseg backbone wrapping any timm model of this package that has four-scale features
(the hierarchical families, and the plain Vim presets through their released feature pyramid).

Configs name it ``type='PyramidBackbone'`` with a preset of any family::

    backbone=dict(type='PyramidBackbone', model_name='ppma_tiny', out_indices=(0, 1, 2, 3),
                  drop_path_rate=0.1, frozen_stages=-1, with_cp=False,
                  init_cfg=dict(type='Pretrained', checkpoint='best.pth'))

Every other keyword (``embed_dims``, ``depths``, ``num_heads``, ``attn_kinds``, ...) goes to
``timm.create_model``; one the model does not take is an error that names it.
"""
from __future__ import annotations

from typing import Sequence

import timm
import torch
from mmengine.logging import print_log
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from ppma.models.checkpoint import load_strict, model_state_dict
from ppma.models.family import family_of

from .checkpoint import read_checkpoint_or_url


class PyramidBackbone(BaseModule):
    """Multi-scale NCHW features of a timm model of this package (``features_only``, strides 4-32).

    Args:
        model_name: a timm model name registered by ``import ppma`` (e.g. ``'ppma_tiny'``).
        out_indices: stages whose (output-normed) features are returned, strides 4/8/16/32.
        frozen_stages: ``-1`` trains everything; ``k >= 0`` freezes what the model names in
            ``frozen_modules(k)`` (the stem and the first ``k`` stages with their output norms)
            and keeps them in eval mode.
        norm_eval: keep every BatchNorm of the backbone in eval mode while training.
        with_cp: gradient checkpointing of the blocks (saves memory, costs a recomputation).
        drop_path_rate: stochastic depth; None keeps the preset's value.
        init_cfg: None (the model's own initialisation) or
            ``dict(type='Pretrained', checkpoint=PATH_OR_URL)``: an official classification
            checkpoint or one of ours, loaded strictly (see :meth:`load_checkpoint`).
        **model_kwargs: passed to ``timm.create_model``.

    Forward: ``x`` ``(B, 3, H, W)`` -> tuple of ``(B, C_i, ceil(H / s_i), ceil(W / s_i))`` for
    ``i`` in ``out_indices``, ``s_i = 4 * 2**i``.
    """

    def __init__(
        self,
        model_name: str,
        out_indices: Sequence[int] = (0, 1, 2, 3),
        frozen_stages: int = -1,
        norm_eval: bool = False,
        with_cp: bool = False,
        drop_path_rate: float | None = None,
        init_cfg: dict | None = None,
        **model_kwargs,
    ):
        _check_init_cfg(init_cfg)
        super().__init__(init_cfg=init_cfg)
        if drop_path_rate is not None:
            model_kwargs["drop_path_rate"] = drop_path_rate
        family_of(model_name)  # ValueError naming the presets of this package for any other name
        self.model_name = model_name
        try:
            features = timm.create_model(model_name, pretrained=False, features_only=True,
                                         out_indices=tuple(out_indices), **model_kwargs)
        except TypeError as err:  # e.g. "PPMA.__init__() got an unexpected keyword argument 'x'"
            raise TypeError(f"{type(self).__name__}: timm cannot build {model_name!r} with the "
                            f"backbone arguments {sorted(model_kwargs)}: {err}") from err
        self.model = features.model  # keys stay the timm model's own: backbone.model.stem...
        self.out_indices = tuple(features.out_indices)
        self.channels = tuple(features.feature_info.channels())
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        if with_cp:
            self.model.set_grad_checkpointing(True)
        self._freeze()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.model.forward_intermediates(x, indices=self.out_indices,
                                                      intermediates_only=True))

    # --- freezing -----------------------------------------------------------------------------
    def _freeze(self) -> None:
        """Eval mode and no gradients for what the model says ``frozen_stages`` covers."""
        for module in self.model.frozen_modules(self.frozen_stages):  # ValueError names a bad value
            module.eval()
            for param in module.parameters():
                param.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, _BatchNorm):
                    module.eval()
        return self

    # --- weights -------------------------------------------------------------------------------
    def init_weights(self) -> None:
        """Load ``init_cfg``'s checkpoint strictly (timm initialised the model when built)."""
        if self.init_cfg:
            self.load_checkpoint(self.init_cfg["checkpoint"])
        self._is_init = True

    def load_checkpoint(self, path: str) -> list[str]:
        """Load an official classification checkpoint or one of ours into the backbone, strictly.

        The family's ``checkpoint_filter_fn`` converts the official layout and checks the keys;
        the only tolerated differences are the ones a classification checkpoint cannot avoid:
        its head is dropped, and the per-stage output norms (which only a dense-prediction
        backbone has) keep their initialisation. Anything else (a missing, unexpected or
        differently shaped tensor) raises ``ValueError`` naming the keys.

        Returns the keys that kept their initialisation; logs what was loaded.
        """
        checkpoint = model_state_dict(read_checkpoint_or_url(path))
        state = load_strict(self.model, checkpoint, family_of(self.model_name).checkpoint_filter_fn,
                            source=f"checkpoint {path}", model_name=self.model_name)
        print_log(f"{self.model_name}: loaded {len(state.loaded)} tensors from {path}; "
                  f"{len(checkpoint) - len(state.loaded)} checkpoint entries unused "
                  "(classification head, recomputed buffers)", logger="current")
        if state.kept:
            print_log(f"{self.model_name}: not in a classification checkpoint, kept their "
                      f"initialisation: {state.kept}", logger="current")
        return state.kept


def _check_init_cfg(init_cfg: dict | None) -> None:
    if init_cfg is None:
        return
    if not isinstance(init_cfg, dict) or init_cfg.get("type") != "Pretrained" or "checkpoint" not in init_cfg:
        raise ValueError("init_cfg must be None or dict(type='Pretrained', checkpoint=PATH): timm "
                         f"models initialise themselves when built; got {init_cfg!r}")
    if unknown := set(init_cfg) - {"type", "checkpoint"}:
        raise ValueError(f"init_cfg takes only type and checkpoint, got {sorted(unknown)}")
