"""Config changes that let the same configs run on CPUs, in one process or several.

Used by ``tools/train.py`` and ``tools/test.py`` before the mmengine ``Runner`` is built:

- SyncBN needs GPUs once a process group exists, so on a machine without CUDA every
  ``dict(type='SyncBN')`` of the model config becomes ``dict(type='BN')`` (in one process mmengine
  would revert it as well; with several, it would fail in the first forward);
- mmengine's ``init_dist`` calls ``torch.cuda.set_device`` and its DDP wrapper passes
  ``device_ids=[local_rank]``; on CPUs the process group is initialised here with gloo and DDP
  gets ``device_ids=None``.

:func:`prepare_for_resume` (called by :mod:`ppma.mm.train`) makes a resumed run continue the random
streams of the run it resumes: :class:`RandomStateHook` for the training process's streams,
:class:`WorkerSeededSampler` for the data loader workers'; :class:`AtomicLocalBackend`, mmengine's
local file backend from the import of this module on, writes every file (checkpoints,
``last_checkpoint``) atomically.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.dist import get_dist_info, sync_random_seed
from mmengine.fileio.backends import LocalBackend, register_backend
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import DATA_SAMPLERS, HOOKS
from mmengine.runner import IterBasedTrainLoop
from torch.utils.data import Sampler, get_worker_info


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


def seed_worker(seed: int, epoch: int, rank: int, worker_id: int) -> None:
    """Seed Python's, numpy's and torch's generators of a data loader worker from ``(seed,
    epoch, rank, worker_id)`` alone (numpy's ``SeedSequence`` mixes them)."""
    value = int(np.random.SeedSequence([seed, epoch, rank, worker_id]).generate_state(1)[0])
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


class EpochIndex(int):
    """A dataset index that carries the epoch of the sampler that drew it to the loader worker
    that loads it (an ``int`` everywhere else)."""

    def __new__(cls, index: int, epoch: int):
        tagged = super().__new__(cls, index)
        tagged.epoch = epoch
        return tagged

    def __reduce__(self):
        return EpochIndex, (int(self), self.epoch)


class _SeededFetch:
    """A dataset's ``__getitems__`` (what torch's loader fetches a batch with): in a loader worker,
    before the first batch of each epoch (the epoch of the batch's :class:`EpochIndex` changed),
    the worker's generators are seeded with :func:`seed_worker`; in the main process (no workers)
    it only fetches. Each worker holds its own copy, so the last epoch seen is per worker."""

    def __init__(self, dataset, seed: int, rank: int):
        self.dataset, self.seed, self.rank = dataset, seed, rank
        self.fetch = getattr(dataset, "__getitems__", None)
        self.epoch = None

    def __call__(self, indices: list) -> list:
        worker = get_worker_info()
        epoch = getattr(indices[0], "epoch", None) if indices else None
        if worker is not None and epoch is not None and epoch != self.epoch:
            seed_worker(self.seed, epoch, self.rank, worker.id)
            self.epoch = epoch
        return self.fetch(indices) if self.fetch is not None else [self.dataset[i] for i in indices]


@DATA_SAMPLERS.register_module()
class WorkerSeededSampler(Sampler):
    """The config's sampler, with data loader workers whose random streams depend on the epoch,
    never on their history: resume, with workers persistent or not, is bitwise.

    ``sampler``: the config's sampler (``dict(type='DefaultSampler', ...)``), built with the same
    ``dataset`` and ``seed`` (the runner's). Its indices come out as :class:`EpochIndex` (its
    ``epoch``, 0 for a sampler without epochs, e.g. ``InfiniteSampler``), and ``dataset`` fetches
    batches through :class:`_SeededFetch`: each worker seeds Python's, numpy's and torch's
    generators from ``(seed, epoch, rank, worker id)`` before the first batch of every epoch.
    mmengine seeds a worker once, when it starts: a persistent worker's augmentations in epoch 2
    depend on what it drew in epoch 1, which a resumed run's fresh workers never drew.
    Everything else is the inner sampler's (``set_epoch``, present where the inner sampler has it,
    length, ``dataset``, ``seed``...).
    """

    def __init__(self, dataset, sampler: dict, seed: int | None = None):
        self.sampler = DATA_SAMPLERS.build(sampler, default_args=dict(dataset=dataset, seed=seed))
        self.dataset = dataset
        seed = getattr(self.sampler, "seed", seed)
        dataset.__getitems__ = _SeededFetch(dataset, sync_random_seed() if seed is None else seed,
                                            get_dist_info()[0])

    def __iter__(self):
        epoch = getattr(self.sampler, "epoch", 0)
        return (EpochIndex(index, epoch) for index in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str):
        if name == "sampler":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.sampler, name)


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

    def before_train(self, runner) -> None:
        # A loader draws a seed for its workers from torch's generator each time an iterator
        # starts: every epoch without persistent workers, once with them, so a resumed run would
        # draw once more than the run it continues. Its own generator keeps the draw off the
        # training stream (the workers seed themselves: WorkerSeededSampler, mmengine's init).
        loader = runner.train_loop.dataloader
        if loader.generator is None:
            loader.generator = torch.Generator().manual_seed(runner.seed)

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


def prepare_for_resume(cfg: Config) -> None:
    """Make a run resumable bitwise (in place): :class:`RandomStateHook` among the custom hooks,
    the training loader's sampler inside a :class:`WorkerSeededSampler`."""
    cfg.custom_hooks = [*cfg.get("custom_hooks", []), dict(type="RandomStateHook")]
    loader = cfg.train_dataloader
    if loader.get("sampler", {}).get("type") not in (None, "WorkerSeededSampler"):
        loader.sampler = dict(type="WorkerSeededSampler", sampler=loader.sampler)


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
