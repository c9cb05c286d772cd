"""Our preset against the official model, same weights, one process: output error and time ratio.

    python tools/compare_official.py --official DIR --model ppma_tiny [--size 224 224]
        [--batch-size 8] [--threads 2] [--repeats 5] [--backend auto]

``DIR``: a copy of the official repository that you fetched (nothing official is shipped here),
e.g. ``git clone https://github.com/zhongchenzhao/PPMA DIR``. The official model file is imported
from ``DIR`` by path, the official model built in eval mode with its initialisation, its
``state_dict`` converted to our layout by our ``checkpoint_filter_fn`` and loaded strictly into
our preset. Both run inference on one random batch: one warm-up each, then ``--repeats`` rounds
alternating the two; prints the max relative error of our logits (``max |ours - official| / max
|official|``) and the ratio of the median times (ours / official; below 1: ours is faster).
``--backend``: ``PPMA_BACKEND`` for our model (``auto``: the CPU kernels; ``torch``: the plain
reference). Families: see :data:`OFFICIAL`.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import torch

# our preset -> (file of the official repository, its constructor, its argument)
OFFICIAL = {
    "ppma_tiny": ("classification/models/PPMA.py", "PPMAViT_T", None),
    "ppma_small": ("classification/models/PPMA.py", "PPMAViT_S", None),
    "ppma_base": ("classification/models/PPMA.py", "PPMAViT_B", None),
}


def load_official(directory: str, model: str) -> torch.nn.Module:
    """Build the official counterpart of ``model`` from the repository copy in ``directory``."""
    relative, constructor, argument = OFFICIAL[model]
    path = Path(directory) / relative
    if not path.is_file():
        raise FileNotFoundError(f"--official {directory}: no {relative} there (fetch the official repository)")
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"official_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # timm's register_model looks the module up
    spec.loader.exec_module(module)
    return getattr(module, constructor)(argument).eval()


def load_ours(model: str, official: torch.nn.Module) -> torch.nn.Module:
    """Our preset with the official model's weights, converted and loaded strictly."""
    import timm

    import ppma  # noqa: F401  (registers the presets)

    from ppma.models.checkpoint import load_strict

    ours = timm.create_model(model).eval()
    filter_fn = sys.modules[type(ours).__module__].checkpoint_filter_fn
    load_strict(ours, official.state_dict(), filter_fn, source=f"the official {model} weights")
    return ours


def timed(model, x, backend) -> tuple[torch.Tensor, float]:
    if backend is not None:
        os.environ["PPMA_BACKEND"] = backend
    start = time.perf_counter()
    with torch.inference_mode():
        out = model(x)
    return out, time.perf_counter() - start


def compare(ours, official, x, backend, repeats) -> tuple[float, float, float, float]:
    """``(max relative error, our median s, official median s, ratio)``, interleaved runs."""
    want, _ = timed(official, x, None)
    got, _ = timed(ours, x, backend)
    error = ((got - want).abs().max() / want.abs().max()).item()
    times = {"ours": [], "official": []}
    for _ in range(repeats):
        times["official"].append(timed(official, x, None)[1])
        times["ours"].append(timed(ours, x, backend)[1])
    mine, theirs = statistics.median(times["ours"]), statistics.median(times["official"])
    return error, mine, theirs, mine / theirs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--official", required=True, metavar="DIR", help="the fetched official repository")
    parser.add_argument("--model", required=True, choices=sorted(OFFICIAL))
    parser.add_argument("--size", type=int, nargs=2, default=(224, 224), metavar=("H", "W"))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", default="auto", choices=["auto", "torch"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.batch_size < 1 or args.threads < 1:
        parser.error("--repeats, --batch-size and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    official = load_official(args.official, args.model)
    ours = load_ours(args.model, official)
    x = torch.randn(args.batch_size, 3, *args.size)
    error, mine, theirs, ratio = compare(ours, official, x, args.backend, args.repeats)
    print(f"{args.model} {args.batch_size}x3x{args.size[0]}x{args.size[1]} backend={args.backend} "
          f"threads={args.threads}: max rel err {error:.2e}; ours {mine:.3f} s, official {theirs:.3f} s "
          f"(medians of {args.repeats}): {ratio:.2f}x")


if __name__ == "__main__":
    main()
