"""PPMA on one image: the paper's Figure 8 panels for a query, and a GIF of the query moving.

    python demo/image_demo.py demo/astronaut.jpg --out fig.png
    python demo/image_demo.py IMAGE --model ppma_tiny --checkpoint best.pth --query 250,180 \
        --layer -1 --head 2 --out fig.png --gif query.gif

Panels per layer: the input with the query (a star), alpha, beta, softmax(QK^T), the polyline
path mask row of the query, and the masked attention. With a classification checkpoint the top-5
ImageNet classes are printed. Without ``--checkpoint`` the weights are random (logged). A 3-D
model (``ppma_tiny_3d``) sees a clip of ``--frames`` copies of the image, one row per frame.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from ppma.vis import attention_figure, attention_layers, check_point, query_gif, raster_queries
from ppma.vis.cli import add_figure_args, add_model_args, gif_dpi, load_model_from_args, run_capture, run_cli
from ppma.vis.loading import imagenet_top5, load_image, parse_query


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image", help="image file")
    add_model_args(parser)
    parser.add_argument("--query", help="query point 'x,y' in pixels of IMAGE (default: its centre)")
    parser.add_argument("--head", type=int, default=0, help="attention head (default: 0)")
    parser.add_argument(
        "--order", default="both", choices=("v2h", "h2v", "both"), help="mask row shown (default: both)"
    )
    parser.add_argument("--out", default="ppma_figure8.png", help="figure file (default: ppma_figure8.png)")
    parser.add_argument("--gif", help="also write a GIF of the query moving across the image (first chosen layer)")
    parser.add_argument(
        "--frames", type=int, default=2,
        help="3-D models: the clip repeats the image this many times; the query is in frame 0 (default: 2)",
    )
    add_figure_args(parser, gif=True)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    image = load_image(args.image)
    height, width = image.shape[:2]
    query = parse_query(args.query) if args.query else (width / 2, height / 2)
    check_point(query, (height, width))
    model, has_classifier = load_model_from_args(args)
    if any(layer.token_layout == "3d" for layer in attention_layers(model).values()):
        if args.frames < 1:
            raise ValueError(f"--frames must be >= 1, got {args.frames}")
        image = np.repeat(image[None], args.frames, axis=0)  # (T, h, w, 3)
    records, features = run_capture(model, image, args)
    if has_classifier and model.num_classes == 1000:
        with torch.no_grad():
            logits = model.forward_head(features)[0]
        print("top-5 ImageNet classes:")
        for name, prob in imagenet_top5(logits):
            print(f"  {prob:6.1%}  {name}")
    fig = attention_figure(image, records, query, head=args.head, order=args.order, dpi=args.dpi)
    fig.savefig(args.out)
    print(f"wrote {args.out} ({', '.join(r.name for r in records)}; head {args.head}; query {query})")
    if args.gif:
        queries = raster_queries((height, width), tuple(args.gif_grid))
        query_gif(image, records[0], queries, args.gif, head=args.head, order=args.order, dpi=gif_dpi(args))
        print(f"wrote {args.gif} ({records[0].name})")


if __name__ == "__main__":
    run_cli(main)
