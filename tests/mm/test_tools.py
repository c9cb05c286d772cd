"""The CLI proof on generated data: train one iteration, resume, test; a 2-process gloo run;
configs that must fail with a message naming the problem; FLOPs and benchmark tools."""
import json
import sys

import pytest
import torch

pytest.importorskip("mmdet", reason="mmdet is not installed (pip install 'ppma[mm]'); CI installs it")
pytest.importorskip("mmseg", reason="mmseg is not installed (pip install 'ppma[mm]'); CI installs it")
import ppma.mm  # noqa: E402,F401  (allows the checkpoint globals for torch.load below)

FAST = ["default_hooks.checkpoint.interval=1", "default_hooks.logger.interval=1",
        "train_dataloader.batch_size=2"]


def train(mm, cwd, task, work_dir, iters, *args, options=()):
    config = mm.quick_det if task == "det" else mm.quick_seg
    cmd = [sys.executable, mm.tools / "train.py", config, "--work-dir", work_dir, *args,
           "--cfg-options", f"train_cfg.max_iters={iters}", *FAST, *mm.micro_options[task], *options]
    return mm.run(cmd, cwd)


def check(result):
    assert result.returncode == 0, result.stdout[-6000:]
    return result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("task", ["det", "seg"])
def test_train_resume_test(mm, shapes_root, task):
    work = shapes_root / f"work_{task}"
    out = check(train(mm, shapes_root, task, work, 1))
    assert "Iter(train) [1/1]" in out and "loss:" in out
    first = torch.load(work / "iter_1.pth", map_location="cpu")  # weights_only, as resume does
    assert first["optimizer"]["state"], "no optimizer step was taken"

    out = check(train(mm, shapes_root, task, work, 2, "--resume"))
    assert "resumed" in out.lower() and "Iter(train) [2/2]" in out
    second = torch.load(work / "iter_2.pth", map_location="cpu")
    changed = [k for k, v in second["state_dict"].items()
               if v.is_floating_point() and not torch.equal(v, first["state_dict"][k])]
    assert any(k.startswith("backbone.model.stages") for k in changed)

    config = mm.quick_det if task == "det" else mm.quick_seg
    out = check(mm.run([sys.executable, mm.tools / "test.py", config, work / "iter_2.pth",
                        "--work-dir", work / "test", "--cfg-options", *mm.micro_options[task]], shapes_root))
    metrics = json.loads(out.strip().splitlines()[-1])
    wanted = ("coco/bbox_mAP", "coco/segm_mAP") if task == "det" else ("mIoU",)
    for key in wanted:
        assert 0.0 <= metrics[key] <= 100.0, metrics


@pytest.mark.slow
def test_train_compiled(mm, shapes_root):
    """``--compile aot_eager``: the backbone's forward is compiled (aot_eager: tracing and AOTAutograd
    without Inductor's code generation, which takes minutes on the CPU) and trains through it."""
    out = check(train(mm, shapes_root, "seg", shapes_root / "work_compiled", 1, "--compile", "aot_eager"))
    assert "backbone forward compiled with torch.compile (backend aot_eager)" in out and "Iter(train) [1/1]" in out and "loss:" in out


@pytest.mark.slow
def test_distributed_gloo_run(mm, shapes_root):
    work = shapes_root / "work_dist"
    cmd = ["bash", mm.tools / "dist_train.sh", mm.quick_seg, "2", "--work-dir", work,
           "--cfg-options", "train_cfg.max_iters=2", *FAST, *mm.micro_options["seg"]]
    out = check(mm.run(cmd, shapes_root, env={"PORT": str(mm.free_port()), "OMP_NUM_THREADS": "1"}))
    assert "Distributed training: True" in out and "Iter(train) [2/2]" in out
    assert (work / "iter_2.pth").is_file()


def test_unknown_backbone_argument_fails(mm, shapes_root):
    result = train(mm, shapes_root, "seg", shapes_root / "work_bad", 1,
                   options=["model.backbone.bogus_width=3"])
    assert result.returncode != 0
    assert "bogus_width" in result.stdout


def test_mismatched_checkpoint_fails(mm, shapes_root, tmp_path):
    wide = dict(mm.micro, embed_dims=(24, 32, 64, 128))
    import timm

    torch.save({"model": timm.create_model("ppma_tiny", **wide).state_dict()}, tmp_path / "wide.pth")
    result = train(mm, shapes_root, "det", shapes_root / "work_bad", 1, options=[
        "model.backbone.init_cfg.type=Pretrained",
        f"model.backbone.init_cfg.checkpoint={tmp_path / 'wide.pth'}"])
    assert result.returncode != 0
    assert "does not fit 'ppma_tiny'" in result.stdout and "size mismatch for stem.conv1.weight" in result.stdout


def test_flops_and_benchmark(mm, shapes_root):
    out = check(mm.run([sys.executable, mm.tools / "get_flops.py", mm.quick_seg, "--shape", "64", "96"],
                       shapes_root))
    assert "backbone" in out and "GFLOPs" in out
    out = check(mm.run([sys.executable, mm.tools / "benchmark.py", mm.quick_det, "--shape", "64", "64",
                        "--warmup", "1", "--iters", "2"], shapes_root))
    assert "images/s" in out
