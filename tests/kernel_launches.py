"""Counting what a kernel launcher dispatches, for the kernel tests: Triton launches through the
kernels' autotuners, and the PyTorch kernels an :class:`~ppma.bench.step_count.OpCounter` saw."""
from __future__ import annotations

import triton

from ppma.bench.step_count import NO_KERNEL_OPS, OpCounter


class Launches:
    """Counts the Triton launches of the kernels' autotuners (the kernels run as well)."""

    def __init__(self, monkeypatch):
        self.count = 0
        run = triton.runtime.autotuner.Autotuner.run

        def counting(autotuner, *args, **kwargs):
            self.count += 1
            return run(autotuner, *args, **kwargs)

        monkeypatch.setattr(triton.runtime.autotuner.Autotuner, "run", counting)


def aten_kernels(counter: OpCounter) -> dict:
    """The counted ops that run a kernel (not views, allocations or dtype queries), less the
    interpreter's copies of the kernels' arguments (on a GPU there are none: the kernels read the
    tensors in place)."""
    others = (*NO_KERNEL_OPS, "aten::copy_", "aten::set_", "aten::new_empty", "aten::select", "aten::slice",
              "aten::view")
    return {op: n for op, n in counter.by_op.items() if op not in others}
