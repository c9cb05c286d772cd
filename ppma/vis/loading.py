"""Inputs for the visualization tools: images, models and their checkpoints, query strings.

Checkpoints accepted by :func:`load_model`: the official ``.pth`` (``{'model': state}``), our
safetensors files (``tools/convert_checkpoint.py``), and OpenMMLab checkpoints of detectors and
segmentors (their ``backbone.`` entries). The model's family (found by its name,
:mod:`ppma.models.family`) says from the checkpoint's keys how to build the model (head or not,
output norms) and converts them; any key that does not fit is an error.
"""
from __future__ import annotations

import importlib.util
import logging
import pickle
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image, UnidentifiedImageError
from safetensors import SafetensorError

from ppma.models.checkpoint import model_state_dict, read_checkpoint
from ppma.models.family import create_from_checkpoint, family_of

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def load_image(path: str | Path) -> np.ndarray:
    """Read an image file as an RGB ``uint8`` array ``(h, w, 3)``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except UnidentifiedImageError as err:
        raise ValueError(f"{path} is not an image that PIL can read") from err


def image_files(paths: list[str | Path]) -> list[Path]:
    """Expand files and folders (their images, sorted) into a list of image paths."""
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"image not found: {p}")
    if not files:
        raise ValueError(f"no images found in {[str(p) for p in paths]}")
    return files


def preprocess(image: np.ndarray, size: tuple[int, int], mean, std) -> torch.Tensor:
    """Resize ``(h, w, 3)`` uint8 (or a ``(T, h, w, 3)`` clip) to ``size = (H, W)`` and normalise.

    Returns ``(1, 3, H, W)`` (clip: ``(1, 3, T, H, W)``) fp32.
    """
    frames = image if image.ndim == 4 else image[None]
    resized = [np.asarray(Image.fromarray(f).resize((size[1], size[0]), Image.BICUBIC)) for f in frames]
    x = torch.from_numpy(np.stack(resized)).float().div(255.0)  # (T, H, W, 3)
    x = (x - torch.tensor(mean)) / torch.tensor(std)
    x = x.permute(3, 0, 1, 2)[None]  # (1, 3, T, H, W)
    return x if image.ndim == 4 else x[:, :, 0]


def parse_query(text: str) -> tuple[float, float]:
    """``'x,y'`` (pixels) -> ``(x, y)``; raises ``ValueError`` with the expected form."""
    try:
        x, y = (float(v) for v in text.split(","))
    except ValueError as err:
        raise ValueError(f"query must be 'x,y' in pixels, e.g. '120,80', got {text!r}") from err
    return x, y


def _read_checkpoint(path: Path) -> dict:
    """The model's tensors in ``path`` (:func:`ppma.models.read_checkpoint`, weights only).

    OpenMMLab training checkpoints hold logging objects beyond tensors; they are read once
    :mod:`ppma.mm` (the ``mm`` extra) has allowed those objects.
    """
    try:
        try:
            checkpoint = read_checkpoint(path)
        except pickle.UnpicklingError:
            if importlib.util.find_spec("mmengine") is None:
                raise
            import ppma.mm  # noqa: F401  (allows the globals of OpenMMLab training checkpoints)

            checkpoint = read_checkpoint(path)
        return model_state_dict(checkpoint)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, SafetensorError) as err:
        raise ValueError(f"cannot read checkpoint {path}: {err}") from err


def load_model(name: str, checkpoint: str | Path | None = None) -> tuple[torch.nn.Module, bool]:
    """Build preset ``name`` and load ``checkpoint`` (if given); returns ``(model, has_classifier)``.

    The model is built as the checkpoint's keys say (its family's ``checkpoint_model_kwargs``):
    a detection/segmentation backbone without the classification head, with its output norms.
    Loading is strict. Raises ``FileNotFoundError``, or ``ValueError`` naming the keys that do not fit.
    """
    family_of(name)  # ValueError for an unknown model, naming the models of this package
    if checkpoint is None:
        return timm.create_model(name).eval(), False
    path = Path(checkpoint)
    state = _read_checkpoint(path)
    try:
        model = create_from_checkpoint(name, state).eval()
    except ValueError as err:
        raise ValueError(f"checkpoint {path} does not fit {name}: {err}") from err
    has_classifier = model.head is not None and model.num_classes > 0
    logger.info("loaded %s into %s%s", path, name,
                "" if has_classifier else " as a backbone (the checkpoint has no classifier)")
    return model, has_classifier


def imagenet_top5(logits: torch.Tensor) -> list[tuple[str, float]]:
    """``(num_classes,)`` ImageNet-1k logits -> five ``(class name, probability)`` pairs."""
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    probs = logits.float().softmax(-1)
    top = probs.topk(5)
    return [(info.index_to_description(int(i)), float(p)) for p, i in zip(top.values, top.indices)]
