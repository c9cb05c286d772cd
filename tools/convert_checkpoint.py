#!/usr/bin/env python
"""Convert an official PPMA checkpoint (``.pth``) to this package's layout as safetensors.

    python tools/convert_checkpoint.py best.pth ppma_tiny.safetensors --model ppma_tiny

Accepts official classification checkpoints (``{'model' or 'models': state_dict, ...}``) and official
mmdet/mmseg checkpoints (``{'state_dict': {'backbone.*': ...}}``, written as a backbone with
output norms and no head). Conversion is strict: a key without a counterpart, or a model key
missing from the checkpoint, is an error that names it. The output loads with
``timm.create_model(MODEL, pretrained=True, pretrained_cfg_overlay=dict(file=OUT))``.
"""
from __future__ import annotations

import argparse
import pickle
import sys

import timm
import torch
from safetensors.torch import save_file

import ppma  # noqa: F401  (registers the presets)
from ppma.models.checkpoint import model_state_dict, read_checkpoint
from ppma.models.ppma import PRESETS, checkpoint_filter_fn


def model_kwargs(state_dict: dict) -> dict:
    """Head and output norms as the checkpoint has them (keys in official or our layout)."""
    keys = list(state_dict)
    kwargs = {}
    norms = sorted({int(k.split(".")[0].removeprefix("outnorm")) for k in keys if k.startswith("outnorm")})
    norms += sorted({int(k.split(".")[1]) for k in keys if k.startswith("out_norms.")})
    if norms:
        kwargs["output_norms"] = norms
    classifier = next((k for k in ("head.weight", "head.fc.weight") if k in keys), None)
    if classifier is None:
        kwargs["with_head"] = False
    else:
        kwargs["num_classes"] = state_dict[classifier].shape[0]
    return kwargs


def load_source(path: str, trust: bool) -> dict:
    """The checkpoint's state dict; ``trust`` unpickles the file fully (weights_only=False)."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False) if trust else read_checkpoint(path)
    except pickle.UnpicklingError as e:
        raise SystemExit(
            f"{path}: the file holds more than tensors ({e.__class__.__name__}); if you trust it, "
            "rerun with --trust-checkpoint to unpickle it fully"
        ) from e
    return model_state_dict(checkpoint)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="official .pth file")
    parser.add_argument("output", help="output .safetensors file")
    parser.add_argument("--model", default="ppma_tiny", choices=sorted(PRESETS), help="preset the weights belong to")
    parser.add_argument("--trust-checkpoint", action="store_true", help="allow full unpickling (weights_only=False)")
    args = parser.parse_args(argv)

    state_dict = load_source(args.checkpoint, args.trust_checkpoint)
    model = timm.create_model(args.model, **model_kwargs(state_dict))
    try:
        converted = checkpoint_filter_fn(state_dict, model)
        model.load_state_dict(converted, strict=True)
    except (ValueError, RuntimeError) as e:
        print(f"error: {args.checkpoint} does not fit {args.model}: {e}", file=sys.stderr)
        return 1
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, args.output, metadata={"model": args.model, "source": args.checkpoint})
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.output}: {len(tensors)} tensors, {params:,} parameters ({args.model})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
