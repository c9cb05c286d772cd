"""Config changes that let the same configs run on CPUs, in one process or several.

Used by ``tools/train.py`` and ``tools/test.py`` before the mmengine ``Runner`` is built:

- SyncBN needs GPUs once a process group exists, so on a machine without CUDA every
  ``dict(type='SyncBN')`` of the model config becomes ``dict(type='BN')`` (in one process mmengine
  would revert it as well; with several, it would fail in the first forward);
- mmengine's ``init_dist`` calls ``torch.cuda.set_device`` and its DDP wrapper passes
  ``device_ids=[local_rank]``; on CPUs the process group is initialised here with gloo and DDP
  gets ``device_ids=None``.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.logging import print_log


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
