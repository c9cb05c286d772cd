"""Resume loses nothing: a training run (epoch- or iteration-based) killed (SIGKILL) after its
first checkpoint and resumed ends bitwise equal to an uninterrupted run; checkpoints are written
atomically."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("mmpretrain")
from mmengine.fileio import get_file_backend  # noqa: E402
from mmengine.fileio.backends import LocalBackend  # noqa: E402
from mmengine.runner import find_latest_checkpoint  # noqa: E402
from mmengine.runner.checkpoint import _load_checkpoint, save_checkpoint  # noqa: E402

from ppma.mm.runtime import AtomicLocalBackend, RandomStateHook, set_random_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NO_WORKERS = [f"{loader}.{key}" for loader in ("train_dataloader", "val_dataloader", "test_dataloader")
              for key in ("num_workers=0", "persistent_workers=False")]
SEEDED = ["randomness.seed=0", "randomness.deterministic=True", *NO_WORKERS]
# (config, options, first checkpoint, last checkpoint, what the resumed run logs, weights compared)
RUNS = {
    # epoch-based: two epochs of three iterations (12 images of 32x32), validation after each (a
    # better score saves the epoch's checkpoint again), EMA, drop path (the torch random stream)
    "classification": ("classification/quickstart/test_ppma_shapes.py",
                       ["train_cfg.max_epochs=2", "train_dataloader.batch_size=4", "model.drop_path_rate=0.2",
                        "default_hooks.checkpoint.max_keep_ckpts=3"],
                       "epoch_1.pth", "epoch_2.pth", "resumed epoch: 1", ("state_dict", "ema_state_dict")),
    # iteration-based: mmengine loads the 2 trained batches again (random flips) before iteration 3
    "detection": ("quickstart/mask_rcnn_ppma_micro_fpn_shapes.py",
                  ["train_cfg.max_iters=4", "train_cfg.val_interval=100", "train_dataloader.batch_size=2",
                   "default_hooks.checkpoint.interval=2", "default_hooks.checkpoint.max_keep_ckpts=3",
                   "param_scheduler.0.end=2", "param_scheduler.1.end=4", "param_scheduler.1.T_max=4"],
                  "iter_2.pth", "iter_4.pth", "resumed epoch: 0, iter: 2", ("state_dict",)),
}


def train(root: Path, run: str, work: str, *extra) -> subprocess.Popen:
    config, options = RUNS[run][:2]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(ROOT / "tools" / "train.py"), str(ROOT / "mm_configs" / config),
                             "--work-dir", work, *extra, "--cfg-options", *options, *SEEDED], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen) -> str:
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_resume_after_sigkill_is_bitwise_equal(tmp_path, run):
    made = subprocess.run([sys.executable, str(ROOT / "tools" / "make_shapes_dataset.py"), "data/shapes",
                           "--num-train", "4", "--num-val", "1", "--size", "64", "--cls-train", "4",
                           "--cls-val", "2", "--seed", "5"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    first, last, resumed, compared = RUNS[run][2:]
    full = train(tmp_path, run, "full")
    killed = train(tmp_path, run, "killed")
    latest = tmp_path / "killed" / "last_checkpoint"
    deadline = time.time() + 300
    while not latest.exists() and killed.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert killed.poll() is None, "the run ended before it could be killed"
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert latest.read_text().strip().endswith(first) and not (tmp_path / "killed" / last).exists()
    assert resumed in finish(train(tmp_path, run, "killed", "--resume"))
    finish(full)
    a = torch.load(tmp_path / "full" / last, map_location="cpu", weights_only=False)
    b = torch.load(tmp_path / "killed" / last, map_location="cpu", weights_only=False)
    for key in compared:
        assert a[key].keys() == b[key].keys()
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), f"{key} {name}"


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
