"""Top-1 / top-5 accuracy of a preset on an ImageFolder, with timm's preprocessing.

    python tools/validate.py --model ppma_tiny --checkpoint best.pth --data data/imagenet/val
    python tools/validate.py --model test_ppma --checkpoint work_dirs/test_ppma_shapes/epoch_20.pth \\
        --data data/shapes/classification/val --img-size 64 --crop-pct 1.0
    python tools/validate.py --model mila_tiny --pretrained --data data/imagenet/val --amp

``--data``: a folder of class folders (ImageNet's val/n01440764/..., or any data set), classes
indexed in sorted folder-name order as torchvision's ImageFolder and mmpretrain do; there must be
as many as the model has outputs. ``--checkpoint``: an official checkpoint of the preset's family
or one of ours (converted, or written by tools/train.py), read through the family's strict
checkpoint filter (head and class count from its keys). Preprocessing: the model's pretrained
cfg (resize to ``img_size / crop_pct``, centre crop, interpolation, mean/std) through
``timm.data``, with ``--img-size`` / ``--crop-pct`` / ``--interpolation`` overrides.

Prints progress, then one JSON line: top1, top5 (top-k for k <= classes), images, images/s.
"""
import argparse
import importlib.util
import json
import pickle
import time
from pathlib import Path

import timm
import torch
from timm.data import ImageDataset, create_transform, resolve_data_config
from tqdm import tqdm

import ppma  # noqa: F401  (registers the presets)
from ppma.models.checkpoint import check_pretrained, model_state_dict, read_checkpoint
from ppma.models.family import create_from_checkpoint, family_of


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a preset of this package, e.g. ppma_tiny")
    weights = parser.add_mutually_exclusive_group(required=True)
    weights.add_argument("--checkpoint", help="official or converted checkpoint, or one written by tools/train.py")
    weights.add_argument("--pretrained", action="store_true", help="the preset's released weights (downloads)")
    parser.add_argument("--no-ema", action="store_true",
                        help="a checkpoint with EMA weights (model_ema/state_dict_ema): take the model's instead")
    parser.add_argument("--data", required=True, help="ImageFolder: one sub-folder of images per class")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4, help="data loading processes")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", action="store_true",
                        help="autocast: float16 on CUDA, bfloat16 on the CPU")
    parser.add_argument("--img-size", type=int, help="input side (default: the pretrained cfg's)")
    parser.add_argument("--crop-pct", type=float, help="centre-crop fraction (default: the pretrained cfg's)")
    parser.add_argument("--interpolation", help="resize interpolation (default: the pretrained cfg's)")
    return parser, parser.parse_args(argv)


def class_folders(root: Path) -> list[str]:
    """The sub-folders of ``root``, sorted: class ``i`` is the ``i``-th."""
    if not root.is_dir():
        raise ValueError(f"data folder not found: {root}")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"{root} has no class folders (expected {root}/<class>/<image>)")
    return classes


def load_weights(path: str, use_ema: bool = True) -> dict:
    """The model tensors of a checkpoint file (its EMA weights first, unless ``use_ema=False``);
    mmengine training checkpoints need ppma.mm's allow-list of the plain objects they hold
    (``ppma.mm.serialization``)."""
    try:
        return model_state_dict(read_checkpoint(path), use_ema=use_ema)
    except pickle.UnpicklingError:
        if importlib.util.find_spec("mmengine") is None:
            raise ValueError(f"{path} holds training state that only mmengine reads "
                             "(pip install 'ppma[mm]')") from None
        import ppma.mm  # noqa: F401  (allows what tools/train.py checkpoints hold)

        return model_state_dict(read_checkpoint(path), use_ema=use_ema)


def build_model(args) -> torch.nn.Module:
    family_of(args.model)  # ValueError listing the presets for another name
    if args.pretrained:
        check_pretrained(args.model)  # a named error for a preset without a usable download
        return timm.create_model(args.model, pretrained=True)
    state = load_weights(args.checkpoint, use_ema=not args.no_ema)
    try:
        model = create_from_checkpoint(args.model, state)
    except ValueError as err:
        raise ValueError(f"{args.checkpoint} does not fit {args.model!r}: {err}") from err
    if getattr(model, "head", True) is None or model.num_classes == 0:
        raise ValueError(f"{args.checkpoint} holds no classifier (a backbone or features checkpoint)")
    return model


@torch.inference_mode()
def evaluate(model, loader, device, amp: bool) -> dict:
    """Top-k counts over ``loader``; ``k`` in (1, 5), at most the number of classes."""
    ks = [k for k in (1, 5) if k <= model.num_classes]
    correct, seen = dict.fromkeys(ks, 0), 0
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    start = time.perf_counter()
    for images, targets in tqdm(loader, desc="validate", unit="batch"):
        images, targets = images.to(device, non_blocking=True), targets.to(device)
        with torch.autocast(device.type, dtype=dtype, enabled=amp):
            logits = model(images)
        top = logits.float().topk(max(ks), dim=1).indices
        for k in ks:
            correct[k] += (top[:, :k] == targets[:, None]).any(dim=1).sum().item()
        seen += len(targets)
    elapsed = time.perf_counter() - start
    return {**{f"top{k}": 100.0 * correct[k] / seen for k in ks}, "images": seen,
            "images_per_s": seen / elapsed}


def main(argv=None):
    parser, args = parse_args(argv)
    data = Path(args.data)
    try:
        classes = class_folders(data)
        model = build_model(args)
    except (ValueError, FileNotFoundError) as err:
        parser.error("; ".join(line.strip() for line in str(err).splitlines() if line.strip()))  # one line
    if model.num_classes != len(classes):
        parser.error(f"{args.model} has {model.num_classes} outputs but {data} has {len(classes)} "
                     "class folders: they must be the same classes")
    overrides = {k: v for k, v in dict(img_size=args.img_size, crop_pct=args.crop_pct,
                                       interpolation=args.interpolation).items() if v is not None}
    data_cfg = resolve_data_config(overrides, model=model)
    dataset = ImageDataset(str(data), class_map={name: i for i, name in enumerate(classes)},
                           transform=create_transform(**data_cfg))
    if len(dataset) == 0:
        parser.error(f"no images in the class folders of {data}")
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                                         pin_memory=args.device.startswith("cuda"))
    device = torch.device(args.device)
    model = model.to(device).eval()
    print(f"{args.model}: {len(dataset)} images of {len(classes)} classes, input "
          f"{data_cfg['input_size'][1:]} (crop {data_cfg['crop_pct']}, {data_cfg['interpolation']})")
    metrics = evaluate(model, loader, device, args.amp)
    print(json.dumps({"model": args.model, **metrics}))
    return metrics


if __name__ == "__main__":
    main()
