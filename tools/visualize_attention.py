"""Figure 8 panels (input, alpha, beta, softmax(QK^T), mask row, masked attention) for a batch of images.

    python tools/visualize_attention.py IMAGE_OR_DIR [...] --out-dir vis/attention \
        [--model ppma_tiny] [--checkpoint best.pth | converted.safetensors | mm_iter_160000.pth] \
        [--query 0.5,0.5] [--layer -1] [--head 0] [--order both] [--gif] [--size 512] [--dpi 100]

Writes per image ``OUT_DIR/<stem>_attention.png`` (one row per layer; default: the last layer of
every stage), ``OUT_DIR/<stem>_mask.png`` (the query's mask row for v2h, h2v and both, first
chosen layer) and, with ``--gif``, ``OUT_DIR/<stem>_query.gif`` (the query moving across the
image). ``--query`` is relative to the image size so one value fits a batch of any sizes.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tqdm import tqdm

from ppma.vis import attention_figure, mask_figure, query_gif, raster_queries
from ppma.vis.cli import add_figure_args, add_model_args, gif_dpi, load_model_from_args, run_capture, run_cli
from ppma.vis.loading import image_files, load_image, parse_query


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", help="image files or folders of images")
    add_model_args(parser)
    parser.add_argument(
        "--query", default="0.5,0.5", help="query 'x,y' as fractions of width and height (default: 0.5,0.5)"
    )
    parser.add_argument("--head", type=int, default=0, help="attention head (default: 0)")
    parser.add_argument(
        "--order", default="both", choices=("v2h", "h2v", "both"), help="mask row shown (default: both)"
    )
    parser.add_argument("--gif", action="store_true", help="also write a GIF of the query moving")
    add_figure_args(parser, gif=True)
    parser.add_argument("--out-dir", default="vis_attention", help="output folder (default: vis_attention)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    fx, fy = parse_query(args.query)
    if not (0 <= fx < 1 and 0 <= fy < 1):
        raise ValueError(f"--query takes fractions in [0, 1) of the image size, got {args.query!r}")
    files = image_files(args.images)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, _ = load_model_from_args(args)
    for path in tqdm(files, desc="attention maps", unit="image"):
        image = load_image(path)
        height, width = image.shape[:2]
        query = (fx * width, fy * height)
        records, _ = run_capture(model, image, args)
        fig = attention_figure(image, records, query, head=args.head, order=args.order, dpi=args.dpi)
        fig.savefig(out_dir / f"{path.stem}_attention.png")
        mask_figure(image, records[0], query, head=args.head, dpi=args.dpi).savefig(out_dir / f"{path.stem}_mask.png")
        if args.gif:
            gif = out_dir / f"{path.stem}_query.gif"
            queries = raster_queries((height, width), tuple(args.gif_grid))
            query_gif(image, records[0], queries, gif, head=args.head, order=args.order, dpi=gif_dpi(args))
    print(f"wrote figures for {len(files)} images to {out_dir}")


if __name__ == "__main__":
    run_cli(main)
