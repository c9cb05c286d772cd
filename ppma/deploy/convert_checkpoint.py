"""Convert an official checkpoint (``.pth``) to this package's layout.

    python tools/convert_checkpoint.py best.pth ppma_tiny.safetensors --model ppma_tiny
    python tools/convert_checkpoint.py mask_rcnn_ppma_t.pth mask_rcnn_ppma_t_ours.pth \
        --config mm_configs/mask_rcnn/mask_rcnn_ppma_tiny_fpn_1x_coco.py

Without ``--config``: the weights of model ``--model`` (any preset of this package) from an
official classification checkpoint (``{'model' or 'models': state_dict, ...}``) or the backbone of
an official mmdet/mmseg checkpoint (``{'state_dict': {'backbone.*': ...}}``, written as a
backbone with output norms and no head), as safetensors; they load with
``timm.create_model(MODEL, pretrained=True, pretrained_cfg_overlay=dict(file=OUT))``.

With ``--config``: a whole official Mask R-CNN (mmdet 2.28) or UPerNet (mmseg 0.30) checkpoint
converted for the detector/segmentor of that config (``ppma.mm.convert``), written as
``{'state_dict': ..., 'meta': {'dataset_meta': ...}}`` for ``tools/test.py CONFIG OUT`` or the
config's ``load_from``.

Conversion is strict: a key without a counterpart, or a model key missing from the checkpoint,
is an error that names it.
"""
from __future__ import annotations

import argparse
import pickle
import sys

import torch

from ppma.models.checkpoint import model_state_dict, read_checkpoint
from ppma.models.family import create_from_checkpoint, family_of


def load_source(path: str, trust: bool) -> dict:
    """The whole checkpoint; ``trust`` unpickles the file fully (weights_only=False)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False) if trust else read_checkpoint(path)
    except pickle.UnpicklingError as e:
        raise SystemExit(
            f"{path}: the file holds more than tensors ({e.__class__.__name__}); if you trust it, "
            "rerun with --trust-checkpoint to unpickle it fully"
        ) from e


def convert_model(checkpoint: dict, args: argparse.Namespace) -> str:
    from safetensors.torch import save_file

    model = create_from_checkpoint(args.model, model_state_dict(checkpoint))
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, args.output, metadata={"model": args.model, "source": args.checkpoint})
    params = sum(p.numel() for p in model.parameters())
    return f"{len(tensors)} tensors, {params:,} parameters ({args.model})"


def convert_dense(checkpoint: dict, args: argparse.Namespace) -> str:
    from ppma.mm.analysis import build_model
    from ppma.mm.convert import convert_dense_state_dict, dataset_meta
    from ppma.mm.runtime import load_config

    model = build_model(load_config(args.config))
    state = convert_dense_state_dict(checkpoint, model)
    model.load_state_dict(state, strict=True)
    torch.save({"state_dict": state, "meta": {"dataset_meta": dataset_meta(checkpoint.get("meta"))}}, args.output)
    return f"{len(state)} tensors for {type(model).__name__} of {args.config}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="official .pth file")
    parser.add_argument("output", help="output file: .safetensors (a model), .pth (with --config)")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--model", help="preset the weights belong to (any preset of this package)")
    target.add_argument("--config", help="mm config: convert a whole detector/segmentor checkpoint for it")
    parser.add_argument("--trust-checkpoint", action="store_true", help="allow full unpickling (weights_only=False)")
    args = parser.parse_args(argv)
    if not args.config:
        try:
            family_of(args.model)
        except ValueError as e:
            parser.error(f"--model: {e}")
    else:
        import ppma.mm  # noqa: F401  (registers the backbones; allows the globals of training checkpoints)

    checkpoint = load_source(args.checkpoint, args.trust_checkpoint)
    try:
        summary = convert_dense(checkpoint, args) if args.config else convert_model(checkpoint, args)
    except ValueError as e:
        target = args.config or args.model
        print(f"error: {args.checkpoint} does not fit {target}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
