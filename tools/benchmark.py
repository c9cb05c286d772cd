"""Inference speed (images/s) and peak memory of a detector/segmentor config, or of a timm model
on each ``ppma.ops`` backend.

    python tools/benchmark.py CONFIG [--checkpoint PATH] [--shape 512 512] [--batch-size 1]
                              [--warmup 5] [--iters 20] [--device cuda]
    python tools/benchmark.py --model ppma_tiny [--shape 224 224] [--batch-size 128] [--train]
                              [--features] [--backends torch triton] [--warmup 5] [--iters 20]

CONFIG: runs ``model(inputs, data_samples, mode='predict')`` (the whole test-time network,
post-processing included, without data loading) on random inputs of the given size: ``--warmup``
untimed iterations, then ``--iters`` timed ones, synchronising the GPU around each. Peak memory is
``torch.cuda.max_memory_allocated`` on a GPU and the process's peak resident set size on a CPU.

``--model``: the timm model (``--features``: its ``features_only`` backbone) once per backend of
``--backends`` (``PPMA_BACKEND``; ``torch`` is the reference path of every op), inference under
``torch.inference_mode`` or, with ``--train``, forward and backward of a summed output; bf16
autocast on a GPU. One table row per backend: ms per iteration, images/s, peak memory (CUDA:
the allocator's peak beyond the weights) and the speed-up over the first backend. The issue's
rows: ``--model ppma_{tiny,small,base} --shape 224 224 --batch-size 128`` (and ``--train
--batch-size 64``), ``--model ppma_tiny --features --batch-size 1 --shape S S`` for S in 512,
768, 1024, 1280, 2048.
"""
import argparse
import os
import resource
import time

import torch


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="an mmdet/mmseg config (or --model)")
    parser.add_argument("--model", help="a timm model name, benchmarked per ops backend")
    parser.add_argument("--features", action="store_true", help="--model as a features_only backbone")
    parser.add_argument("--train", action="store_true", help="--model: forward and backward")
    parser.add_argument("--backends", nargs="+", default=["torch", "triton"], choices=["torch", "triton"])
    parser.add_argument("--checkpoint", help="weights written by tools/train.py (default: init)")
    parser.add_argument("--shape", type=int, nargs=2, default=(512, 512), metavar=("H", "W"))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be >= 1 and --warmup >= 0")
    if (args.config is None) == (args.model is None):
        parser.error("give either CONFIG or --model")
    return args


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def benchmark_model(args) -> None:
    """One row per backend for the timm model ``args.model`` (see the module docstring)."""
    import timm

    import ppma.models  # noqa: F401  (registers the presets)

    kwargs = {"features_only": True} if args.features else {}
    model = timm.create_model(args.model, **kwargs).to(args.device)
    model.train(args.train)
    x = torch.randn(args.batch_size, 3, *args.shape, device=args.device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.device.startswith("cuda"))

    def step():
        with autocast:
            out = model(x)
        if args.train:
            sum(o.float().sum() for o in (out if isinstance(out, (list, tuple)) else [out])).backward()

    print(f"{args.model}{' backbone' if args.features else ''}: {args.shape[0]}x{args.shape[1]}, batch "
          f"{args.batch_size}, {'training' if args.train else 'inference'}, {args.device}")
    print("| backend | ms/iter | images/s | peak MiB | speed-up |\n|---|---:|---:|---:|---:|")
    first = None
    for backend in args.backends:
        os.environ["PPMA_BACKEND"] = backend
        base = 0
        if args.device.startswith("cuda"):
            base = torch.cuda.memory_allocated(args.device)
            torch.cuda.reset_peak_memory_stats(args.device)
        try:
            with torch.inference_mode(not args.train):
                for _ in range(args.warmup):
                    step()
                model.zero_grad(set_to_none=True)
                synchronize(args.device)
                start = time.perf_counter()
                for _ in range(args.iters):
                    step()
                synchronize(args.device)
                seconds = (time.perf_counter() - start) / args.iters
        except (torch.OutOfMemoryError, RuntimeError) as err:
            print(f"| {backend} | {type(err).__name__}: {str(err).splitlines()[0][:80]} | | | |")
            continue
        first = first or seconds
        if args.device.startswith("cuda"):
            peak = f"{(torch.cuda.max_memory_allocated(args.device) - base) / 2**20:.0f}"
        else:
            peak = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} (process RSS)"
        print(f"| {backend} | {1000 * seconds:.1f} | {args.batch_size / seconds:.1f} | {peak} | {first / seconds:.2f}x |")
        model.zero_grad(set_to_none=True)


def main(argv=None):
    args = parse_args(argv)
    if args.model is not None:
        return benchmark_model(args)
    from ppma.mm.analysis import build_model, dummy_batch
    from ppma.mm.runtime import load_config

    cfg = load_config(args.config)
    model = build_model(cfg, args.checkpoint, args.device)
    inputs, samples = dummy_batch(cfg.default_scope, args.batch_size, *args.shape, device=args.device)
    with torch.inference_mode():
        for _ in range(args.warmup):
            model(inputs, samples, mode="predict")
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(args.device)
        synchronize(args.device)
        start = time.perf_counter()
        for _ in range(args.iters):
            model(inputs, samples, mode="predict")
            synchronize(args.device)
        elapsed = time.perf_counter() - start
    if args.device.startswith("cuda"):
        memory = f"peak GPU memory {torch.cuda.max_memory_allocated(args.device) / 2**20:.0f} MiB"
    else:
        memory = f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB"
    images = args.iters * args.batch_size
    print(f"{args.config}: {args.shape[0]}x{args.shape[1]}, batch {args.batch_size}, "
          f"{args.device}: {images / elapsed:.2f} images/s "
          f"({1000 * elapsed / args.iters:.1f} ms/iter over {args.iters} iters, "
          f"{args.warmup} warm-up), {memory}")


if __name__ == "__main__":
    main()
