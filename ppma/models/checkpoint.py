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
import os
import pickle
import re
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

import torch
from timm.models import get_pretrained_cfg
from torch import nn

_logger = logging.getLogger(__name__)

STATE_DICT_KEYS = ("model", "models", "state_dict")
#: where a training checkpoint keeps the EMA weights (timm: ``state_dict_ema``; the official
#: Swin-style training scripts: ``model_ema``), read first unless ``use_ema=False``, as timm does
EMA_KEYS = ("state_dict_ema", "model_ema")


class YacsConfig:
    """Stand-in allowed under the name ``yacs.config.CfgNode`` in weights-only loads.

    Official MLLA training checkpoints keep their yacs config beside the weights; it is read as
    plain nested ``OrderedDict``s (yacs need not be installed, and none of its code runs).
    """

    def __new__(cls, *args):
        return OrderedDict()


#: what weights-only loads allow beyond torch's own: the official checkpoints' ``args`` and config
CHECKPOINT_GLOBALS = (argparse.Namespace, (YacsConfig, "yacs.config.CfgNode"))


@contextlib.contextmanager
def allow_official_globals():
    """Allow :data:`CHECKPOINT_GLOBALS` in weights-only loads inside the block.

    torch's ``safe_globals`` context removes its globals on exit, even ones allowed before it:
    only the ones not allowed yet are entered, so the caller's allow-list stays as it was.
    """
    allowed = torch.serialization.get_safe_globals()
    missing = [g for g in CHECKPOINT_GLOBALS if g not in allowed]
    if not missing:
        yield
    else:
        with torch.serialization.safe_globals(missing):
            yield


def read_checkpoint(path: str | Path) -> dict:
    """Load a local checkpoint file: ``.safetensors``, or anything ``torch.load`` reads.

    ``torch.load`` runs with ``weights_only=True``; the only globals allowed beyond torch's own
    are :data:`CHECKPOINT_GLOBALS` (``argparse.Namespace``, the ``args`` of the official
    checkpoints, and yacs' ``CfgNode``, their config: unpickling them only sets attributes or
    items). Every error names the file and the problem:

    - ``FileNotFoundError``: no file at ``path``;
    - ``ValueError``: not a complete checkpoint (truncated, or another format, e.g. random bytes);
    - ``pickle.UnpicklingError``: a checkpoint that needs a global not allowed (named), and how to
      allow it: OpenMMLab training checkpoints read after ``import ppma.mm``
      (:mod:`ppma.mm.serialization`), other classes you trust with
      ``torch.serialization.add_safe_globals``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}" + (" (a folder)" if path.is_dir() else ""))
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except SafetensorError as err:
            raise _not_a_checkpoint(path, err) from err
    try:
        with allow_official_globals():
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))
        # a zip archive (torch.save) or a pickle (its PROTO opcode first): a checkpoint whose
        # global is refused; anything else fails at a byte that is not what torch.save writes
        if found is None or not _starts_with(path, b"PK\x03\x04", b"\x80"):
            raise _not_a_checkpoint(path, err) from None
        raise pickle.UnpicklingError(
            f"checkpoint {path} needs {found[1]}, which weights-only loading does not allow. If you trust the "
            f"file, allow it first: torch.serialization.add_safe_globals([{found[1]}]) (an OpenMMLab training "
            "checkpoint: import ppma.mm, which allows what those hold)") from err
    except Exception as err:  # the zip reader, a short file, garbage the unpickler trips on (IndexError...)
        raise _not_a_checkpoint(path, err) from err


def _not_a_checkpoint(path: Path, err: Exception) -> ValueError:
    """The error for a file ``torch.load`` (or safetensors) cannot read: ``err``'s first line."""
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    if "WeightsUnpickler error" in str(err):  # torch's advice to trust the file does not apply
        first = str(err).split("WeightsUnpickler error:")[1].strip().splitlines()[0]
    return ValueError(f"cannot read checkpoint {path}: truncated or not a checkpoint ({first})")


def check_pretrained(variant: str, pretrained_cfg_overlay: dict | None = None) -> None:
    """Before timm loads ``variant``'s pretrained weights: a clear error where timm's is not.

    ``FileNotFoundError`` naming a ``file`` (of the preset's cfg or ``pretrained_cfg_overlay``)
    that does not exist; ``ValueError`` naming a file that is not a complete zip archive or
    ``.safetensors`` file (a truncated download); ``ValueError`` when the preset has no
    download timm can use (no ``file`` or ``hf_hub_id``, and no ``url`` naming a file: timm
    caches a download under the url's file name), saying how to pass a file.
    """
    cfg = {**get_pretrained_cfg(variant, allow_unregistered=False).to_dict(), **(pretrained_cfg_overlay or {})}
    if cfg.get("file"):
        path = Path(cfg["file"])
        if not path.is_file():
            raise FileNotFoundError(f"pretrained weights of {variant!r} not found: {path}")
        if path.suffix == ".safetensors":
            from safetensors import SafetensorError, safe_open

            try:
                with safe_open(str(path), "pt"):
                    pass
            except SafetensorError as err:
                raise _not_a_checkpoint(path, err) from err
        elif zipfile.is_zipfile(path) is False and _starts_with(path, b"PK\x03\x04"):
            raise ValueError(f"cannot read checkpoint {path}: a truncated zip archive (torch.save's format)")
    elif cfg.get("hf_hub_id"):
        return
    elif not cfg.get("url") or not os.path.basename(urlparse(cfg["url"]).path):
        why = f"its url {cfg['url']} names no file, which timm cannot cache" if cfg.get("url") else "no url"
        raise ValueError(f"{variant!r} has no download timm can use ({why}): fetch the weights yourself and pass "
                         f"the file: timm.create_model({variant!r}, pretrained=True, "
                         "pretrained_cfg_overlay=dict(file='path/to/weights.pth'))")


def _starts_with(path: Path, *prefixes: bytes) -> bool:
    """Whether the file ``path`` begins with one of ``prefixes``."""
    with open(path, "rb") as f:
        return f.read(max(map(len, prefixes))).startswith(prefixes)


def model_state_dict(checkpoint: dict, use_ema: bool = True) -> dict[str, torch.Tensor]:
    """The tensors of the model's (or, in a detector/segmentor, the backbone's) state dict.

    Unwraps ``{'model' | 'models' | 'state_dict': ...}`` (with ``use_ema``, timm's default and
    ours, the EMA weights under :data:`EMA_KEYS` first, when the checkpoint has them), strips
    ``module.``, keeps only the ``backbone.`` entries of a detector/segmentor and the adapter's
    ``model.`` prefix.
    """
    if not isinstance(checkpoint, dict):
        raise ValueError(f"a checkpoint must be a dict, got {type(checkpoint).__name__}")
    for key in (EMA_KEYS if use_ema else ()) + STATE_DICT_KEYS:
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


#: model keys that only a dense-prediction backbone has (per-stage output norms, Vim's pyramid
#: adapter): a classification checkpoint cannot fill them, so they may keep their initialisation.
DENSE_ONLY = ("out_norms.", "pyramid.")


class Converted(dict):
    """A state dict in the model's keys, and what the conversion did to get it.

    Attributes:
        loaded: model keys whose tensors come from the checkpoint.
        kept: model keys that keep the model's own tensor (not in the checkpoint, allowed to be
            absent); their values in the dict are the model's tensors.
        dropped: checkpoint keys (the checkpoint's own names) not carried over.
    """

    def __init__(self, state: dict, loaded: list[str], kept: list[str], dropped: list[str]):
        super().__init__(state)
        self.loaded, self.kept, self.dropped = loaded, kept, dropped


def finish_conversion(converted: dict, sources: dict, model: nn.Module) -> Converted:
    """The strict end of every family's ``checkpoint_filter_fn``.

    ``converted``: the checkpoint's tensors under ``model``'s names; ``sources``: model key ->
    the checkpoint's own name, for every key the filter produced (error messages; a key of
    ``sources`` no longer in ``converted`` counts as dropped). Two deliberate, logged exceptions
    to strictness: the head of a classification checkpoint is dropped when the model has none
    (``model.head is None``), and the dense-prediction-only keys (:data:`DENSE_ONLY`) the
    checkpoint lacks keep their initialisation. The classifier ``head.fc`` is left to timm /
    :func:`load_strict`, which adapt it to another ``num_classes``. Any other key without a
    counterpart, model key without a source, or tensor of another shape: ``ValueError`` naming
    them all. Returns a :class:`Converted` (``loaded``, ``kept``, ``dropped``).
    """
    own = model.state_dict()
    if getattr(model, "head", None) is None:
        head = [k for k in converted if k.startswith("head.")]
        for k in head:
            del converted[k]
        if head:
            _logger.info("the model has no classification head: dropped the checkpoint's head keys %s",
                         ", ".join(sources.get(k, k) for k in head))
    kept = [k for k in own if k.startswith(DENSE_ONLY) and k not in converted]
    if kept:
        _logger.info("not in the checkpoint, keep their initialisation: %s", ", ".join(kept))
    unexpected = [sources.get(k, k) for k in converted if k not in own and not k.startswith("head.fc.")]
    missing = [k for k in own if k not in converted and k not in kept and not k.startswith("head.fc.")]
    shapes = [f"size mismatch for {k}" + (f" (checkpoint key {sources[k]})" if sources.get(k, k) != k else "")
              + f": {tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} in the model"
              for k, v in converted.items() if k in own and not k.startswith("head.fc.") and v.shape != own[k].shape]
    if unexpected or missing or shapes:
        raise ValueError("checkpoint does not match the model: " + "; ".join(
            f"{what}: {_first(keys)}" for what, keys in (("keys without a counterpart in the model", unexpected),
                                                 ("model keys missing from the checkpoint", missing),
                                                 ("shapes differ", shapes)) if keys))
    dropped = [source for k, source in sources.items() if k not in converted]
    return Converted({**converted, **{k: own[k] for k in kept}}, list(converted), kept, dropped)


def _first(keys: list, count: int = 8) -> str:
    """``keys`` for an error message: the first ``count`` of them, then how many there are."""
    return str(keys) if len(keys) <= count else f"{keys[:count]} and {len(keys) - count} more ({len(keys)} in all)"


def load_strict(model: nn.Module, state_dict: dict, filter_fn: Callable[[dict, nn.Module], dict] | None = None, *,
                source: str = "the checkpoint", model_name: str | None = None,
                head_may_differ: bool = False) -> Converted:
    """Load ``state_dict`` into ``model`` strictly; the one loader of every reader in this package.

    Args:
        model: the timm model of a family (or any module, with ``filter_fn=None``).
        state_dict: the checkpoint's tensors (:func:`model_state_dict` unwraps a whole checkpoint).
        filter_fn: the family's ``checkpoint_filter_fn(state_dict, model)`` (official or our
            layout -> ``model``'s keys, :func:`finish_conversion` at its end); None when
            ``state_dict`` is in ``model``'s keys already.
        source: how error messages name the checkpoint (e.g. ``f"checkpoint {path}"``).
        model_name: how error messages name the model (default: its class name).
        head_may_differ: a classifier ``head.fc`` of another class count keeps the model's
            initialisation (fine-tuning) instead of raising.

    Returns the :class:`Converted` state that was loaded: ``loaded``, ``kept`` (the model's own
    tensors: dense-only keys, a resized ``head.fc``), ``dropped`` (checkpoint keys not used).
    Raises ``ValueError`` naming ``source`` and every key or shape that does not fit.
    """
    own = model.state_dict()
    try:
        state = filter_fn(state_dict, model) if filter_fn is not None else state_dict
        if not isinstance(state, Converted):
            state = Converted(state, list(state), [], [])
        resized = [k for k in ("head.fc.weight", "head.fc.bias")
                   if head_may_differ and k in state and k in own and state[k].shape != own[k].shape]
        for k in resized:
            state[k] = own[k]
            state.loaded.remove(k)
            state.kept.append(k)
        unexpected = [k for k in state if k not in own]
        missing = [k for k in own if k not in state]
        shapes = [f"size mismatch for {k}: {tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} in the model"
                  for k, v in state.items() if k in own and v.shape != own[k].shape]
        if unexpected or missing or shapes:
            raise ValueError("; ".join(f"{what}: {keys}" for what, keys in (
                ("keys without a counterpart in the model", unexpected),
                ("model keys missing from the checkpoint", missing),
                ("shapes differ", shapes)) if keys))
        model.load_state_dict(state, strict=True)
    except ValueError as err:
        name = repr(model_name) if model_name else f"the {type(model).__name__} model"
        raise ValueError(f"{source} does not fit {name}: {err}") from err
    return state


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
