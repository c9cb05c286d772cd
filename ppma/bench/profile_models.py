"""CPU profile of timm presets: time per ``ppma.ops`` backend, top ops, time per layer type, peak RSS.

    python tools/profile_models.py ppma_tiny vmamba_tiny [--size 224 224] [--batch-size 8]
        [--features] [--threads 2] [--backends torch auto] [--repeats 5] [--top 12] [--rss] [--compare]
    python tools/profile_models.py ppma_tiny vmamba_tiny vim_tiny mila_tiny --count [--size 64 64]
        [--batch-size 1] [--autocast bf16] [--paths gpu]

Per model, in one process: inference (``torch.inference_mode``) on random inputs, the backends of
``--backends`` (``PPMA_BACKEND``: ``torch``, the plain reference of every op, ``auto``, the CPU
kernels where an op has one, or ``triton``, the Triton kernels: under ``TRITON_INTERPRET=1`` on a
CPU, for ``--count``) interleaved ``--repeats`` times after one warm-up each; prints
each backend's median seconds and its ratio to the first backend's. ``--compare``: the models
timed against each other instead, all built first and every (model, backend) run interleaved,
ratios to the first model's first backend (no profile). Else, per model, on the last backend,
one run under ``torch.profiler`` (the ``--top`` ops by self CPU time) and one with forward hooks
(inclusive seconds per module class, summed over the modules of that class that are not inside
another module of the same class). ``--rss``: instead, the peak resident set size increase of one
forward per backend, each in a fresh subprocess (the peak over the forward minus the RSS before).
``--count``: instead, per model and backend, one training step counted by
:func:`ppma.bench.step_count.count_training_step` (aten ops, copies and their bytes, optimizer
tensors; per step, nearly independent of ``--size``), ``--paths`` choosing the layer arrangement.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from .gpu import correctness
from .step_count import add_step_arguments, count_training_step, step_autocast


def build(name: str, features: bool):
    import timm

    import ppma  # noqa: F401  (registers the presets)

    kwargs = {"features_only": True} if features else {}
    return timm.create_model(name, **kwargs).eval()


def run_once(model, x, backend: str | None) -> float:
    """Seconds of one inference forward of ``model`` on ``x`` with ``PPMA_BACKEND=backend`` (None:
    the environment as it is, e.g. for a model that calls no ``ppma.ops``)."""
    with correctness.backend(backend) if backend else contextlib.nullcontext():
        start = time.perf_counter()
        with torch.inference_mode():
            model(x)
        return time.perf_counter() - start


def interleaved_medians(cases: dict, repeats: int) -> dict:
    """Median seconds of each ``(model, x, backend)`` of ``cases`` (key -> case, ``backend`` as
    :func:`run_once` takes it): one warm-up each, then ``repeats`` rounds that run every case once."""
    for case in cases.values():
        run_once(*case)
    times = collections.defaultdict(list)
    for _ in range(repeats):
        for key, case in cases.items():
            times[key].append(run_once(*case))
    return {key: statistics.median(t) for key, t in times.items()}


def top_ops(model, x, backend, top) -> str:
    from torch.profiler import ProfilerActivity, profile

    with correctness.backend(backend), torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def layer_times(model, x, backend) -> dict[str, float]:
    """Inclusive seconds per module class (outermost instances only, so nothing counts twice)."""
    totals, open_calls, started = collections.Counter(), collections.Counter(), {}

    def pre(module, args):
        name = type(module).__name__
        open_calls[name] += 1
        if open_calls[name] == 1:
            started[name] = time.perf_counter()

    def post(module, args, out):
        name = type(module).__name__
        open_calls[name] -= 1
        if open_calls[name] == 0:
            totals[name] += time.perf_counter() - started[name]

    handles = [h for m in model.modules() if m is not model
               for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    try:
        run_once(model, x, backend)
    finally:
        for h in handles:
            h.remove()
    return dict(totals.most_common())


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_increase(args, name, backend) -> float:
    """GB: this process's peak RSS over one forward minus its RSS before it (fresh process)."""
    model, x = build(name, args.features), torch.randn(args.batch_size, 3, *args.size)
    before = current_rss_bytes()
    run_once(model, x, backend)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9 - before / 1e9


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="timm preset names")
    parser.add_argument("--size", type=int, nargs=2, default=(224, 224), metavar=("H", "W"))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--features", action="store_true", help="the features_only backbone")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backends", nargs="+", default=["torch", "auto"], choices=["torch", "auto", "triton"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=12, help="ops listed by the profiler (0: none)")
    parser.add_argument("--rss", action="store_true", help="peak RSS increase per backend instead")
    parser.add_argument("--compare", action="store_true",
                        help="time the models against each other (interleaved), no profile")
    parser.add_argument("--count", action="store_true", help="count the ops of a training step instead")
    add_step_arguments(parser)
    parser.add_argument("--rss-child", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.batch_size < 1 or args.threads < 1:
        parser.error("--repeats, --batch-size and --threads must be >= 1")
    if not args.models and not args.rss_child:
        parser.error("name at least one model")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.rss_child:
        print(f"{peak_rss_increase(args, *args.rss_child):.3f}")
        return
    shape = f"{args.batch_size}x3x{args.size[0]}x{args.size[1]}{' features' if args.features else ''}"
    if args.count:
        print_step_counts(args, shape)
        return
    if args.compare and not args.rss:
        x = torch.randn(args.batch_size, 3, *args.size)
        models = {name: build(name, args.features) for name in args.models}
        cases = {(name, b): (models[name], x, b) for name in args.models for b in args.backends}
        print_medians(interleaved_medians(cases, args.repeats), shape, args.repeats)
        return
    for name in args.models:
        if args.rss:
            for backend in args.backends:
                cmd = [sys.executable, "-m", __name__, *argv_of(args), "--rss-child", name, backend]
                gb = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()[-1]
                print(f"{name} {shape} {backend}: peak RSS +{gb} GB")
            continue
        model, x = build(name, args.features), torch.randn(args.batch_size, 3, *args.size)
        print_medians(interleaved_medians({(name, b): (model, x, b) for b in args.backends}, args.repeats),
                      shape, args.repeats)
        backend = args.backends[-1]
        if args.top:
            print(top_ops(model, x, backend, args.top))
        print(f"{name} {backend}: seconds per layer type (inclusive)")
        for layer, seconds in list(layer_times(model, x, backend).items())[: max(args.top, 8)]:
            print(f"  {layer:<32} {seconds:.3f}")


def print_step_counts(args, shape: str) -> None:
    """``--count``: one counted training step per model and backend."""
    for name in args.models:
        for backend in args.backends:
            torch.manual_seed(0)
            with correctness.backend(backend):
                count = count_training_step(build(name, args.features), torch.randn(args.batch_size, 3, *args.size),
                                            step_autocast(args), paths=args.paths)
            print(f"{name} {shape} {backend} train step ({args.paths} paths): {count.row()}")


def print_medians(medians: dict, shape: str, repeats: int) -> None:
    """One line per ``(model, backend)``: its median and its ratio to the first one's."""
    first = next(iter(medians.values()))
    for (name, backend), seconds in medians.items():
        print(f"{name} {shape} {backend}: {seconds:.3f} s median of {repeats} ({seconds / first:.2f}x)")


def argv_of(args) -> list[str]:
    """The options of ``args`` that a ``--rss-child`` subprocess needs."""
    out = ["--size", *map(str, args.size), "--batch-size", str(args.batch_size), "--threads", str(args.threads)]
    return out + (["--features"] if args.features else [])


if __name__ == "__main__":
    main()
