"""Inference speed (images/s) and peak memory of a detector/segmentor config, or of a timm model
on each ``ppma.ops`` backend.

    python tools/benchmark.py CONFIG [--checkpoint PATH] [--shape 512 512] [--batch-size 1]
                              [--warmup 5] [--iters 20] [--device cuda]
    python tools/benchmark.py --model ppma_tiny [--shape 224 224] [--batch-size 128] [--train]
                              [--features] [--backends torch triton] [--warmup 5] [--iters 20] [--compile]

CONFIG: runs ``model(inputs, data_samples, mode='predict')`` (the whole test-time network,
post-processing included, without data loading) on random inputs of the given size: ``--warmup``
untimed iterations, then ``--iters`` timed ones, synchronising the GPU around each. Peak memory is
``torch.cuda.max_memory_allocated`` on a GPU and the process's peak resident set size on a CPU.

``--model``: the timm model (``--features``: its ``features_only`` backbone) once per backend of
``--backends`` (``PPMA_BACKEND``; ``torch`` is the reference path of every op), inference under
``torch.inference_mode`` or, with ``--train``, forward and backward of a summed output; bf16
autocast on a GPU. One table row per backend: ms per iteration, images/s, peak memory (CUDA:
the allocator's peak beyond the weights) and the speed-up over the first backend; ``--compile``
adds, after each backend's row, one for ``torch.compile(model, fullgraph=True)`` (Inductor; its
compilation falls in the warm-up iterations, at least one). The issue's
rows: ``--model ppma_{tiny,small,base} --shape 224 224 --batch-size 128`` (and ``--train
--batch-size 64``), ``--model ppma_tiny --features --batch-size 1 --shape S S`` for S in 512,
768, 1024, 1280, 2048.

``--runtime eager compile onnxruntime`` (any of them; CPU, inference): ms per image of each
runtime for every model of ``--models`` (default the four families' tiny presets) in three cases,
the classifier at 224x224 batch 1 and batch 8 and the ``features_only`` backbone at 512x512
batch 1, all in one run, one model after the other (only one model's runtimes are held in
memory): ``--repeats`` rounds, each timing every case of the model on every runtime once
(``--iters`` calls; interleaved, so that load from other jobs falls on all of them alike); the
table has the medians and the ratio to eager. ``compile``: ``torch.compile`` (Inductor);
``onnxruntime``: the file ``tools/export.py`` writes (``--onnx-dir DIR``: its
``NAME[_features].onnx`` files are reused, missing ones exported there), on the CPU execution
provider. ``--threads``: torch and ONNX Runtime intra-op threads.
"""
import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ppma.kernels.common.timing import sync

RUNTIMES = ("eager", "compile", "onnxruntime")
RUNTIME_MODELS = ("ppma_tiny", "vmamba_tiny", "vim_tiny", "mila_tiny")
# (label, features_only, batch, H, W)
RUNTIME_CASES = (("224 bs1", False, 1, 224, 224), ("224 bs8", False, 8, 224, 224),
                 ("backbone 512 bs1", True, 1, 512, 512))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="an mmdet/mmseg config (or --model)")
    parser.add_argument("--model", help="a timm model name, benchmarked per ops backend")
    parser.add_argument("--features", action="store_true", help="--model as a features_only backbone")
    parser.add_argument("--train", action="store_true", help="--model: forward and backward")
    parser.add_argument("--backends", nargs="+", default=["torch", "triton"], choices=["torch", "triton"])
    parser.add_argument("--compile", action="store_true", help="--model: also torch.compile'd (Inductor)")
    parser.add_argument("--checkpoint", help="weights written by tools/train.py (default: init)")
    parser.add_argument("--shape", type=int, nargs=2, default=(512, 512), metavar=("H", "W"))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runtime", nargs="+", choices=RUNTIMES, help="compare runtimes (CPU, see above)")
    parser.add_argument("--models", nargs="+", default=list(RUNTIME_MODELS), help="--runtime: the models")
    parser.add_argument("--onnx-dir", help="--runtime: folder of exported .onnx files (reused or written)")
    parser.add_argument("--repeats", type=int, default=5, help="--runtime: interleaved rounds")
    parser.add_argument("--threads", type=int, default=2, help="--runtime: intra-op threads")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.repeats < 1:
        parser.error("--iters, --repeats must be >= 1 and --warmup >= 0")
    if sum(a is not None for a in (args.config, args.model, args.runtime)) != 1:
        parser.error("give one of CONFIG, --model or --runtime")
    return args


def benchmark_model(args) -> None:
    """One row per backend for the timm model ``args.model`` (see the module docstring)."""
    import timm

    import ppma.models  # noqa: F401  (registers the presets)

    kwargs = {"features_only": True} if args.features else {}
    model = timm.create_model(args.model, **kwargs).to(args.device)
    model.train(args.train)
    x = torch.randn(args.batch_size, 3, *args.shape, device=args.device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.device.startswith("cuda"))

    def step(run):
        with autocast:
            out = run(x)
        if args.train:
            sum(o.float().sum() for o in (out if isinstance(out, (list, tuple)) else [out])).backward()

    print(f"{args.model}{' backbone' if args.features else ''}: {args.shape[0]}x{args.shape[1]}, batch "
          f"{args.batch_size}, {'training' if args.train else 'inference'}, {args.device}")
    print("| backend | ms/iter | images/s | peak MiB | speed-up |\n|---|---:|---:|---:|---:|")
    first = None
    runs = [(backend, compiled) for backend in args.backends for compiled in (False, True)[: 1 + args.compile]]
    args.warmup = max(args.warmup, int(args.compile))
    for backend, compiled in runs:
        os.environ["PPMA_BACKEND"] = backend
        label = f"{backend} compiled" if compiled else backend
        if compiled:
            torch._dynamo.reset()  # traced anew under this backend (the graph keeps the backend it was traced with)
        run = torch.compile(model, fullgraph=True) if compiled else model
        base = 0
        if args.device.startswith("cuda"):
            base = torch.cuda.memory_allocated(args.device)
            torch.cuda.reset_peak_memory_stats(args.device)
        try:
            with torch.inference_mode(not args.train):
                for _ in range(args.warmup):
                    step(run)
                model.zero_grad(set_to_none=True)
                sync(torch.device(args.device))
                start = time.perf_counter()
                for _ in range(args.iters):
                    step(run)
                sync(torch.device(args.device))
                seconds = (time.perf_counter() - start) / args.iters
        except (torch.OutOfMemoryError, RuntimeError) as err:
            print(f"| {label} | {type(err).__name__}: {str(err).splitlines()[0][:80]} | | | |")
            continue
        first = first or seconds
        if args.device.startswith("cuda"):
            peak = f"{(torch.cuda.max_memory_allocated(args.device) - base) / 2**20:.0f}"
        else:
            peak = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} (process RSS)"
        print(f"| {label} | {1000 * seconds:.1f} | {args.batch_size / seconds:.1f} | {peak} | {first / seconds:.2f}x |")
        model.zero_grad(set_to_none=True)


def runtime_runners(name: str, features: bool, runtimes, onnx_dir: Path, threads: int) -> dict:
    """``{runtime: run(x)}`` for the preset ``name`` (CPU, inference)."""
    from ppma.deploy import export

    model = export.build_model(name, features=features)
    runners = {}
    if "eager" in runtimes:
        runners["eager"] = model
    if "compile" in runtimes:
        runners["compile"] = torch.compile(model)
    if "onnxruntime" in runtimes:
        path = onnx_dir / f"{name}{'_features' if features else ''}.onnx"
        if not path.exists():
            export.export_one(name, path, "onnx", features=features)
        session = export.onnxruntime_session(path, threads)
        input_name = session.get_inputs()[0].name
        runners["onnxruntime"] = lambda x: session.run(None, {input_name: x.numpy()})
    return runners


def benchmark_runtimes(args) -> None:
    """The ``--runtime`` table (see the module docstring): medians over interleaved rounds."""
    import ppma.models  # noqa: F401  (registers the presets)

    torch.set_num_threads(args.threads)
    onnx_dir = Path(args.onnx_dir or tempfile.mkdtemp(prefix="ppma_onnx_"))
    onnx_dir.mkdir(parents=True, exist_ok=True)
    print(f"ms/img, CPU, {args.threads} threads, median of {args.repeats} interleaved rounds of {args.iters} calls")
    print("| model | case | " + " | ".join(args.runtime) + " |\n|---|---|" + "---:|" * len(args.runtime))
    for name in args.models:  # one model at a time: its runtimes in memory together, not every model's
        runners = {f: runtime_runners(name, f, args.runtime, onnx_dir, args.threads) for f in (False, True)}
        cases = [(label, b, h, w, runners[f]) for label, f, b, h, w in RUNTIME_CASES]
        times = {(label, r): [] for label, *_ in cases for r in args.runtime}
        with torch.inference_mode():
            for _label, batch, h, w, case_runners in cases:
                x = torch.randn(batch, 3, h, w)
                for run in case_runners.values():
                    for _ in range(args.warmup):
                        run(x)
            for _ in range(args.repeats):
                for label, batch, h, w, case_runners in cases:
                    x = torch.randn(batch, 3, h, w)
                    for runtime, run in case_runners.items():
                        start = time.perf_counter()
                        for _ in range(args.iters):
                            run(x)
                        times[label, runtime].append(1000 * (time.perf_counter() - start) / (args.iters * batch))
        for label, *_ in cases:
            medians = {r: statistics.median(times[label, r]) for r in args.runtime}
            eager = medians.get("eager")
            cells = [f"{m:.1f}" + (f" ({m / eager:.2f}x)" if eager and r != "eager" else "") for r, m in medians.items()]
            print(f"| {name} | {label} | " + " | ".join(cells) + " |", flush=True)


def main(argv=None):
    args = parse_args(argv)
    if args.runtime is not None:
        return benchmark_runtimes(args)
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
        sync(torch.device(args.device))
        start = time.perf_counter()
        for _ in range(args.iters):
            model(inputs, samples, mode="predict")
            sync(torch.device(args.device))
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
