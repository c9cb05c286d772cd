"""Parameters and FLOPs of the package's presets: the numbers in docs/models.md, vmamba.md, vim.md.

    python tools/model_stats.py                          # every preset of every family at 224x224
    python tools/model_stats.py ppma_tiny vmamba_tiny vim_tiny --size 512 768

FLOPs are :func:`ppma.models.flops.flop_analysis` (fvcore, one multiply-add = one FLOP, every
registered op by its formula) of one image, in total and without the attention products
``q k^T`` and ``weights x v`` (the registry term ``'products'``, left out of the paper's detection
FLOPs); 3-D presets see ``--frames`` frames.
"""
import argparse

import timm
import torch

from ppma.models.family import families, package_models
from ppma.models.flops import flop_analysis, total_flops


def stats(name: str, size: tuple[int, int], frames: int) -> tuple[int, float, float]:
    """``(parameters, GFLOPs, GFLOPs without the attention products)`` of preset ``name``
    (1000 classes) on one ``size`` input."""
    model = timm.create_model(name).eval()
    params = sum(p.numel() for p in model.parameters())
    shape = (1, 3, frames, *size) if getattr(model, "token_layout", None) == "3d" else (1, 3, *size)
    analysis = flop_analysis(model, torch.zeros(shape))
    return params, total_flops(analysis) / 1e9, total_flops(analysis, ("products",)) / 1e9


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="presets (default: every family's presets but the test ones)")
    parser.add_argument("--size", type=int, nargs=2, default=(224, 224), metavar=("H", "W"))
    parser.add_argument("--frames", type=int, default=8, help="frames for 3-D presets (default: 8)")
    args = parser.parse_args(argv)
    names = args.models or [p for f in families() for p in f.presets if p != f.test_preset]
    unknown = [n for n in names if n not in package_models()]
    if unknown:
        parser.error(f"unknown models {unknown}; the presets of this package: {', '.join(package_models())}")
    size = f"{args.size[0]}x{args.size[1]}"
    print(f"| model | params | GFLOPs @ {size} | without attention products |\n| --- | ---: | ---: | ---: |")
    for name in names:
        params, gflops, without = stats(name, tuple(args.size), args.frames)
        print(f"| {name} | {params:,} | {gflops:.2f} | {without:.2f} |")


if __name__ == "__main__":
    main()
