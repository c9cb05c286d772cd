"""Config changes that let the same configs run on CPUs, in one process or several.

Used by ``tools/train.py`` and ``tools/test.py`` before the mmengine ``Runner`` is built:

- SyncBN needs GPUs once a process group exists, so on a machine without CUDA every
  ``dict(type='SyncBN')`` of the model config becomes ``dict(type='BN')`` (in one process mmengine
  would revert it as well; with several, it would fail in the first forward);
- mmengine's ``init_dist`` calls ``torch.cuda.set_device`` and its DDP wrapper passes
  ``device_ids=[local_rank]``; on CPUs the process group is initialised here with gloo and DDP
  gets ``device_ids=None``.

:class:`RandomStateHook` (added by ``tools/train.py``) makes a resumed run continue the random
streams of the run it resumes; :class:`AtomicLocalBackend`, mmengine's local file backend from
the import of this module on, writes every file (checkpoints, ``last_checkpoint``) atomically.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.fileio.backends import LocalBackend, register_backend
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS
from mmengine.runner import IterBasedTrainLoop


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend, writing atomically: the data goes to ``<path>.tmp``, then
    ``os.replace`` renames it. A run killed during a save leaves the previous checkpoint and
    ``last_checkpoint`` whole (and maybe a stray ``.tmp``), so ``--resume`` picks the previous
    complete checkpoint."""

    def put(self, obj: bytes, filepath) -> None:
        tmp = f"{filepath}.tmp"
        super().put(obj, tmp)
        os.replace(tmp, filepath)

    def put_text(self, obj: str, filepath, encoding: str = "utf-8") -> None:
        tmp = f"{filepath}.tmp"
        super().put_text(obj, tmp, encoding)
        os.replace(tmp, filepath)


register_backend("local", AtomicLocalBackend, force=True, prefixes="")  # paths without a scheme


def random_state() -> dict:
    """The global random streams: Python's, numpy's, torch's CPU (and CUDA) generators."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_random_state(state: dict) -> None:
    """Restore what :func:`random_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@HOOKS.register_module()
class RandomStateHook(Hook):
    """Resume that loses nothing: the random streams are saved in every checkpoint
    (``checkpoint['random_state']``, per process) and restored when a run resumes from it
    (drop path, dropout, augmentations then draw what the uninterrupted run drew). Validation
    runs between a save and the next epoch, so it runs on a copy: the training streams are
    restored after it, as if it had not drawn, and a checkpoint saved during it (mmengine saves
    the latest one again when the best score improves) stores the training streams. mmengine itself restores the optimizer, the
    schedulers, EMA (``EMAHook``), the message hub and the epoch (the sampler's per-epoch
    order), but reseeds the random streams from the config's seed. An iteration-based loop
    loads the batches trained before the checkpoint again to skip them: the streams are restored
    after that skip (:class:`_RestoreAfterSkip`).
    """

    priority = "VERY_LOW"

    def __init__(self):
        self._training_state = None  # the training streams, while validation runs

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        # mmengine saves the latest checkpoint again during validation when the best score improves
        state = self._training_state
        checkpoint["random_state"] = random_state() if state is None else state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if runner._resume and "random_state" in checkpoint:  # not when fine-tuning (load_from)
            state = checkpoint["random_state"]
            set_random_state(state)
            loop, done = runner.train_loop, checkpoint["meta"]["iter"]
            if isinstance(loop, IterBasedTrainLoop) and done > 0:
                loop.dataloader_iterator = _RestoreAfterSkip(loop, done, state)

    def before_val(self, runner) -> None:
        self._training_state = random_state()

    def after_val(self, runner) -> None:
        set_random_state(self._training_state)
        self._training_state = None


class _RestoreAfterSkip:
    """An iteration-based loop's data iterator while its resumed run skips the batches trained
    before the checkpoint: mmengine loads them again through the pipeline, whose augmentations
    draw from the random streams. After the last skipped batch the checkpoint's streams are
    restored and the loop gets its own iterator back."""

    def __init__(self, loop: IterBasedTrainLoop, skip: int, state: dict):
        self.loop, self.skip, self.state = loop, skip, state
        self.iterator = loop.dataloader_iterator

    def __next__(self):
        batch = next(self.iterator)
        self.skip -= 1
        if self.skip == 0:
            set_random_state(self.state)
            self.loop.dataloader_iterator = self.iterator
        return batch


def replace_sync_bn(node) -> int:
    """Turn every ``dict(type='SyncBN', ...)`` under ``node`` into ``type='BN'``, in place.

    Returns how many were replaced.
    """
    count = 0
    if isinstance(node, dict):
        if node.get("type") == "SyncBN":
            node["type"] = "BN"
            count += 1
        for value in node.values():
            count += replace_sync_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            count += replace_sync_bn(value)
    return count


def prepare_for_device(cfg: Config, launcher: str) -> None:
    """Adapt ``cfg`` (in place) to a machine without CUDA; a no-op where CUDA is available."""
    if torch.cuda.is_available():
        return
    if count := replace_sync_bn(cfg.model):
        print_log(f"no CUDA device: {count} SyncBN layer config(s) replaced by BN", logger="current")
    if launcher == "none":
        return
    cfg.env_cfg.setdefault("dist_cfg", {})["backend"] = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")  # env:// from torchrun
    wrapper = cfg.get("model_wrapper_cfg") or dict(
        type="MMDistributedDataParallel",
        broadcast_buffers=False,
        find_unused_parameters=cfg.get("find_unused_parameters", False))
    wrapper["device_ids"] = None
    cfg.model_wrapper_cfg = wrapper


def load_config(path: str, cfg_options: dict | None = None, work_dir: str | None = None,
                launcher: str = "none") -> Config:
    """Read a config, apply ``--cfg-options`` and set ``work_dir`` (default
    ``./work_dirs/<config name>``) and ``launcher``."""
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get("work_dir") is None:
        cfg.work_dir = str(Path("work_dirs") / Path(path).stem)
    cfg.launcher = launcher
    return cfg
