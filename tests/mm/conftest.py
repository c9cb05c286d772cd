"""Shared pieces of the OpenMMLab tests: the stack check, micro backbones, generated data, CLI runs."""
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from official_ppma import official_layout  # noqa: F401  (the fixture; setup.cfg puts tests/ on sys.path)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "mm_configs"
TOOLS = REPO / "tools"
QUICK_DET = CONFIGS / "quickstart" / "mask_rcnn_ppma_micro_fpn_shapes.py"
QUICK_SEG = CONFIGS / "quickstart" / "upernet_ppma_micro_shapes.py"

# The smallest PPMA: one block per stage; what the CLI tests train (--cfg-options per task).
MICRO = dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))
_MICRO_BACKBONE = ["model.backbone.embed_dims=[16,32,64,128]", "model.backbone.depths=[1,1,1,1]",
                   "model.backbone.num_heads=[1,2,4,8]"]
MICRO_OPTIONS = {
    "det": _MICRO_BACKBONE + ["model.neck.in_channels=[16,32,64,128]"],
    "seg": _MICRO_BACKBONE + ["model.decode_head.in_channels=[16,32,64,128]",
                              "model.auxiliary_head.in_channels=64"],
}


@pytest.fixture(scope="session")
def shapes_root(tmp_path_factory):
    """A run folder holding ``data/shapes`` (4 training and 2 validation images, 128x128).

    The quick-start configs read ``data/shapes/`` relative to the working directory, so CLI
    runs start in this folder.
    """
    root = tmp_path_factory.mktemp("mm_run")
    subprocess.run([sys.executable, str(TOOLS / "make_shapes_dataset.py"), str(root / "data" / "shapes"),
                    "--num-train", "4", "--num-val", "2", "--size", "128", "--seed", "3"],
                   check=True, capture_output=True)
    return root


def run_tool(args, cwd, env=None, timeout=600):
    """Run a command in ``cwd``; returns the CompletedProcess (stdout and stderr merged)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=full_env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ONE_ITERATION = ["train_cfg.max_iters=1", "default_hooks.checkpoint.interval=1", "default_hooks.logger.interval=1",
                 "train_dataloader.batch_size=2"]


def train_one_iteration(config, work_dir, cwd) -> dict:
    """``tools/train.py config`` for one iteration (batch 2) in ``cwd``; checks that it trained
    (a loss logged, an optimizer step taken) and returns the checkpoint ``iter_1.pth``."""
    result = run_tool([sys.executable, TOOLS / "train.py", config, "--work-dir", work_dir,
                       "--cfg-options", *ONE_ITERATION], cwd)
    assert result.returncode == 0, result.stdout[-6000:]
    assert "Iter(train) [1/1]" in result.stdout and "loss:" in result.stdout
    state = torch.load(Path(work_dir) / "iter_1.pth", map_location="cpu")
    assert state["optimizer"]["state"], "no optimizer step was taken"
    return state


@pytest.fixture(scope="session")
def mm():
    """Paths, the micro backbone and the CLI helpers, for the test modules (which cannot import
    this conftest under ``--import-mode=importlib``)."""
    return SimpleNamespace(repo=REPO, configs=CONFIGS, tools=TOOLS, quick_det=QUICK_DET,
                           quick_seg=QUICK_SEG, micro=MICRO, micro_options=MICRO_OPTIONS,
                           run=run_tool, free_port=free_port,
                           train_one_iteration=train_one_iteration)
