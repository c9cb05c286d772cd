"""The official PPMA-T and MLLA-T, built from their model files in copies of the official
repositories given by path (nothing official ships here), to be timed beside ours in one process.

The files are imported by path as modules of their own (in ``sys.modules``, where timm's
``register_model`` looks them up); the models keep their random initialisation.
"""
from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

PPMA_FILE = "classification/models/PPMA.py"  # github.com/zhongchenzhao/PPMA
MLLA_FILE = "models/mlla.py"  # github.com/LeapLabTHU/MLLA
# PPMA-T's configuration (as the release's PPMAViT_T sets it) for the release's backbone class.
PPMA_T = {"embed_dims": [64, 128, 256, 512], "depths": [2, 2, 8, 2], "num_heads": [4, 4, 8, 16],
          "init_values": [2] * 4, "heads_ranges": [4, 4, 6, 6], "mlp_ratios": [3] * 4,
          "chunkwise_recurrents": [True, True, False, False]}
MLLA_T = {"embed_dim": 64, "depths": [2, 4, 8, 4], "num_heads": [2, 4, 8, 16]}


def official_file(directory: str | Path, relative: str) -> Path:
    """``directory / relative``; ``FileNotFoundError`` naming both when it is not there."""
    path = Path(directory) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no {relative} there (a copy of the official repository is expected)")
    return path


def import_file(path: Path) -> ModuleType:
    """Import the Python file ``path`` as module ``official_<stem>`` (its folder first on ``sys.path``
    for its own imports)."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"official_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Official:
    """An official model: its label, the preset of ours it sits beside, whether it is a backbone
    (stage outputs) or a classifier, and how to build it."""

    label: str
    beside: str
    backbone: bool
    build: Callable[[], torch.nn.Module]


def official_models(ppma_dir: str | Path | None, mlla_dir: str | Path | None) -> list[Official]:
    """The official models of the repositories given: PPMA-T and its backbone, MLLA-T."""
    models = []
    if ppma_dir is not None:
        ppma = import_file(official_file(ppma_dir, PPMA_FILE))
        models += [Official("official PPMA-T", "ppma_tiny", False, lambda: ppma.PPMAViT_T(None)),
                   Official("official PPMA-T backbone", "ppma_tiny", True,
                            lambda: ppma.Backbone_PPMAViT(out_indices=(0, 1, 2, 3), **PPMA_T))]
    if mlla_dir is not None:
        mlla = import_file(official_file(mlla_dir, MLLA_FILE))
        models.append(Official("official MLLA-T", "mila_tiny", False, lambda: mlla.MLLA(**MLLA_T)))
    return models
