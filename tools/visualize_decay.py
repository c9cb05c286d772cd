"""Decay factor maps (alpha, beta per layer and head) of a PPMA model for a batch of images.

    python tools/visualize_decay.py IMAGE_OR_DIR [...] --out-dir vis/decay \
        [--model ppma_tiny] [--checkpoint best.pth | converted.safetensors | mm_iter_160000.pth] \
        [--layer 0 -1] [--heads 0 1] [--size 512] [--dpi 100]

Writes ``OUT_DIR/<image stem>_decay.png`` per image: one row per layer (default: the last layer of
every stage), columns alpha and beta for each head, overlaid on the image. OpenMMLab detector
and segmentor checkpoints contribute their backbone.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tqdm import tqdm

from ppma.vis import decay_figure
from ppma.vis.cli import add_figure_args, add_model_args, load_model_from_args, run_capture, run_cli
from ppma.vis.loading import image_files, load_image


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", help="image files or folders of images")
    add_model_args(parser)
    parser.add_argument("--heads", type=int, nargs="+", help="heads to show (default: all)")
    add_figure_args(parser, gif=False)
    parser.add_argument("--out-dir", default="vis_decay", help="output folder (default: vis_decay)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    files = image_files(args.images)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, _ = load_model_from_args(args)
    for path in tqdm(files, desc="decay maps", unit="image"):
        image = load_image(path)
        records, _ = run_capture(model, image, args)
        decay_figure(image, records, heads=args.heads, dpi=args.dpi).savefig(out_dir / f"{path.stem}_decay.png")
    print(f"wrote {len(files)} figures to {out_dir}")


if __name__ == "__main__":
    run_cli(main)
