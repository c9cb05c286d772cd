"""Random odd sizes (H != W, 32..257) and batches 1..3 on every family's test preset: forward and
backward finite, ``features_only`` maps at the family's documented sizes; the ops' ``torch`` and
``triton`` backends agree on the calls of such a forward."""
import math
import random

import pytest
import timm
import torch

import ppma  # noqa: F401  (registers the presets)
from ppma.kernels.common.runtime import triton_unavailable_reason
from ppma.models.family import families, family_of
from ppma.models.plain import PlainBackbone
from ppma.ops.registry import Op

FAMILIES = [f.test_preset for f in families()]
DRAWS = 2  # per family: a handful in all, the suite stays fast


def _draws(name: str) -> list[tuple[int, int, int]]:
    rng = random.Random(f"shape-fuzz-{name}")  # fixed per family
    out = []
    while len(out) < DRAWS:
        h, w = rng.randrange(33, 258, 2), rng.randrange(33, 258, 2)  # odd
        if h != w:
            out.append((rng.randint(1, 3), h, w))
    return out


def _expected(model, name: str, h: int, w: int) -> list[tuple[int, int]]:
    """Hierarchical families: ``ceil(size / s)`` (docs/models.md). Plain ones (Vim): tokens
    ``floor(size / p)`` (patch ``p``), the pyramid scales them by ``p / s``, pooling with floor
    (docs/vim.md)."""
    strides = [f["reduction"] for f in model.feature_info.get_dicts()]
    if not issubclass(family_of(name).model_class, PlainBackbone):
        return [(math.ceil(h / s), math.ceil(w / s)) for s in strides]
    p = timm.create_model(name).stem.proj.stride[0]
    gh, gw = h // p, w // p
    return [(gh * p // s, gw * p // s) if s <= p else (gh // (s // p), gw // (s // p)) for s in strides]


@pytest.mark.parametrize("name", FAMILIES)
def test_random_shapes(name):
    torch.manual_seed(0)
    model = timm.create_model(name, features_only=True)
    for b, h, w in _draws(name):
        x = torch.randn(b, 3, h, w, requires_grad=True)
        feats = model(x)
        assert [tuple(f.shape[-2:]) for f in feats] == _expected(model, name, h, w), (b, h, w)
        assert all(f.shape[0] == b and torch.isfinite(f).all() for f in feats), (b, h, w)
        sum(f.square().mean() for f in feats).backward()
        assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0, (b, h, w)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        model.zero_grad()


@pytest.mark.parametrize("name", FAMILIES)
def test_random_shapes_torch_and_triton_agree_on_every_op_call(name, monkeypatch):
    """Every op call of a forward at a random odd size, replayed on the ``torch`` and ``triton``
    backends (Triton's interpreter on the CPU): equal outputs. Smaller sizes than above (33..97),
    as the interpreter is slow. A family whose forward calls no op with a Triton kernel (MILA)
    is skipped, naming it."""
    if triton_unavailable_reason("cpu") is not None:
        pytest.skip(triton_unavailable_reason("cpu"))
    calls = []
    run = Op.__call__
    monkeypatch.setattr(Op, "__call__", lambda op, *args, backend: calls.append((op, args)) or run(op, *args, backend=backend))
    rng = random.Random(f"shape-fuzz-ops-{name}")
    h, w = rng.randrange(33, 98, 2), rng.randrange(33, 98, 2)
    torch.manual_seed(0)
    with torch.no_grad():
        timm.create_model(name, features_only=True)(torch.randn(rng.randint(1, 3), 3, h, w))
    replayed = [(op, args) for op, args in calls if op.kernel("triton") is not None]
    if not replayed:
        pytest.skip(f"{name} calls no op with a Triton kernel")
    for op, args in replayed:
        want, got = (run(op, *args, backend=backend) for backend in ("torch", "triton"))
        for g, e in zip(*(t if isinstance(t, tuple) else (t,) for t in (got, want))):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=lambda m, op=op: f"{op.name} at {h}x{w}: {m}")
