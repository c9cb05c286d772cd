"""Write a small, seeded data set of coloured shapes for detection, segmentation and classification.

One set of images carries two kinds of labels, so mmdet and mmseg train on the same pictures::

    OUT/images/{training,validation}/00000.jpg          RGB images
    OUT/annotations/instances_{training,validation}.json COCO instances (polygons) of
                                                         circle / square / triangle
    OUT/annotations/{training,validation}/00000.png      ADE20K-style semantic maps: 0 is
                                                         "unlabelled" (removed by
                                                         reduce_zero_label), 1 background,
                                                         2 circle, 3 square, 4 triangle

Shapes have random colours (colour says nothing about the class), sizes, rotations and
positions; they never overlap, so each instance polygon is exactly its visible mask.

Beside them, an ImageFolder of one-shape images for classification (mmpretrain, timm), drawn from
its own random stream (the images above do not depend on its options)::

    OUT/classification/{train,val}/{circle,square,triangle}/00000.jpg

    python tools/make_shapes_dataset.py data/shapes --num-train 300 --num-val 60 --size 128
"""
import argparse
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle")
SEG_CLASSES = ("background",) + SHAPES
SPLITS = ("training", "validation")


def shape_polygon(kind, cx, cy, radius, angle):
    """Vertices ``[(x, y), ...]`` of a shape inscribed in the circle ``(cx, cy, radius)``."""
    sides = {"circle": 48, "square": 4, "triangle": 3}[kind]
    return [(cx + radius * math.cos(angle + 2 * math.pi * k / sides),
             cy + radius * math.sin(angle + 2 * math.pi * k / sides)) for k in range(sides)]


def place_shapes(rng, size, max_shapes):
    """Random non-overlapping ``(kind, cx, cy, radius, angle)`` tuples inside a ``size`` square."""
    placed = []
    for _ in range(int(rng.integers(1, max_shapes + 1))):
        for _attempt in range(50):
            radius = rng.uniform(0.08, 0.22) * size
            cx, cy = rng.uniform(radius + 1, size - radius - 1, size=2)
            if all(math.hypot(cx - x, cy - y) > radius + r + 2 for _, x, y, r, _ in placed):
                placed.append((SHAPES[rng.integers(len(SHAPES))], cx, cy, radius,
                               rng.uniform(0, 2 * math.pi)))
                break
    return placed


def render(rng, size, shapes):
    """Draw ``shapes`` on a noisy background.

    Returns the image ``(size, size, 3)`` uint8, the semantic map ``(size, size)`` uint8 in the
    ADE20K convention above, and per shape its boolean mask ``(size, size)`` and polygon.
    """
    background = rng.integers(0, 256, size=3)
    image = Image.fromarray(np.clip(background + rng.normal(0, 12, (size, size, 3)), 0, 255)
                            .astype(np.uint8))
    semantic = np.ones((size, size), np.uint8)
    draw = ImageDraw.Draw(image)
    instances = []
    for kind, cx, cy, radius, angle in shapes:
        polygon = shape_polygon(kind, cx, cy, radius, angle)
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        draw.polygon(polygon, fill=colour)
        mask_image = Image.new("L", (size, size), 0)
        ImageDraw.Draw(mask_image).polygon(polygon, fill=1)
        mask = np.asarray(mask_image).astype(bool)
        semantic[mask] = SEG_CLASSES.index(kind) + 1
        instances.append((kind, mask, polygon))
    return np.asarray(image), semantic, instances


def coco_annotation(ann_id, image_id, kind, mask, polygon):
    """One COCO instance annotation; bbox ``[x, y, w, h]`` and area come from the mask."""
    ys, xs = np.nonzero(mask)
    x0, y0 = float(xs.min()), float(ys.min())
    return dict(id=ann_id, image_id=image_id, category_id=SHAPES.index(kind) + 1,
                segmentation=[[round(v, 2) for point in polygon for v in point]],
                area=float(mask.sum()), bbox=[x0, y0, float(xs.max()) - x0 + 1,
                                              float(ys.max()) - y0 + 1], iscrowd=0)


def write_split(out, split, num_images, size, max_shapes, rng):
    """Write the images, semantic maps and COCO json of one split."""
    image_dir = out / "images" / split
    seg_dir = out / "annotations" / split
    image_dir.mkdir(parents=True, exist_ok=True)
    seg_dir.mkdir(parents=True, exist_ok=True)
    coco = dict(images=[], annotations=[],
                categories=[dict(id=i + 1, name=name) for i, name in enumerate(SHAPES)])
    for image_id in range(num_images):
        image, semantic, instances = render(rng, size, place_shapes(rng, size, max_shapes))
        name = f"{image_id:05d}"
        Image.fromarray(image).save(image_dir / f"{name}.jpg", quality=95)
        Image.fromarray(semantic).save(seg_dir / f"{name}.png")
        coco["images"].append(dict(id=image_id, file_name=f"{name}.jpg", height=size, width=size))
        for kind, mask, polygon in instances:
            coco["annotations"].append(coco_annotation(len(coco["annotations"]) + 1, image_id,
                                                       kind, mask, polygon))
    (out / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco))
    return len(coco["annotations"])


def write_classification(out, split, per_class, size, rng):
    """Write ``per_class`` images of one shape each into ``out/classification/<split>/<shape>/``."""
    for kind in SHAPES:
        folder = out / "classification" / split / kind
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            radius = rng.uniform(0.2, 0.4) * size
            cx, cy = rng.uniform(radius + 1, size - radius - 1, size=2)
            image, _, _ = render(rng, size, [(kind, cx, cy, radius, rng.uniform(0, 2 * math.pi))])
            Image.fromarray(image).save(folder / f"{index:05d}.jpg", quality=95)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output folder")
    parser.add_argument("--num-train", type=int, default=300)
    parser.add_argument("--num-val", type=int, default=60)
    parser.add_argument("--size", type=int, default=128, help="image side in pixels")
    parser.add_argument("--max-shapes", type=int, default=4, help="most shapes in one image")
    parser.add_argument("--cls-train", type=int, default=200,
                        help="classification training images per class")
    parser.add_argument("--cls-val", type=int, default=50, help="classification validation images per class")
    parser.add_argument("--cls-size", type=int, default=64, help="classification image side in pixels")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("num_train", "num_val", "max_shapes", "cls_train", "cls_val"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("size", "cls_size"):
        if getattr(args, name) < 32:
            parser.error(f"--{name.replace('_', '-')} must be >= 32")
    rng = np.random.default_rng(args.seed)
    for split, count in zip(SPLITS, (args.num_train, args.num_val)):
        instances = write_split(args.out, split, count, args.size, args.max_shapes, rng)
        print(f"{split}: {count} images, {instances} instances -> {args.out}")
    rng = np.random.default_rng((args.seed, 1))  # the classification images' own stream
    for split, per_class in (("train", args.cls_train), ("val", args.cls_val)):
        write_classification(args.out, split, per_class, args.cls_size, rng)
        print(f"classification {split}: {per_class} images of each of {', '.join(SHAPES)} "
              f"-> {args.out / 'classification' / split}")


if __name__ == "__main__":
    main()
