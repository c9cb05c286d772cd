"""Host time of one op call through the ops' eager form against the ``torch.library`` custom op
(``ppma/ops/_custom_op.py``), side by side in one process, outputs and gradients compared.

    python tools/op_overhead.py [--repeats 2000] [--backend cpu]

On tiny tensors the kernels cost little, so the difference is the dispatch: ``rotary_qk`` on
``(1, 1, 2, 2, 4)`` tensors, no grad, forward and forward+backward, median microseconds a call.
"""
from __future__ import annotations

import argparse
from unittest import mock

import torch

from ppma.kernels.common.timing import median_seconds
from ppma.ops import registry, rotary_qk


def _inputs():
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, 2, 2, 4, generator=gen, requires_grad=True) for _ in range(2))
    return q, k, torch.randn(2, 2, 2, 2, generator=gen)


def _calls(backend: str):
    """``{pass: call}``: each call runs ``rotary_qk`` once and returns its outputs (and q, k's gradients)."""
    q, k, rotation = _inputs()

    def no_grad():
        with torch.no_grad():
            return rotary_qk(q, k, rotation, 0.5, backend=backend)

    def forward():
        return rotary_qk(q, k, rotation, 0.5, backend=backend)

    def forward_backward():
        a, b = forward()
        return a, b, *torch.autograd.grad(a.sum() + 2 * b.sum(), (q, k))

    return {"no grad": no_grad, "forward": forward, "forward+backward": forward_backward}


def _median_us(call, repeats: int) -> float:
    return 1e6 * median_seconds(call, torch.device("cpu"), repeats // 10, repeats)


def measure(backend: str = "cpu", repeats: int = 2000) -> list[tuple[str, float, float]]:
    """``[(pass, eager us, custom op us)]``; raises if the two paths' outputs differ."""
    rows = []
    for name, call in _calls(backend).items():
        eager_out = call()
        eager = _median_us(call, repeats)
        with mock.patch.object(registry, "plain_eager", lambda args: False):
            dispatched_out = call()
            dispatched = _median_us(call, repeats)
        if not all(torch.equal(a, b) for a, b in zip(eager_out, dispatched_out)):
            raise AssertionError(f"{name}: the eager form and the custom op disagree")
        rows.append((name, eager, dispatched))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tools/op_overhead.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "torch"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"rotary_qk, backend {args.backend}, median of {args.repeats} calls (outputs equal on both paths)\n")
    print("| pass | eager form us | custom op us | saved us |\n|---|---:|---:|---:|")
    for name, eager, dispatched in measure(args.backend, args.repeats):
        print(f"| {name} | {eager:.0f} | {dispatched:.0f} | {dispatched - eager:.0f} |")


if __name__ == "__main__":
    main()
