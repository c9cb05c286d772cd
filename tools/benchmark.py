"""Inference speed (images/s) and peak memory of a detector/segmentor config.

    python tools/benchmark.py CONFIG [--checkpoint PATH] [--shape 512 512] [--batch-size 1]
                              [--warmup 5] [--iters 20] [--device cuda]

Runs ``model(inputs, data_samples, mode='predict')`` (the whole test-time network, post-processing
included, without data loading) on random inputs of the given size: ``--warmup`` untimed
iterations, then ``--iters`` timed ones, synchronising the GPU around each. Peak memory is
``torch.cuda.max_memory_allocated`` on a GPU and the process's peak resident set size on a CPU.
"""
import argparse
import resource
import time

import torch

from ppma.mm.analysis import build_model, dummy_batch
from ppma.mm.runtime import load_config


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--checkpoint", help="weights written by tools/train.py (default: init)")
    parser.add_argument("--shape", type=int, nargs=2, default=(512, 512), metavar=("H", "W"))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be >= 1 and --warmup >= 0")
    return args


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def main(argv=None):
    args = parse_args(argv)
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
