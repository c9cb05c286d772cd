"""The report's first section: compile the kernels in parallel processes before anything is timed.

On a machine that has never compiled them, the first launch of each kernel variant compiles every
configuration its autotuner keeps, one after another on one CPU core (seconds each): on a fresh
H100 with Triton 3.6 the correctness section spent its 100 s on ``ppma_tiny``'s first three
cases and every later section stopped at its limit while compiling. Compiling is CPU work and
Triton keeps what it compiles in an on-disk cache that every process shares, so this section runs
the later sections' passes once each, one (preset, :data:`CASES` entry) a process, and each kernel
script of the kernel tables once with one timed run, as many processes at a time as the machine's
cores and the GPU's memory allow. The sections then load compiled kernels; their autotuners
still time the configurations in the report's own process.
At the section's limit the processes still running are killed; what they compiled stays cached.

A worker process (what :func:`warm_up` starts)::

    python -m ppma.bench.gpu.warm_up PRESET CASE --device cuda --size H W --infer-batch 128 \\
        --train-batch 64 --backbone-sizes 1024 1280
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .correctness import BATCH, DTYPES, forward_backward, odd_size, tf32_disabled
from .kernel_tables import kill_group
from .throughput import inference_step, training_step

# What each case runs once, as the section that times or checks it does (``auto`` backend):
CASES = {
    "fp32": "the correctness section's fp32 forward and backward (TF32 off)",
    "bf16": "its bf16-autocast forward and backward",
    "fp16": "its fp16-autocast forward and backward",
    "odd": "its fp32 forward and backward at the odd size, batch 1",
    "speed": "a bf16 inference call at --infer-batch and a training step at --train-batch",
    "backbone": "a bf16 inference call of the features_only backbone at each --backbone-sizes, batch 1",
}
GIB_PER_PROCESS = 4  # GPU memory a worker may need (a training step of a tiny preset at batch 64)


@dataclass(frozen=True)
class WarmTask:
    """One worker: a preset and a case of :data:`CASES`, or a kernel script (case ``'script'``)."""

    name: str
    case: str


@dataclass(frozen=True)
class WarmResult:
    """How a worker ended: ``'done'``, ``'failed: <its last error line>'``, ``'killed at the
    section's limit'`` or ``'not started'``; its seconds."""

    name: str
    case: str
    seconds: float
    status: str


def tasks(tiny: tuple[str, ...], others: tuple[str, ...], scripts: tuple[str, ...], quick: bool) -> list[WarmTask]:
    """The workers, those whose kernels the most later work shares first: the ``tiny`` presets'
    fp32, bf16 and fp16 passes, the kernel ``scripts``, the tiny presets' speed and backbone runs,
    every preset's odd size, then the ``others``' (``test_*``) passes, which mostly find their
    kernels compiled. Quick mode (the CPU test): each preset's fp32 pass."""
    if quick:
        return [WarmTask(p, "fp32") for p in tiny]
    first = [WarmTask(p, c) for c in ("fp32", "bf16", "fp16") for p in tiny] + [WarmTask(s, "script") for s in scripts]
    return (first + [WarmTask(p, c) for c in ("speed", "backbone") for p in tiny]
            + [WarmTask(p, "odd") for p in tiny + others]
            + [WarmTask(p, c) for c in ("fp32", "bf16", "fp16") for p in others])


def parallel_processes(device: torch.device, count: int) -> int:
    """How many workers at a time: one a CPU core, at most :data:`GIB_PER_PROCESS` of free GPU
    memory each, at most ``count``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = cores
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        limit = min(limit, free // (GIB_PER_PROCESS * 2**30))
    return max(1, min(limit, count))


def worker_command(task: WarmTask, args: list[str]) -> list[str]:
    """The command of a preset's worker: ``python -m ppma.bench.gpu.warm_up PRESET CASE *args``."""
    return [sys.executable, "-m", __name__, task.name, task.case, *args]


def warm_up(work: list[WarmTask], command: Callable[[WarmTask], list[str]], seconds: float,
            processes: int) -> list[WarmResult]:
    """Run the workers of ``work`` (each ``command(task)``), ``processes`` at a time, for at most
    ``seconds``; returns one result per task, in ``work``'s order (``'not started'`` for those the
    limit came before)."""
    end = time.monotonic() + seconds
    pending, running, results = list(work), {}, {}
    with tempfile.TemporaryDirectory() as logs:
        try:
            while (pending or running) and time.monotonic() < end:
                while pending and len(running) < processes:
                    task = pending.pop(0)
                    log = open(os.path.join(logs, f"{work.index(task)}.log"), "w+b")  # noqa: SIM115
                    process = subprocess.Popen(command(task), stdout=subprocess.DEVNULL, stderr=log,
                                               start_new_session=True)
                    running[task] = (process, log, time.monotonic())
                for task, (process, log, start) in list(running.items()):
                    if process.poll() is not None:
                        results[task] = WarmResult(task.name, task.case, time.monotonic() - start,
                                                   "done" if process.returncode == 0 else f"failed: {last_line(log)}")
                        log.close()
                        del running[task]
                time.sleep(0.2)
        finally:  # the limit, or the section's own timer: leave no process behind
            for process, _, _ in running.values():  # every group killed before the first wait, so
                kill_group(process)                  # that a timer firing during the waits leaves none
            for task, (process, log, start) in running.items():
                process.wait()
                log.close()
                results[task] = WarmResult(task.name, task.case, time.monotonic() - start, "killed at the section's limit")
    return [results.get(t, WarmResult(t.name, t.case, 0.0, "not started")) for t in work]


def last_line(log) -> str:
    """The last non-empty line a worker wrote to ``log`` (its error)."""
    log.seek(0)
    lines = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "no output"


def run_case(preset: str, case: str, device: torch.device, size: tuple[int, int], infer_batch: int,
             train_batch: int, backbone_sizes: tuple[int, ...]) -> None:
    """Run ``case`` (:data:`CASES`) of ``preset`` once on ``device``."""
    import timm

    import ppma.models  # noqa: F401  (registers the presets)

    torch.manual_seed(0)
    if case == "backbone":
        model = timm.create_model(preset, features_only=True).to(device).eval()
        for side in backbone_sizes:
            inference_step(model, torch.randn(1, 3, side, side, device=device))()
        return
    model = timm.create_model(preset).to(device)
    if case == "speed":
        inference_step(model.eval(), torch.randn(infer_batch, 3, *size, device=device))()
        training_step(model.train(), torch.randn(train_batch, 3, *size, device=device))()
        return
    model.eval()
    shape = (1, 3, *odd_size(*size)) if case == "odd" else (BATCH, 3, *size)
    with tf32_disabled() if case in ("fp32", "odd") else contextlib.nullcontext():
        forward_backward(model, torch.randn(shape, device=device), "auto", DTYPES.get(case))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ppma.bench.gpu.warm_up", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset")
    parser.add_argument("case", choices=tuple(CASES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", type=int, nargs=2, required=True, metavar=("H", "W"))
    parser.add_argument("--infer-batch", type=int, default=128)
    parser.add_argument("--train-batch", type=int, default=64)
    parser.add_argument("--backbone-sizes", type=int, nargs="+", default=[1024, 1280])
    args = parser.parse_args(argv)
    run_case(args.preset, args.case, torch.device(args.device), tuple(args.size), args.infer_batch,
             args.train_batch, tuple(args.backbone_sizes))


if __name__ == "__main__":
    main()
