"""Mixed precision over many steps: every family's test preset trains 200 steps on the shapes
classification data (tools/make_shapes_dataset.py's images, made in memory) at lr 1e-3 under
fp16 autocast with a ``GradScaler`` and under bf16 autocast, on the CPU: every loss and every
weight stays finite, the scaler does not collapse, and the loss falls."""
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F

from ppma.models.family import families

TOOL = Path(__file__).resolve().parents[2] / "tools" / "make_shapes_dataset.py"
PRESETS = [family.test_preset for family in families()]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
STEPS, BATCH, SIZE = 200, 8, 32  # 32 x 32 images: about 0.1 s a step on one thread


def shapes_images(count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` images ``(count, 3, SIZE, SIZE)``, normalized as the presets expect, and labels:
    one shape each, classes in turn, drawn as ``write_classification`` draws them."""
    spec = importlib.util.spec_from_file_location("make_shapes_dataset", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for index in range(count):
        label = index % len(tool.SHAPES)
        radius = rng.uniform(0.2, 0.4) * SIZE
        cx, cy = rng.uniform(radius + 1, SIZE - radius - 1, size=2)
        image, _, _ = tool.render(rng, SIZE, [(tool.SHAPES[label], cx, cy, radius, rng.uniform(0, 2 * math.pi))])
        images.append(image)
        labels.append(label)
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    return (x - mean[:, None, None]) / std[:, None, None], torch.tensor(labels)


@pytest.fixture(scope="module")
def shapes():
    return shapes_images(48)


@pytest.fixture
def one_thread():
    """One intra-op thread: the test presets' ops are small, and on a busy machine every parallel
    region of two threads may wait for a time slice (10x slower steps)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", PRESETS)
def test_mixed_precision_training_stays_finite_and_learns(name, dtype, shapes, one_thread):
    images, labels = shapes
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=3).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == "fp16")
    order = torch.randperm(STEPS * BATCH, generator=torch.Generator().manual_seed(1)) % len(labels)
    losses, skipped = [], 0
    for step in range(STEPS):
        batch = order[step * BATCH:(step + 1) * BATCH]
        with torch.autocast("cpu", dtype=DTYPES[dtype]):
            loss = F.cross_entropy(model(images[batch]), labels[batch])
        assert torch.isfinite(loss), f"step {step}: loss {loss.item()}"
        optimizer.zero_grad(set_to_none=True)
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        skipped += scaler.is_enabled() and scaler.get_scale() < scale  # an overflow skipped the step
        losses.append(loss.item())
    for key, value in model.state_dict().items():
        assert torch.isfinite(value).all(), key
    assert skipped < STEPS // 10, f"{skipped} of {STEPS} steps overflowed"
    first, last = np.mean(losses[:20]), np.mean(losses[-20:])
    assert last < 0.8 * first, f"the loss did not fall: {first:.3f} over the first 20 steps, {last:.3f} the last 20"
