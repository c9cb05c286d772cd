"""Focused H100 check: ppma_tiny (auto) against the official PPMA-T, one process, no other work."""
import time

import timm
import torch

import ppma.models  # noqa: F401
from ppma.bench.gpu.official import official_models
from ppma.bench.gpu.step_profile import profile_step
from ppma.bench.gpu.throughput import Repeats, model_speed, training_step

t0 = time.time()
dev = torch.device("cuda")


def log(*a):
    print(f"[{time.time() - t0:6.1f} s]", *a, flush=True)


official = official_models(".official/ppma", None)[0]
ours = ("ppma_tiny", lambda: timm.create_model("ppma_tiny"), "auto")
theirs = ("official PPMA-T", official.build, "-")
log("start")
for label, build, backend in (ours, theirs, ours, theirs):
    log(model_speed(label, build, backend, dev, (224, 224), 128, 64, Repeats(2, 5)))
for label, build, _ in (ours, theirs):
    torch.manual_seed(0)
    model = build().to(dev).train()
    p = profile_step(label, training_step(model, torch.randn(64, 3, 224, 224, device=dev)), dev, 2, 5, 8)
    log(label, f"step {p.step_ms:.1f} ms, host {p.host.ms:.1f} ms, syncs {p.host.syncs},",
        f"launches {p.summary.launches:.0f}, kernel {p.summary.kernel_ms:.1f} ms")
    for k in p.summary.top:
        log("  ", k)
    for k in p.host.runtime:
        log("  ", k)
log("done")
