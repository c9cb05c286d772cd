"""The vanilla kernels' launchers: their line scans of the decays (:mod:`ppma.kernels.polyline_attention.decays`)
against PyTorch's, and how many kernels a forward and a backward dispatch.

On the CPU through Triton's interpreter (``TRITON_INTERPRET=1``), as the other kernel tests.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need the 'triton' package")

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
    pytest.skip(
        "Triton kernels need a CUDA device or TRITON_INTERPRET=1 (CPU interpreter)", allow_module_level=True
    )

from kernel_launches import Launches, aten_kernels  # noqa: E402

from ppma.bench.step_count import OpCounter  # noqa: E402
from ppma.kernels.polyline_attention import decays, vanilla  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (B, heads, [T,] H, W): odd sizes, lines of one step, a grid longer than a block of 32 steps
GRIDS = [(2, 3, 7, 9), (1, 1, 1, 6), (1, 2, 5, 1), (2, 1, 3, 4, 5), (1, 1, 40, 70), (1, 2, 2, 33, 3)]


def _log_decays(shape):
    return [-torch.rand(shape, device=DEVICE) * 3 for _ in range(len(shape) - 2)]


@pytest.mark.parametrize("shape", GRIDS, ids=lambda s: "x".join(map(str, s)))
def test_cumulative_decays_are_cumulative_sums_along_each_axis(shape):
    torch.manual_seed(0)
    logs = _log_decays(shape)
    log_gamma = logs[2] if len(logs) == 3 else None
    got = decays.cumulative_decays(logs[0], logs[1], log_gamma)
    want = [(-logs[axis]).cumsum(-1 - axis).flatten(2).flatten(0, 1) for axis in range(len(logs))]
    want += want[1:2] * (3 - len(want))  # a 2-D grid's Gc is Gb
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("shape", GRIDS, ids=lambda s: "x".join(map(str, s)))
def test_decay_gradients_are_reverse_sums_of_the_slots(shape):
    torch.manual_seed(1)
    logs = _log_decays(shape)
    log_gamma = logs[2] if len(logs) == 3 else None
    dg = torch.randn(5, 3, shape[0] * shape[1], math.prod(shape[2:]), device=DEVICE)
    got = decays.decay_gradients(dg, logs[0], log_gamma)
    total = dg.double().sum(0).view(3, *shape)
    assert len(got) == len(logs)
    for axis, g in enumerate(got):
        want = -total[axis].flip(-1 - axis).cumsum(-1 - axis).flip(-1 - axis).float()  # reverse sums
        want.select(-1 - axis, 0).zero_()
        assert g.shape == shape and g.is_contiguous() and g.dtype == torch.float32
        assert (g.select(-1 - axis, 0) == 0).all()
        torch.testing.assert_close(g, want, rtol=1e-6, atol=1e-5)
    assert len({g.data_ptr() for g in got}) == len(got)  # separate tensors: a custom op's outputs may not alias


@pytest.mark.parametrize("case", ["official", "paper", "linear", "official 3d"])
def test_launchers_dispatch_few_kernels(case, monkeypatch):
    """Forward: the cumulative decays and the forward kernel. Backward: the statistics, the
    cumulative decays, the two passes and the decay gradients, and one zero fill (the decay
    slots); no PyTorch arithmetic between them (it dispatched 4 kernels forward and 28 backward)."""
    torch.manual_seed(2)
    grid = (2, 3, 4) if case.endswith("3d") else (5, 7)
    q, k, v = (torch.rand(2, 2, *grid, 16, device=DEVICE) for _ in range(3))
    logs = _log_decays((2, 2, *grid))
    log_gamma = logs[2] if len(logs) == 3 else None
    launches = Launches(monkeypatch)
    with OpCounter() as forward:
        if case == "linear":
            out, num = vanilla.linear_attention_quadratic_fwd(q, k, v, logs[0], logs[1], log_gamma)
        else:
            out, residuals = vanilla.vanilla_attention_fwd(q, k, v, logs[0], logs[1], log_gamma, case.split()[0])
    assert (launches.count, aten_kernels(forward)) == (2, {})
    launches.count, grad = 0, torch.randn_like(out)
    with OpCounter() as backward:
        if case == "linear":
            vanilla.linear_attention_quadratic_bwd(grad, num, q, k, v, logs[0], logs[1], log_gamma)
        else:
            vanilla.vanilla_attention_bwd(grad, out, residuals, q, k, v, logs[0], logs[1], log_gamma, case.split()[0])
    assert (launches.count, aten_kernels(backward)) == (5, {"aten::zeros": 1})
