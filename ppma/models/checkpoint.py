"""Reading checkpoint files and finding a model's weights inside them, for every family.

Accepted layouts: a plain state dict; ``{'model' | 'models' | 'state_dict': state_dict, ...}``
(official classification checkpoints carry their training state and an ``argparse.Namespace``
of arguments beside the weights; OpenMMLab checkpoints use ``state_dict``); DDP's ``module.``
prefix; the ``backbone.*`` entries of a detector/segmentor, with the OpenMMLab adapter's
``model.`` prefix. Renaming a family's official module names is the family's
``checkpoint_filter_fn`` (e.g. :func:`ppma.models.ppma.checkpoint_filter_fn`).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import re
from pathlib import Path

import torch
from torch import nn

_logger = logging.getLogger(__name__)

STATE_DICT_KEYS = ("model", "models", "state_dict")


@contextlib.contextmanager
def allow_namespace():
    """Allow ``argparse.Namespace`` in weights-only loads inside the block.

    torch's ``safe_globals`` context removes its globals on exit, even ones allowed before it:
    it is entered only when ``Namespace`` is not allowed yet, so the caller's allow-list stays
    as it was.
    """
    if argparse.Namespace in torch.serialization.get_safe_globals():
        yield
    else:
        with torch.serialization.safe_globals([argparse.Namespace]):
            yield


def read_checkpoint(path: str | Path) -> dict:
    """Load a local checkpoint file: ``.safetensors``, or anything ``torch.load`` reads.

    ``torch.load`` runs with ``weights_only=True``; the only global allowed beyond torch's own is
    ``argparse.Namespace`` (the ``args`` of the official checkpoints; unpickling it only sets
    attributes). Other objects raise ``pickle.UnpicklingError``: OpenMMLab training checkpoints
    read after ``import ppma.mm``, which allows what they hold (:mod:`ppma.mm.serialization`).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path), device="cpu")
    with allow_namespace():
        return torch.load(path, map_location="cpu", weights_only=True)


def model_state_dict(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The tensors of the model's (or, in a detector/segmentor, the backbone's) state dict.

    Unwraps ``{'model' | 'models' | 'state_dict': ...}``, strips ``module.``, keeps only the
    ``backbone.`` entries of a detector/segmentor and the adapter's ``model.`` prefix.
    """
    if not isinstance(checkpoint, dict):
        raise ValueError(f"a checkpoint must be a dict, got {type(checkpoint).__name__}")
    for key in STATE_DICT_KEYS:
        if isinstance(checkpoint.get(key), dict):
            checkpoint = checkpoint[key]
            break
    state = {k.removeprefix("module."): v for k, v in checkpoint.items() if torch.is_tensor(v)}
    if not state:
        raise ValueError(f"the checkpoint holds no tensors (expected a state dict, or one under {STATE_DICT_KEYS})")
    if any(k.startswith("backbone.") for k in state):
        dropped = sum(not k.startswith("backbone.") for k in state)
        _logger.info("keeping the backbone of a detector/segmentor checkpoint; dropped %d other tensors", dropped)
        state = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
    if all(k.startswith("model.") for k in state):
        state = {k.removeprefix("model."): v for k, v in state.items()}
    return state


def finish_conversion(converted: dict, sources: dict, model: nn.Module) -> dict:
    """The strict end of every family's ``checkpoint_filter_fn``.

    ``converted``: the checkpoint's tensors under ``model``'s names; ``sources``: the same keys
    -> the checkpoint's own names (for error messages). Two deliberate, logged exceptions to
    strictness: the head of a classification checkpoint is dropped when the model has none
    (``model.head is None``), and output norms (``out_norms.*``) the checkpoint lacks keep their
    initialisation. The classifier ``head.fc`` is left to timm, which adapts it to another
    ``num_classes``. Any other key without a counterpart, or model key without a source:
    ``ValueError`` naming them all.
    """
    own = model.state_dict()
    if getattr(model, "head", None) is None:
        head = [k for k in converted if k.startswith("head.")]
        for k in head:
            del converted[k]
        if head:
            _logger.info("the model has no classification head: dropped %d head keys of the checkpoint", len(head))
    fresh = [k for k in own if k.startswith("out_norms.") and k not in converted]
    for k in fresh:
        converted[k] = own[k]
    if fresh:
        _logger.info("output norms not in the checkpoint keep their initialisation: %s", ", ".join(fresh))
    unexpected = [sources.get(k, k) for k in converted if k not in own and not k.startswith("head.fc.")]
    missing = [k for k in own if k not in converted and not k.startswith("head.fc.")]
    if unexpected or missing:
        raise ValueError(
            "checkpoint does not match the model: "
            + (f"keys without a counterpart in the model: {unexpected}; " if unexpected else "")
            + (f"model keys missing from the checkpoint: {missing}" if missing else "")
        )
    return converted


def head_and_norm_kwargs(state_dict: dict, norm_pattern: str, head_prefixes: tuple[str, ...], classifier: str) -> dict:
    """``timm.create_model`` keywords for a hierarchical family's checkpoint: ``output_norms``
    from the stages of the keys matching ``norm_pattern`` (a regex whose group 1 is the stage);
    ``with_head=False`` when no key starts with ``head_prefixes``, else ``num_classes`` from the
    rows of ``classifier`` (0 when the head has no classifier)."""
    kwargs = {}
    norms = sorted({int(m[1]) for k in state_dict if (m := re.match(norm_pattern, k))})
    if norms:
        kwargs["output_norms"] = norms
    if not any(k.startswith(head_prefixes) for k in state_dict):
        kwargs["with_head"] = False
    else:
        kwargs["num_classes"] = state_dict[classifier].shape[0] if classifier in state_dict else 0
    return kwargs
