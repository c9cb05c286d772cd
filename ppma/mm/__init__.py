"""OpenMMLab adapters: backbones for mmdet 3.x and mmseg 1.x.

Importing this package (configs do it with
``custom_imports=dict(imports=['ppma.mm'], allow_failed_imports=False)``)

- registers :class:`PyramidBackbone` (any family's preset by ``model_name``) in the ``MODELS`` registry of
  mmdet and of mmseg, whichever of the two is installed (ImportError if neither is);
- registers :class:`NoDecayOptimWrapperConstructor` (no weight decay on the parameters the
  model declares in ``no_weight_decay()``) and :class:`LayerDecayOptimWrapperConstructor` (the
  same, plus layer-wise lr decay over the blocks) in mmengine's ``OPTIM_WRAPPER_CONSTRUCTORS``;
- allows the globals that training checkpoints need under ``torch.load(weights_only=True)``
  (:mod:`ppma.mm.serialization`), so that resume and test load them on torch >= 2.6.

Image classification (mmpretrain) is the submodule :mod:`ppma.mm.classification`, imported by the
classification configs only, so that mmdet/mmseg users do not need mmpretrain.
"""
import importlib
import importlib.util

from .backbone import PyramidBackbone
from .optim import LayerDecayOptimWrapperConstructor, NoDecayOptimWrapperConstructor
from .serialization import allow_checkpoint_globals

__all__ = [
    "LayerDecayOptimWrapperConstructor", "NoDecayOptimWrapperConstructor", "PyramidBackbone", "REGISTERED_IN",
    "allow_checkpoint_globals",
]


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ModuleNotFoundError:  # a finder that reports it missing
        return False


def _register(classes) -> tuple[str, ...]:
    """Add ``classes`` to ``<pkg>.registry.MODELS`` for every installed pkg of mmdet, mmseg."""
    found = []
    for package in ("mmdet", "mmseg"):
        try:
            registry = importlib.import_module(f"{package}.registry").MODELS
        except ModuleNotFoundError as err:
            if err.name != package:  # installed but broken: say so
                raise
            continue
        for cls in classes:
            if registry.module_dict.get(cls.__name__) is not cls:
                registry.register_module(module=cls)
        found.append(package)
    if not found and not _installed("mmpretrain"):  # classification alone is fine
        raise ImportError("ppma.mm needs mmdet, mmseg or mmpretrain (pip install 'ppma[mm]', see docs/openmmlab.md)")
    return tuple(found)


allow_checkpoint_globals()
REGISTERED_IN = _register((PyramidBackbone,))
