"""Resume with the configs' own data loaders: workers on (persistent or not), the default thread
count. A run killed (SIGKILL) after its first checkpoint and resumed ends bitwise equal to an
uninterrupted one: the classification quick start as shipped (2 persistent workers, epoch-based)
and the Mask R-CNN quick start with 2 persistent workers (iteration-based). In process:
:class:`~ppma.mm.runtime.WorkerSeededSampler` makes every worker's random streams a function of
``(seed, epoch, rank, worker id)``, so a resumed loader draws what the uninterrupted one drew."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

pytest.importorskip("mmpretrain")
from mmengine.dataset import DefaultSampler, worker_init_fn  # noqa: E402

from ppma.mm.runtime import EpochIndex, WorkerSeededSampler  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SEEDED = ["randomness.seed=0", "randomness.deterministic=True"]
# (config, options, first checkpoint, last checkpoint, what the resumed run logs, weights compared)
RUNS = {
    # as shipped (2 persistent workers per loader): 3 epochs of 3 iterations (12 images), drop path
    "classification": ("classification/quickstart/test_ppma_shapes.py",
                       ["train_cfg.max_epochs=3", "train_dataloader.batch_size=4", "model.drop_path_rate=0.2",
                        "default_hooks.checkpoint.max_keep_ckpts=3"],
                       "epoch_1.pth", "epoch_3.pth", "resumed epoch: 1", ("state_dict", "ema_state_dict")),
    # the shipped config loads in the main process: here with 2 persistent workers
    "detection": ("quickstart/mask_rcnn_ppma_micro_fpn_shapes.py",
                  ["train_cfg.max_iters=4", "train_cfg.val_interval=100", "train_dataloader.batch_size=2",
                   "train_dataloader.num_workers=2", "train_dataloader.persistent_workers=True",
                   "default_hooks.checkpoint.interval=2", "default_hooks.checkpoint.max_keep_ckpts=3",
                   "param_scheduler.0.end=2", "param_scheduler.1.end=4", "param_scheduler.1.T_max=4"],
                  "iter_2.pth", "iter_4.pth", "resumed epoch: 0, iter: 2", ("state_dict",)),
}


class Draws(Dataset):
    """Each item is what a worker's three generators draw for it (as random augmentations do)."""

    def __len__(self):
        return 10

    def __getitem__(self, index):
        return torch.tensor([float(index), random.random(), float(np.random.rand()), torch.rand(()).item()])


def epochs(first: int, last: int, persistent: bool, seeded: bool = True, workers: int = 2) -> list[torch.Tensor]:
    """What a fresh loader (3 batches of 4, shuffled, seed 7) yields in each epoch first..last."""
    dataset = Draws()
    inner = dict(type=DefaultSampler, shuffle=True)
    sampler = WorkerSeededSampler(dataset, inner, seed=7) if seeded else DefaultSampler(dataset, seed=7)
    init = None if seeded else lambda worker_id: worker_init_fn(worker_id, workers, 0, 7)  # mmengine's own
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers, persistent_workers=persistent,
                        worker_init_fn=init)
    out = []
    for epoch in range(first, last + 1):
        sampler.set_epoch(epoch)
        out.append(torch.cat(list(loader)))
    return out


def test_worker_streams_depend_on_the_epoch_only():
    full = epochs(0, 3, persistent=True)
    assert not torch.equal(full[2][:, 1:], full[3][:, 1:]), "every epoch draws anew"
    assert all(torch.equal(a, b) for a, b in zip(full, epochs(0, 3, persistent=False)))
    resumed = epochs(2, 3, persistent=True)
    assert all(torch.equal(a, b) for a, b in zip(full[2:], resumed))
    # without it (mmengine seeds a worker once, when it starts), a persistent worker's epoch 2
    # depends on what it drew in epochs 0 and 1, which a resumed run's fresh workers never drew
    plain = epochs(0, 3, persistent=True, seeded=False)
    assert not torch.equal(plain[2], epochs(2, 3, persistent=True, seeded=False)[0])


def test_without_workers_the_main_process_streams_are_untouched():
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    loaded = epochs(0, 0, persistent=False, workers=0)[0]
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    order = list(DefaultSampler(Draws(), seed=7))
    torch.empty((), dtype=torch.int64).random_()  # the loader's own draw of a base seed
    expected = torch.stack([Draws()[i] for i in order])
    assert torch.equal(loaded, expected)


def test_indices_carry_the_epoch_and_stay_ints():
    sampler = WorkerSeededSampler(Draws(), dict(type=DefaultSampler, shuffle=False), seed=0)
    sampler.set_epoch(4)
    indices = list(sampler)
    assert indices == list(range(10)) and len(sampler) == 10 and sampler.seed == 0
    assert all(isinstance(i, EpochIndex) and i.epoch == 4 for i in indices)
    assert [1, 2, 3][EpochIndex(1, 9)] == 2


def train(root: Path, run: str, work: str, *extra) -> subprocess.Popen:
    config, options = RUNS[run][:2]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the default thread count
    return subprocess.Popen([sys.executable, str(ROOT / "tools" / "train.py"), str(ROOT / "mm_configs" / config),
                             "--work-dir", work, *extra, "--cfg-options", *options, *SEEDED], cwd=root,
                            env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(process: subprocess.Popen) -> str:
    out, _ = process.communicate(timeout=600)
    assert process.returncode == 0, out[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_resume_with_loader_workers_is_bitwise(tmp_path, run):
    made = subprocess.run([sys.executable, str(ROOT / "tools" / "make_shapes_dataset.py"), "data/shapes",
                           "--num-train", "4", "--num-val", "1", "--size", "64", "--cls-train", "4",
                           "--cls-val", "2", "--seed", "5"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    first, last, resumed, compared = RUNS[run][2:]
    killed = train(tmp_path, run, "killed")
    latest = tmp_path / "killed" / "last_checkpoint"
    deadline = time.time() + 600
    while not latest.exists() and killed.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert killed.poll() is None, "the run ended before it could be killed"
    killed.send_signal(signal.SIGKILL)  # its loader workers see their parent die and exit
    killed.wait()
    assert latest.read_text().strip().endswith(first) and not (tmp_path / "killed" / last).exists()
    full = train(tmp_path, run, "full")
    assert resumed in finish(train(tmp_path, run, "killed", "--resume"))
    finish(full)
    a = torch.load(tmp_path / "full" / last, map_location="cpu", weights_only=False)
    b = torch.load(tmp_path / "killed" / last, map_location="cpu", weights_only=False)
    for key in compared:
        assert a[key].keys() == b[key].keys()
        different = [name for name in a[key] if not torch.equal(a[key][name], b[key][name])]
        assert not different, f"{key}: {len(different)} tensors differ, e.g. {different[:3]}"
