"""Inputs for the visualization tools: images, models and their checkpoints, query strings.

Checkpoints accepted by :func:`load_model`: the official PPMA ``.pth`` (``{'model': state}``),
our safetensors files (``tools/convert_checkpoint.py``), and OpenMMLab checkpoints of detectors
and segmentors (their ``backbone.`` entries), all converted by
:func:`ppma.models.ppma.checkpoint_filter_fn`. Any key that does not fit is an error.
"""
from __future__ import annotations

import importlib.util
import logging
import pickle
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from safetensors import SafetensorError

from ppma.models.checkpoint import model_state_dict, read_checkpoint

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


def create_model(name: str, **kwargs) -> torch.nn.Module:
    """``timm.create_model(name, **kwargs)`` for a registered PPMA preset, in eval mode."""
    import timm

    import ppma  # noqa: F401  (registers the presets)

    if not timm.is_model(name):
        choices = ", ".join(timm.list_models("ppma*"))
        raise ValueError(f"unknown model {name!r}; PPMA models: {choices}")
    return timm.create_model(name, **kwargs).eval()


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


def _load_state(model: torch.nn.Module, state: dict) -> None:
    """Convert ``state`` with :func:`ppma.models.ppma.checkpoint_filter_fn` and load it strictly."""
    from ppma.models.ppma import checkpoint_filter_fn

    try:
        model.load_state_dict(checkpoint_filter_fn(state, model), strict=True)
    except (KeyError, RuntimeError) as err:  # RuntimeError: missing/unexpected keys, shape mismatches
        raise ValueError(str(err)) from err


def load_model(name: str, checkpoint: str | Path | None = None) -> tuple[torch.nn.Module, bool]:
    """Build preset ``name`` and load ``checkpoint`` (if given); returns ``(model, has_classifier)``.

    A checkpoint that fits only without the classification head (a detection/segmentation
    backbone) is loaded into the model with its head removed. Raises
    ``FileNotFoundError``, or ``ValueError`` naming the keys that do not fit.
    """
    if checkpoint is None:
        return create_model(name), False
    path = Path(checkpoint)
    state = _read_checkpoint(path)
    model = create_model(name)
    try:
        _load_state(model, state)
        logger.info("loaded %s into %s", path, name)
        return model, True
    except ValueError as err:
        model.head = None  # a pure backbone, as built with with_head=False
        try:
            _load_state(model, state)
        except ValueError:
            raise ValueError(f"checkpoint {path} does not fit {name}: {err}") from err
    logger.info("loaded %s into %s as a backbone (the checkpoint has no classification head)", path, name)
    return model, False


def imagenet_top5(logits: torch.Tensor) -> list[tuple[str, float]]:
    """``(num_classes,)`` ImageNet-1k logits -> five ``(class name, probability)`` pairs."""
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    probs = logits.float().softmax(-1)
    top = probs.topk(5)
    return [(info.index_to_description(int(i)), float(p)) for p, i in zip(top.values, top.indices)]
