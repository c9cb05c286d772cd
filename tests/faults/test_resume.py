"""Resume loses nothing: a training run (epoch- or iteration-based) killed (SIGKILL) after its
first checkpoint and resumed ends bitwise equal to an uninterrupted run, with the loaders in the
main process (one thread) and with loader workers as the configs ship them (persistent, the
default thread count); checkpoints are written atomically. In process:
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
from mmengine.fileio import get_file_backend  # noqa: E402
from mmengine.fileio.backends import LocalBackend  # noqa: E402
from mmengine.runner import find_latest_checkpoint  # noqa: E402
from mmengine.runner.checkpoint import _load_checkpoint, save_checkpoint  # noqa: E402

from ppma.mm.runtime import (  # noqa: E402
    AtomicLocalBackend,
    EpochIndex,
    RandomStateHook,
    WorkerSeededSampler,
    set_random_state,
)

ROOT = Path(__file__).resolve().parents[2]
SEEDED = ["randomness.seed=0", "randomness.deterministic=True"]
NO_WORKERS = [f"{loader}.{key}" for loader in ("train_dataloader", "val_dataloader", "test_dataloader")
              for key in ("num_workers=0", "persistent_workers=False")]
ONE_THREAD, DEFAULT_THREADS = {"OMP_NUM_THREADS": "1"}, {}
# (config, options, what the resumed run logs, weights compared)
RUNS = {
    # epoch-based: three iterations per epoch (12 images of 32x32), validation after each (a better
    # score saves the epoch's checkpoint again), EMA, drop path (the torch random stream)
    "classification": ("classification/quickstart/test_ppma_shapes.py",
                       ["train_dataloader.batch_size=4", "model.drop_path_rate=0.2",
                        "default_hooks.checkpoint.max_keep_ckpts=3"],
                       "resumed epoch: 1", ("state_dict", "ema_state_dict")),
    # iteration-based: mmengine loads the 2 trained batches again (random flips) before iteration 3
    "detection": ("quickstart/mask_rcnn_ppma_micro_fpn_shapes.py",
                  ["train_cfg.max_iters=4", "train_cfg.val_interval=100", "train_dataloader.batch_size=2",
                   "default_hooks.checkpoint.interval=2", "default_hooks.checkpoint.max_keep_ckpts=3",
                   "param_scheduler.0.end=2", "param_scheduler.1.end=4", "param_scheduler.1.T_max=4"],
                  "resumed epoch: 0, iter: 2", ("state_dict",)),
}
# (run, loader options, thread environment, first checkpoint, last checkpoint)
CASES = {
    "classification-no_workers": ("classification", ["train_cfg.max_epochs=2", *NO_WORKERS], ONE_THREAD,
                                  "epoch_1.pth", "epoch_2.pth"),
    # as shipped (2 persistent workers per loader), 3 epochs
    "classification-workers": ("classification", ["train_cfg.max_epochs=3"], DEFAULT_THREADS,
                               "epoch_1.pth", "epoch_3.pth"),
    "detection-no_workers": ("detection", NO_WORKERS, ONE_THREAD, "iter_2.pth", "iter_4.pth"),
    # the shipped config loads in the main process: here with 2 persistent workers
    "detection-workers": ("detection", ["train_dataloader.num_workers=2", "train_dataloader.persistent_workers=True"],
                          DEFAULT_THREADS, "iter_2.pth", "iter_4.pth"),
}


def train(root: Path, case: str, work: str, *extra) -> subprocess.Popen:
    run, loaders, threads = CASES[case][:3]
    config, options = RUNS[run][:2]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.Popen([sys.executable, str(ROOT / "tools" / "train.py"), str(ROOT / "mm_configs" / config),
                             "--work-dir", work, *extra, "--cfg-options", *options, *loaders, *SEEDED], cwd=root,
                            env={**env, **threads, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(process: subprocess.Popen) -> str:
    out, _ = process.communicate(timeout=600)
    assert process.returncode == 0, out[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_resume_after_sigkill_is_bitwise_equal(tmp_path, case):
    made = subprocess.run([sys.executable, str(ROOT / "tools" / "make_shapes_dataset.py"), "data/shapes",
                           "--num-train", "4", "--num-val", "1", "--size", "64", "--cls-train", "4",
                           "--cls-val", "2", "--seed", "5"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    run, _, _, first, last = CASES[case]
    resumed, compared = RUNS[run][2:]
    killed = train(tmp_path, case, "killed")
    latest = tmp_path / "killed" / "last_checkpoint"
    deadline = time.time() + 600
    while not latest.exists() and killed.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert killed.poll() is None, "the run ended before it could be killed"
    # The whole job, as a scheduler kills it: loader workers whose parent alone is killed can wait
    # forever at exit for it to take the tensors they sent (their processes outlived the suite).
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.killpg(killed.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("a process of the killed run outlived it")
    assert latest.read_text().strip().endswith(first) and not (tmp_path / "killed" / last).exists()
    full = train(tmp_path, case, "full")
    assert resumed in finish(train(tmp_path, case, "killed", "--resume"))
    finish(full)
    a = torch.load(tmp_path / "full" / last, map_location="cpu", weights_only=False)
    b = torch.load(tmp_path / "killed" / last, map_location="cpu", weights_only=False)
    for key in compared:
        assert a[key].keys() == b[key].keys()
        different = [name for name in a[key] if not torch.equal(a[key][name], b[key][name])]
        assert not different, f"{key}: {len(different)} tensors differ, e.g. {different[:3]}"


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


def test_a_checkpoint_saved_during_validation_keeps_the_training_streams():
    # mmengine saves the latest checkpoint again after validation when the best score improves
    hook, saved, during_val = RandomStateHook(), {}, {}
    torch.manual_seed(3)
    hook.before_val(None)
    expected = torch.rand(4)
    torch.rand(7)  # validation draws (its loader's seed)
    hook.before_save_checkpoint(None, during_val)
    hook.after_val(None)
    hook.before_save_checkpoint(None, saved)
    for checkpoint in (during_val, saved):
        set_random_state(checkpoint["random_state"])
        assert torch.equal(torch.rand(4), expected)


def test_a_kill_during_a_save_leaves_the_previous_checkpoint_to_resume_from(tmp_path, monkeypatch):
    # mmengine writes <step>.pth, then last_checkpoint; it saves the latest one again (the same
    # name) when validation improves the best score: a kill then must not truncate it
    path = tmp_path / "epoch_1.pth"
    assert isinstance(get_file_backend(str(path)), AtomicLocalBackend)
    weights = {"w": torch.arange(6.0)}
    save_checkpoint({"state_dict": weights, "meta": {"epoch": 1}}, str(path))
    get_file_backend(str(path)).put_text(str(path), tmp_path / "last_checkpoint")

    def killed(self, obj, filepath, *args):  # the process dies half-way through writing
        Path(filepath).write_bytes(obj[: len(obj) // 2] if isinstance(obj, bytes) else obj[:3].encode())
        raise SystemExit("killed")

    monkeypatch.setattr(LocalBackend, "put", killed)
    monkeypatch.setattr(LocalBackend, "put_text", killed)
    with pytest.raises(SystemExit):
        save_checkpoint({"state_dict": weights, "meta": {"epoch": 1, "best": 0.5}}, str(path))
    with pytest.raises(SystemExit):
        get_file_backend(str(path)).put_text(str(tmp_path / "epoch_2.pth"), tmp_path / "last_checkpoint")
    monkeypatch.undo()
    latest = find_latest_checkpoint(str(tmp_path))  # what --resume picks
    assert latest == str(path)
    resumed = _load_checkpoint(latest, map_location="cpu")
    assert resumed["meta"] == {"epoch": 1} and torch.equal(resumed["state_dict"]["w"], weights["w"])


def test_set_epoch_is_the_inner_samplers_where_it_has_one():
    class NoEpochs(torch.utils.data.Sampler):
        def __init__(self, dataset, seed=None):
            self.dataset = dataset

        def __iter__(self):
            return iter(range(len(self.dataset)))

        def __len__(self):
            return len(self.dataset)

    assert hasattr(WorkerSeededSampler(Draws(), dict(type=DefaultSampler), seed=0), "set_epoch")
    sampler = WorkerSeededSampler(Draws(), dict(type=NoEpochs), seed=0)
    assert not hasattr(sampler, "set_epoch")  # mmengine's loops call it only where it exists
    assert [(i, i.epoch) for i in sampler] == [(i, 0) for i in range(10)]
